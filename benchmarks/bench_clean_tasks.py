"""The clean gather's exact duplicates and SemDeDup in its own process (today's default) and as tasks
(``clean_tasks``: the hash space in ranges, the clusters in groups): wall time, the driver's peak
RSS, the largest task's, and whether the representatives and pairs are the same.

The gather reads only the stored hashes and the embedding shards, so the corpus here is those:
``--docs`` seeded random 64-bit hashes in ``--shards`` files, of which ``--copies`` are planted
exact copies (an earlier document's hash), and ``--docs`` unit embeddings of ``--dim`` values in
``--shards`` files indexed as the embedding matrix (``runs.parquet``), in ``--clusters`` k-means-like
clusters of unequal sizes (Dirichlet shares), a tenth of them planted near copies (cosine ~0.99) of
an earlier document of their cluster. SemDeDup runs over the exact representatives. Each case runs
in a fresh process of its own (``--case``), so each peak is its own (``VmHWM``; the memory-mapped
pages a process reads count in it); the driver's peak includes its imports (``rss_before_mb``:
after the imports, before the gather). A task's peak is measured by running each task again, alone,
in a process spawned as the engine spawns them (``task_rss_before_mb``: its RSS once the task's
module is imported).

    nice -n 15 python benchmarks/bench_clean_tasks.py --docs 200000   # writes benchmarks/results/clean_tasks.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_ablate import commit, machine  # noqa: E402
from bench_near_bands import _status_mb  # noqa: E402

THRESHOLD = 0.95  # dedup.semantic_threshold's default


def _cuts(n: int, shards: int) -> list[tuple[int, int]]:
    e = np.linspace(0, n, shards + 1).astype(int)
    return [(int(a), int(b)) for a, b in zip(e[:-1], e[1:])]


def generate(folder: Path, docs: int, copies: int, shards: int, clusters: int, dim: int, seed: int) -> None:
    """``hashes{j}.npy``, ``emb{j}.npy`` and their ``runs.parquet``, ``cluster.npy`` (each document's cluster)."""
    from pipeline.represent.embedding_index import write_embedding_runs

    rng = np.random.default_rng(seed)
    h = rng.integers(0, 2 ** 63, docs, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, docs, dtype=np.uint64)
    copy = np.sort(rng.choice(np.arange(docs // 10, docs), copies, replace=False))
    h[copy] = h[(rng.random(copies) * copy).astype(np.int64)]
    cluster = rng.choice(clusters, docs, p=rng.dirichlet(np.full(clusters, 0.5)))
    centers = rng.normal(size=(clusters, dim)).astype(np.float32)
    x = centers[cluster] + rng.normal(scale=1.2, size=(docs, dim)).astype(np.float32)
    by = np.argsort(cluster, kind="stable")
    sizes = np.bincount(cluster, minlength=clusters)
    starts = np.cumsum(sizes) - sizes
    t = rng.choice(docs, docs // 10, replace=False)
    src = by[starts[cluster[t]] + (rng.random(t.size) * sizes[cluster[t]]).astype(np.int64)]  # another document of its cluster
    x[t] = x[src] + rng.normal(scale=0.05, size=(t.size, dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    parts = []
    for j, (a, b) in enumerate(_cuts(docs, shards)):
        np.save(folder / f"hashes{j}.npy", h[a:b])
        np.save(folder / f"emb{j}.npy", x[a:b])
        parts.append((folder / f"emb{j}.npy", None))
    write_embedding_runs(parts, folder / "runs.parquet")
    np.save(folder / "cluster.npy", cluster.astype(np.int64))


def _scans(folder: Path) -> tuple[list, int]:
    from pipeline.clean.shards import ShardScan

    scans, start = [], 0
    for j in range(len(list(folder.glob("hashes*.npy")))):
        f = folder / f"hashes{j}.npy"
        n = np.load(f, mmap_mode="r").shape[0]
        scans.append(ShardScan(start, n, None, {"hashes": f}))
        start += n
    return scans, start


def _task_peak(kind: str, *args) -> tuple[float, float]:
    """One task (:func:`pipeline.clean.clean_tasks.hash_range_pairs` or ``cluster_group_pairs``) in
    this spawned process: (RSS once its module is imported, peak RSS after the task), MB."""
    from pipeline.clean import clean_tasks

    before = _status_mb("VmRSS")
    getattr(clean_tasks, kind)(*args)
    return before, _status_mb("VmHWM")


def task_peaks(folder: Path, scans: list, cluster: np.ndarray, survivors: np.ndarray, tasks: int) -> dict:
    """Each task run again, alone, in a process spawned as the engine spawns them: per kind the
    largest (baseline, peak) RSS, MB."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from pipeline.clean.clean_tasks import _hash_files, cluster_groups, hash_ranges

    work = folder / "peaks"
    work.mkdir(exist_ok=True)
    shards = [_hash_files(s, work / f"rows{j}.npy") for j, s in enumerate(scans)]
    jobs = [("hash_range_pairs", shards, a, b, str(work / f"exact{r}.npy")) for r, (a, b) in enumerate(hash_ranges(tasks))]
    labels = cluster[survivors]
    for g, members in enumerate(cluster_groups(np.bincount(labels), tasks)):
        mine = np.isin(labels, members)
        np.save(work / f"members{g}.npy", np.column_stack([survivors[mine], labels[mine]]))
        jobs.append(("cluster_group_pairs", str(work / f"members{g}.npy"), str(folder / "runs.parquet"), THRESHOLD,
                     str(work / f"sem{g}.npy")))
    out: dict[str, list] = {}
    for kind, *args in jobs:
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            out.setdefault(kind, []).append(pool.submit(_task_peak, kind, *args).result())
    return {k: (max(o[0] for o in v), max(o[1] for o in v)) for k, v in out.items()}


def case(folder: Path, tasks: int) -> dict:
    """One run of the gather's exact representatives then SemDeDup over the files of ``folder`` (``tasks`` 0: in this process)."""
    from pipeline.clean.clean_tasks import exact_by_hash_ranges, semantic_by_cluster_groups
    from pipeline.clean.semantic import semantic_pairs
    from pipeline.clean.stage import _exact_representatives
    from pipeline.represent.embedding_index import open_embeddings

    scans, n = _scans(folder)
    before = _status_mb("VmRSS")
    t0 = time.perf_counter()
    if tasks:
        exact_rep = exact_by_hash_ranges(scans, n, tasks, folder / "work")
    else:
        exact_rep = _exact_representatives(scans, n)
    t1 = time.perf_counter()
    cluster = np.load(folder / "cluster.npy")  # the gather reads clusters.parquet's column
    survivors = np.flatnonzero(exact_rep == np.arange(n))
    if tasks:
        pairs, largest = semantic_by_cluster_groups(folder / "runs.parquet", cluster, survivors, THRESHOLD, tasks, folder / "work")
    else:
        pairs, largest = semantic_pairs(open_embeddings(folder / "runs.parquet").take, cluster, survivors, THRESHOLD, forest=True)
    t2 = time.perf_counter()
    peak = _status_mb("VmHWM")
    np.save(folder / f"exact{tasks}.npy", exact_rep)
    np.save(folder / f"semantic{tasks}.npy", pairs)
    peaks = task_peaks(folder, scans, cluster, survivors, tasks) if tasks else {}
    exact_task, sem_task = peaks.get("hash_range_pairs"), peaks.get("cluster_group_pairs")
    return {"tasks": tasks, "exact_wall_s": round(t1 - t0, 2), "semantic_wall_s": round(t2 - t1, 2),
            "exact_duplicates": int((exact_rep != np.arange(n)).sum()), "semantic_pairs": int(pairs.shape[0]), "largest_cluster": largest,
            "rss_before_mb": round(before, 1), "driver_peak_rss_mb": round(peak, 1),
            "exact_task_rss_before_mb": exact_task and round(exact_task[0], 1),
            "largest_exact_task_peak_rss_mb": exact_task and round(exact_task[1], 1),
            "semantic_task_rss_before_mb": sem_task and round(sem_task[0], 1),
            "largest_semantic_task_peak_rss_mb": sem_task and round(sem_task[1], 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--copies", type=int, default=20_000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--clusters", type=int, default=2000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--tasks", type=int, nargs="+", default=[0, 2, 8])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "clean_tasks.json"))
    ap.add_argument("--case", type=int, help=argparse.SUPPRESS)  # internal: run one case in this process
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case is not None:
        print(json.dumps(case(Path(args.dir), args.case)))
        return
    t0 = time.perf_counter()
    mach = machine()
    with tempfile.TemporaryDirectory(prefix="clean-tasks-") as tmp:
        folder = Path(tmp)
        generate(folder, args.docs, args.copies, args.shards, args.clusters, args.dim, 0)
        rows = []
        for tasks in args.tasks:
            proc = subprocess.run([sys.executable, __file__, "--case", str(tasks), "--dir", tmp], capture_output=True, text=True)
            if proc.returncode:
                sys.exit(proc.stderr[-3000:])
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            first = args.tasks[0]
            same = [np.load(folder / f"{k}{tasks}.npy").tobytes() == np.load(folder / f"{k}{first}.npy").tobytes()
                    for k in ("exact", "semantic")]
            rows[-1]["same_as_in_the_gather"] = all(same)
            print(json.dumps(rows[-1]), flush=True)
    doc = {"benchmark": "bench_clean_tasks.py", "machine": mach, "commit": commit(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "docs": args.docs, "copies": args.copies,
           "shards": args.shards, "clusters": args.clusters, "dim": args.dim, "cases": rows, "wall_s": round(time.perf_counter() - t0, 1)}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
