"""Partitioned ordering against the one-process greedy, side by side (issue 55).

Instance: bench_order.py's synthetic documents (Zipf(1) sizes over K = 1,000 clusters, log-normal
lengths), packed at random into L = 2,048-token sequences, the first M kept; B = 100 length bins,
the default objective (stationary), batch 32. Each mode runs `run_strategy("greedy", ...)` in a
fresh child process on the same documents and segments (read from Parquet), so each peak RSS is
its own: `single` (order_part_bytes: 0, one process) and `partitioned` (order_part_bytes set so
the corpus makes P parts, each ordered in a worker process of its own, `engine: local`). Printed
and written per mode: wall and CPU seconds (the driver's and its workers'), the driver's peak RSS
and the largest worker's, and the quality of the order: the fraction of 240 log-spaced prefixes
t < M whose prefix error ||T(t) - tau S(t)|| / S(t) is below each of 5 shuffles' (all; past the
first tenth), the worst window of every length batch * 2^i over the best of 5 shuffles' worst
(the largest ratio over the lengths), and the mean per-batch deviation (clusters, length bins),
with the partitioned order's over the single-process one's.

    python benchmarks/bench_partitioned_order.py                 # M = 1M, P = 4 (minutes on 2 cores)
    python benchmarks/bench_partitioned_order.py --sequences 100000 --parts 4 --out partitioned_order_100k
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import polars as pl  # noqa: E402
from bench_order import BATCH, _commit, _machine, entries, shuffle_positions, synthetic_docs  # noqa: E402

from pipeline.ordering.engine import OrderParams, run_strategy  # noqa: E402
from pipeline.ordering.features import packed_sequence_features  # noqa: E402
from pipeline.ordering.parts import PART_BYTES_PER_SEQUENCE  # noqa: E402
from pipeline.packing.pack import pack_concat  # noqa: E402
from pipeline.reports.diagnostics import batch_deviations, log_spaced_points, prefix_errors  # noqa: E402
from pipeline.reports.windows import worst_windows  # noqa: E402

L, K, B, SHUFFLES, POINTS = 2048, 1000, 100, 5, 240


def write_instance(m: int, seed: int, root: Path) -> None:
    """The documents (doc_id, cluster, n_tokens) and the first m sequences' segments, as Parquet."""
    n_docs = int(m * L / 500 * 1.08)
    cluster, length = synthetic_docs(n_docs, seed, K)
    seg = pack_concat(np.random.default_rng(seed + 1).permutation(n_docs), length, L).segments
    seg.filter(pl.col("sequence_id") < m).write_parquet(root / "segments.parquet")
    pl.DataFrame({"doc_id": np.arange(n_docs), "cluster": cluster, "n_tokens": length}).write_parquet(root / "documents.parquet")


def _worker_peaks(stop: threading.Event, peaks: dict[int, float]) -> None:
    """Each child process's VmHWM (its own peak RSS; ru_maxrss of a spawned child would include the
    driver's RSS at the fork), polled until ``stop``."""
    me = os.getpid()
    while not stop.wait(0.2):
        for d in Path("/proc").iterdir():
            try:
                status = (d / "status").read_text() if d.name.isdigit() else ""
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if fields.get("PPid", "").strip() == str(me) and "VmHWM" in fields:
                peaks[int(d.name)] = max(peaks.get(int(d.name), 0.0), int(fields["VmHWM"].split()[0]) / 1024.0)


def child(mode: str, root: Path, parts: int, seed: int) -> dict:
    """One mode's ordering in this (fresh) process: its order to root/<mode>.npy, its figures back."""
    docs, seg = pl.read_parquet(root / "documents.parquet"), pl.read_parquet(root / "segments.parquet")
    m = seg["sequence_id"].n_unique()
    bound = 0 if mode == "single" else -(-m * PART_BYTES_PER_SEQUENCE // parts)
    params = OrderParams(length_bins=B, batch_size=BATCH, order_part_bytes=bound)
    stop, peaks = threading.Event(), {}
    poller = threading.Thread(target=_worker_peaks, args=(stop, peaks))
    poller.start()
    t0, c0 = time.perf_counter(), time.process_time()
    result = run_strategy("greedy", lambda: docs, lambda: seg, L, params, seed, work_dir=root / "work")
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    stop.set()
    poller.join()
    np.save(root / f"{mode}.npy", result.order["sequence_id"].to_numpy())
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"mode": mode, "parts": parts if mode != "single" else 1, "order_part_bytes": bound, "M": m, "seconds": secs,
            "driver_cpu_s": cpu, "workers_cpu_s": kids.ru_utime + kids.ru_stime, "greedy_mode": result.greedy_mode,
            "driver_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "largest_worker_peak_rss_mb": max(peaks.values(), default=0.0), "workers": len(peaks)}


def quality(f, ids: np.ndarray, seed: int) -> dict:
    """Prefix check, worst windows against the best shuffle's, mean batch deviations."""
    m = f.n_sequences
    rows = np.searchsorted(f.sequence_ids, ids)
    position = np.empty(m, dtype=np.int64)
    position[rows] = np.arange(m)
    t = log_spaced_points(m, POINTS)
    t = t[t < m]
    shuffles = shuffle_positions(m, SHUFFLES, seed)
    out = {"prefixes": int(t.size)}
    for kind, x in (("cluster", f.clusters), ("bin", f.bins)):
        comp = entries(x)
        below = np.all(prefix_errors(comp, position, t)[None] < np.stack([prefix_errors(comp, p, t) for p in shuffles]), axis=0)
        worst = worst_windows(comp, position, BATCH)
        best = np.min(np.stack([worst_windows(comp, p, BATCH).worst for p in shuffles]), axis=0)
        out |= {f"{kind}_below_all": float(below.mean()), f"{kind}_below_last90": float(below[t > m / 10].mean()),
                f"{kind}_window_lengths": worst.lengths.tolist(), f"{kind}_window_ratio": (worst.worst / best).tolist(),
                f"{kind}_window_ratio_max": float((worst.worst / best).max()),
                f"{kind}_batch_dev": float(batch_deviations(comp, position, BATCH).mean())}
    return out


def run_child(mode: str, root: Path, parts: int, seed: int) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--root", str(root), "--parts", str(parts), "--seed", str(seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-4000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sequences", type=int, default=1_000_000)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--seed", type=int, default=55)
    ap.add_argument("--out", default="")
    ap.add_argument("--child", default="")
    ap.add_argument("--root", default="")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, Path(a.root), a.parts, a.seed)))
        return
    size = f"{a.sequences // 1_000_000}m" if a.sequences >= 1_000_000 else f"{a.sequences // 1000}k"
    name = a.out or f"partitioned_order_{size}"
    commit, dirty = _commit()
    doc = {"benchmark": "bench_partitioned_order.py", "commit": commit, "modified_files": dirty, "machine": _machine(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "objective": OrderParams().objective, "K": K, "L": L, "length_bins": B,
           "batch": BATCH, "shuffles": SHUFFLES, "points": POINTS, "cases": []}
    with tempfile.TemporaryDirectory(prefix="bench-parts-") as tmp:
        root = Path(tmp)
        write_instance(a.sequences, a.seed, root)
        for mode in ("single", "partitioned"):
            r = run_child(mode, root, a.parts, a.seed)
            print(json.dumps(r), flush=True)
            doc["cases"].append(r)
        docs, seg = pl.read_parquet(root / "documents.parquet"), pl.read_parquet(root / "segments.parquet")
        f = packed_sequence_features(seg["sequence_id"].to_numpy(), seg["doc_id"].to_numpy(), seg["n_tokens"].to_numpy(),
                                     docs["cluster"].to_numpy(), docs["n_tokens"].to_numpy(), B)
        for case in doc["cases"]:
            case |= quality(f, np.load(root / f"{case['mode']}.npy"), a.seed)
    single, parted = doc["cases"]
    for kind in ("cluster", "bin"):
        parted[f"{kind}_batch_dev_vs_single"] = parted[f"{kind}_batch_dev"] / single[f"{kind}_batch_dev"]
    for case in doc["cases"]:
        print({k: v for k, v in case.items() if not isinstance(v, list)}, flush=True)
    out = Path(__file__).resolve().parent / "results" / f"{name}.json"
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
