"""Near duplicates of the same documents through Strata's clean path, through datatrove's MinHash
pipeline, and through datasketch alone: groups found, documents removed, how far the tools agree,
wall and CPU seconds, every process's peak RSS, documents a second.

The documents are ``bench_scale.generate``'s (``bench_clean_shards``' generator: passages cut from the
demo corpus, so many overlap), ``--docs`` of them in Parquet shards of ``--shard-docs``, doc id = row
in shard order. Each tool's stages run in processes of their own, one after another, started from
this one; a thread here reads the ``VmHWM`` of every descendant process from ``/proc`` while they
run (each process's own peak, the pages of files it memory-mapped included), and the CPU seconds are
the children's (``RUSAGE_CHILDREN``, their pool workers included).

- **Strata** (``strata``): ``signatures``: each shard's MinHash signatures as ``clean_shards`` computes
  them (:func:`pipeline.clean.near.signature_rows`: lowercased ``\\w+`` words, word 5-grams hashed,
  datasketch's MinHash, 72 permutations, seed ``seed + 1``), written as ``.npy``; ``groups``: the
  gather's band-group path (:func:`pipeline.clean.near_bands.band_near_pairs`, ``--band-tasks`` tasks on
  ``engine: local``: 12 bands of 6 rows, each candidate kept when the signatures agree on >= 0.8 of
  their values), then the pairs' connected components (:func:`pipeline.clean.union_find.pair_components`);
  a group keeps its lowest doc id. Every document is compared (no exact pass first: an exact copy's
  signature is its original's, so it is a near pair at 1.0).
- **datatrove** (``datatrove``): ``MinhashDedupSignature`` -> ``MinhashDedupBuckets`` ->
  ``MinhashDedupCluster`` (``save_cluster_id``) -> ``MinhashDedupFilter``, each a
  ``LocalPipelineExecutor`` with ``workers=1`` (signatures, cluster and filter ``tasks=1``; buckets one
  task a bucket, as it requires), reading the shards with ``ParquetReader``; ``MinhashConfig`` set as
  close to Strata's as it goes: 12 buckets x 6 hashes, word 5-grams, seed 1; the rest its defaults
  (``simplify_text``: lowercase, numbers to 0, punctuation to spaces, diacritics; spaCy's blank English
  tokenizer; xxhash 64-bit shingles and 64-bit MinHash values). Differences that change groups:
  datatrove joins every pair that shares a bucket, with no similarity check (Strata keeps a candidate
  only at a signature agreement >= 0.8), and skips a text of fewer than 5 words (Strata shingles it as
  one n-gram); the filter writes nothing (no writer after it), and a group keeps datatrove's union-find
  root (union by size), not its lowest id.
- **datasketch alone** (``datasketch``): the library Strata's gather used before its own banding: per
  document, ``MinHash(num_perm=72)`` over its lowercased ``\\w+`` word 5-grams (UTF-8, datasketch's
  SHA-1 hash), then ``MinHashLSH(threshold=0.8, num_perm=72, params=(12, 6))`` query, then insert; the
  groups: components of (document, each key its query returned).
- Two more rows from the same runs, so the tools can be compared like for like: ``strata_unverified``
  (Strata's band tasks over the same signatures keeping every candidate, threshold 0: what datatrove
  and ``MinHashLSH.query`` join) and ``datasketch_verified`` (datasketch's candidates kept where its
  signatures agree on >= 0.8 of their values, Strata's check).

Agreement: groups with the same members; pairs of documents put in one group by both (from the
groups' overlap counts, never listing pairs); Jaccard of the documents in any group and of the
documents removed (the latter also differs where the tools keep different members of one group).

datatrove 0.10.1 hashes ``str`` with ``xxhash.xxh64_intdigest``, which xxhash >= 4 refuses (its
``processing`` extra pins ``xxhash<4``); ``--pythonpath`` puts a folder with xxhash 3 first on the
datatrove stages' path (``pip install --target DIR 'xxhash<4'``) without touching the environment.
Run on one core (``taskset``: Strata's task pool then has one worker too):

    pip install datatrove==0.10.1 spacy && pip install --target /tmp/xx3 'xxhash<4'
    nice -n 10 taskset -c 0 python benchmarks/bench_datatrove.py --docs 200000 --pythonpath /tmp/xx3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_ablate import commit, machine  # noqa: E402

NUM_PERM, ROWS, NGRAM, THRESHOLD = 72, 6, 5, 0.8  # Strata's dedup defaults (pipeline/config.py)
STAGES = {"strata": ["strata_signatures", "strata_groups"], "strata_unverified": ["strata_signatures", "strata_groups_unverified"],
          "datatrove": ["datatrove_signatures", "datatrove_buckets", "datatrove_cluster", "datatrove_filter"],
          "datasketch": ["datasketch"]}


def _shards(work: Path) -> list[Path]:
    return sorted((work / "docs").glob("part-*.parquet"))


def _texts(path: Path) -> list[str]:
    import polars as pl

    return pl.read_parquet(path, columns=["text"])["text"].to_list()


# ---- the stages, each run in a process of its own (``--stage``) ----

def strata_signatures(work: Path, args) -> dict:
    from pipeline.clean.near import signature_rows
    from pipeline.config import StrataConfig

    seed = int(StrataConfig.model_validate({}).seed) + 1  # clean_shards' seed (pipeline/clean/shards.py)
    out = work / "strata"
    out.mkdir(exist_ok=True)
    for j, path in enumerate(_shards(work)):
        np.save(out / f"sig{j:05d}.npy", signature_rows(_texts(path), NUM_PERM, NGRAM, seed))
    return {}


def strata_groups(work: Path, args, threshold: float = THRESHOLD, name: str = "members") -> dict:
    from pipeline.clean.near_bands import band_near_pairs
    from pipeline.clean.shards import ShardScan
    from pipeline.clean.union_find import pair_components

    scans, start = [], 0
    for f in sorted((work / "strata").glob("sig*.npy")):
        n = np.load(f, mmap_mode="r").shape[0]
        scans.append(ShardScan(start, n, None, {"sig": f}))
        start += n
    pairs, candidates = band_near_pairs(scans, np.arange(start, dtype=np.int64), NUM_PERM, ROWS, threshold, args.band_tasks,
                                        work / "strata" / "work")
    ids, rep = pair_components(pairs)
    np.save(work / "strata" / f"{name}.npy", np.column_stack([ids, rep]))
    return {"pairs": int(pairs.shape[0]), "candidates": int(candidates)}


def strata_groups_unverified(work: Path, args) -> dict:
    """:func:`strata_groups` keeping every candidate (threshold 0): every pair that shares a bucket,
    as datatrove and datasketch's LSH query give them."""
    return strata_groups(work, args, 0.0, "members_unverified")


def _dt_config():
    from datatrove.pipeline.dedup.minhash import MinhashConfig

    return MinhashConfig(n_grams=NGRAM, num_buckets=NUM_PERM // ROWS, hashes_per_bucket=ROWS, seed=1)


def _dt_run(pipeline: list, work: Path, name: str, tasks: int = 1) -> None:
    from datatrove.executor import LocalPipelineExecutor

    LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=1, logging_dir=str(work / "dt" / "logs" / name)).run()


def _dt_reader(work: Path):
    from datatrove.pipeline.readers import ParquetReader

    return ParquetReader(str(work / "docs"), glob_pattern="part-*.parquet", text_key="text", id_key="id")


def datatrove_signatures(work: Path, args) -> dict:
    from datatrove.pipeline.dedup.minhash import MinhashDedupSignature

    _dt_run([_dt_reader(work), MinhashDedupSignature(str(work / "dt" / "signatures"), config=_dt_config(), language="en")],
            work, "signatures")
    return {}


def datatrove_buckets(work: Path, args) -> dict:
    from datatrove.pipeline.dedup.minhash import MinhashDedupBuckets

    cfg = _dt_config()
    _dt_run([MinhashDedupBuckets(str(work / "dt" / "signatures"), str(work / "dt" / "buckets"), config=cfg)], work, "buckets",
            tasks=cfg.num_buckets)
    return {}


def datatrove_cluster(work: Path, args) -> dict:
    from datatrove.pipeline.dedup.minhash import MinhashDedupCluster

    _dt_run([MinhashDedupCluster(str(work / "dt" / "buckets"), str(work / "dt" / "remove"), config=_dt_config(),
                                 save_cluster_id=True)], work, "cluster")
    return {}


def datatrove_filter(work: Path, args) -> dict:
    from datatrove.pipeline.dedup.minhash import MinhashDedupFilter

    _dt_run([_dt_reader(work), MinhashDedupFilter(str(work / "dt" / "remove"))], work, "filter")
    return {}


def datasketch(work: Path, args) -> dict:
    from datasketch import MinHash, MinHashLSH

    from pipeline.clean.union_find import pair_components

    texts = [t for path in _shards(work) for t in _texts(path)]
    word = re.compile(r"\w+")
    t0, cpu0 = time.perf_counter(), time.process_time()
    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM, params=(NUM_PERM // ROWS, ROWS))
    pairs, sigs = [], np.empty((len(texts), NUM_PERM), np.uint64)
    for i, text in enumerate(texts):
        words = word.findall(text.lower())
        shingles = [" ".join(words[k:k + NGRAM]).encode() for k in range(max(len(words) - NGRAM + 1, 1))] if words else []
        mh = MinHash(num_perm=NUM_PERM)
        mh.update_batch(shingles)
        pairs += [(j, i) for j in lsh.query(mh)]
        lsh.insert(i, mh)
        sigs[i] = mh.hashvalues
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    pairs = np.array(pairs, np.int64).reshape(-1, 2)
    ids, rep = pair_components(pairs)
    np.save(work / "datasketch_members.npy", np.column_stack([ids, rep]))
    kept = pairs[(sigs[pairs[:, 0]] == sigs[pairs[:, 1]]).mean(axis=1) >= THRESHOLD]  # the candidates Strata's check keeps
    ids, rep = pair_components(kept)
    np.save(work / "datasketch_verified_members.npy", np.column_stack([ids, rep]))
    return {"pairs": int(pairs.shape[0]), "verified_pairs": int(kept.shape[0]), "minhash_lsh_wall_s": round(wall, 2),
            "minhash_lsh_cpu_s": round(cpu, 2)}


# ---- the orchestration ----

def _tree_peaks(root: int, peaks: dict, stop: threading.Event) -> None:
    """Until ``stop``: the largest ``VmHWM`` (MB) of ``root`` and each of its descendants, by pid,
    with the process's command (its first words)."""
    while not stop.is_set():
        parent = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    pass
        for pid in parent:
            p, depth = pid, 0
            while p not in (root, 0, 1) and p in parent and depth < 32:
                p, depth = parent[p], depth + 1
            if p != root:
                continue
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                hwm = next(int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmHWM:"))
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
            except (OSError, StopIteration):
                continue
            old = peaks.get(pid, (0.0, cmd))
            peaks[pid] = (max(old[0], hwm), old[1] or cmd)
        stop.wait(0.05)


def run_stage(stage: str, work: Path, args) -> dict:
    """``stage`` in a fresh process: wall and CPU seconds (the process and its children), the peak RSS
    of every process it started, what the stage returned."""
    env = dict(os.environ)
    if stage.startswith("datatrove") and args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([args.pythonpath, env.get("PYTHONPATH", "")])
    cmd = [sys.executable, __file__, "--stage", stage, "--work", str(work), "--band-tasks", str(args.band_tasks)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks: dict = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_tree_peaks, args=(proc.pid, peaks, stop), daemon=True)
    watcher.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    stop.set()
    watcher.join()
    if proc.returncode:
        sys.exit(f"{stage} failed:\n{err[-4000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    procs = sorted(((round(mb, 1), "stage" if pid == proc.pid else "worker") for pid, (mb, _) in peaks.items()), reverse=True)
    result = json.loads(out.strip().splitlines()[-1])
    return {"stage": stage, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "processes": len(procs),
            "stage_peak_rss_mb": next((mb for mb, kind in procs if kind == "stage"), None),
            "largest_worker_peak_rss_mb": next((mb for mb, kind in procs if kind == "worker"), None), **result}


def _datatrove_groups(work: Path) -> np.ndarray:
    """(k, 2) doc id, group id of the documents datatrove put in a group (its ``.clusters`` file), and
    the documents it removes (its ``.remove`` file)."""
    clusters = np.fromfile(work / "dt" / "remove" / "000000.clusters", dtype="<u4").reshape(-1, 2).astype(np.int64)
    remove = np.fromfile(work / "dt" / "remove" / "000000.remove", dtype="<u4").astype(np.int64)
    return clusters, remove


def _as_groups(members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(doc ids, group label) of documents in a group of two or more, doc ids ascending."""
    members = members.reshape(-1, 2)
    order = np.argsort(members[:, 0], kind="stable")
    return members[order, 0], members[order, 1]


def _co_pairs(labels: np.ndarray) -> int:
    """Pairs of documents that share a label: the sum over labels of C(size, 2)."""
    _, sizes = np.unique(labels, return_counts=True)
    return int((sizes * (sizes - 1) // 2).sum())


def agreement(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> dict:
    """How two tools' groups agree (each: doc ids ascending, group labels)."""
    (ida, la), (idb, lb) = a, b
    both, ia, ib = np.intersect1d(ida, idb, return_indices=True)
    joint = la[ia] * (int(lb.max(initial=0)) + 1) + lb[ib]  # a pair shares a group in both iff it shares the joint label
    pa, pb, pab = _co_pairs(la), _co_pairs(lb), _co_pairs(joint)

    def keyset(ids, labels):
        order = np.lexsort((ids, labels))
        cut = np.flatnonzero(np.r_[True, labels[order][1:] != labels[order][:-1], True])
        return {tuple(ids[order][s:e].tolist()) for s, e in zip(cut[:-1], cut[1:])}

    same = len(keyset(ida, la) & keyset(idb, lb))
    union = np.union1d(ida, idb).size
    return {"documents_in_groups_jaccard": round(both.size / union, 4) if union else 1.0, "groups_identical": same,
            "co_grouped_pairs_a": pa, "co_grouped_pairs_b": pb, "co_grouped_pairs_both": pab,
            "co_grouped_pairs_jaccard": round(pab / (pa + pb - pab), 4) if pa + pb - pab else 1.0}


def _removed_jaccard(x: np.ndarray, y: np.ndarray) -> float:
    u = np.union1d(x, y).size
    return round(np.intersect1d(x, y).size / u, 4) if u else 1.0


def summarize(work: Path, stages: dict, docs: int) -> dict:
    """Per tool: its stages, totals, groups and removed documents; and the tools' agreement."""
    tools, groups, removed = {}, {}, {}
    for tool, names in STAGES.items():
        rows = [stages[s] for s in names]
        wall = sum(r["wall_s"] for r in rows)
        peak = max(max(r["stage_peak_rss_mb"] or 0, r["largest_worker_peak_rss_mb"] or 0) for r in rows)
        tools[tool] = {"stages": rows, "wall_s": round(wall, 2), "cpu_s": round(sum(r["cpu_s"] for r in rows), 2),
                       "docs_per_s": round(docs / wall), "peak_rss_mb": peak}
    files = {"strata": work / "strata" / "members.npy", "strata_unverified": work / "strata" / "members_unverified.npy",
             "datasketch": work / "datasketch_members.npy", "datasketch_verified": work / "datasketch_verified_members.npy"}
    tools["datasketch_verified"] = {k: v for k, v in tools["datasketch"].items()}  # the same run, its candidates checked
    for tool, path in files.items():
        ids, rep = _as_groups(np.load(path))
        groups[tool], removed[tool] = (ids, rep), ids[ids != rep]
    clusters, removed["datatrove"] = _datatrove_groups(work)
    groups["datatrove"] = _as_groups(clusters)
    for tool, (ids, labels) in groups.items():
        sizes = np.unique(labels, return_counts=True)[1]
        tools[tool].update({"groups": int(sizes.size), "documents_in_groups": int(ids.size),
                            "documents_removed": int(removed[tool].size), "largest_group": int(sizes.max(initial=0))})
    compare = {}
    for a, b in (("strata", "datatrove"), ("strata_unverified", "datatrove"), ("strata", "datasketch_verified"),
                 ("strata_unverified", "datasketch"), ("datasketch", "datatrove")):
        compare[f"{a}_vs_{b}"] = {**agreement(groups[a], groups[b]), "removed_jaccard": _removed_jaccard(removed[a], removed[b])}
    return {"tools": tools, "agreement": compare}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--shard-docs", type=int, default=25_000)
    ap.add_argument("--band-tasks", type=int, default=12, help="Strata's near_band_tasks")
    ap.add_argument("--pythonpath", help="a folder put first on the datatrove stages' path (xxhash<4)")
    ap.add_argument("--work", default="/tmp/bench_datatrove")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "datatrove_compare.json"))
    ap.add_argument("--stage", help=argparse.SUPPRESS)  # internal: run one stage in this process
    args = ap.parse_args()
    work = Path(args.work)
    if args.stage:
        print(json.dumps(globals()[args.stage](work, args)))
        return
    from bench_scale import generate

    mach = machine()
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.perf_counter()
    corpus = generate(args.docs, work / "docs", args.shard_docs)
    gen_s = time.perf_counter() - t0
    stages = {}
    for name in dict.fromkeys(s for names in STAGES.values() for s in names):
        stages[name] = run_stage(name, work, args)
        print(json.dumps(stages[name]), flush=True)
    import datasketch as ds
    import datatrove

    doc = {"benchmark": "bench_datatrove.py", "machine": mach, "commit": commit(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "docs": args.docs, "shards": corpus["shards"], "chars": corpus["chars"], "generate_s": round(gen_s, 1),
           "cpus_allowed": len(os.sched_getaffinity(0)), "band_tasks": args.band_tasks,
           "versions": {"datatrove": datatrove.__version__ if hasattr(datatrove, "__version__") else _version("datatrove"),
                        "datasketch": ds.__version__ if hasattr(ds, "__version__") else _version("datasketch")},
           "settings": {"num_perm": NUM_PERM, "bands": NUM_PERM // ROWS, "rows": ROWS, "ngram": NGRAM, "threshold": THRESHOLD},
           **summarize(work, stages, args.docs)}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: doc[k] for k in ("tools", "agreement")}, indent=1))


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main()
