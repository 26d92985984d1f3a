"""Peak memory of ``greedy_curriculum`` (the blocked curriculum greedy) by number of sequences.

Each size runs in its own process: the synthetic instance of ``bench_order.py`` (K=1,000 Zipf
clusters, L=2048, B=100 length bins, objective ``stationary``) and its 3-knot curriculum are built
first, then ``sequence_order("greedy_curriculum", ...)`` (blocked: ``greedy_exact_max`` 0) runs
under tracemalloc. Reported per size: the ordering's own peak above its inputs (``order_peak_mb``:
the objective's matrix, the queue's stratified shuffle, the rounds), the objective matrix held
(``matrix_held_mb``), the process's resident memory before the ordering (the instance) and its
peak RSS (instance building included), CPU seconds. ``bytes_per_sequence`` = order_peak / M, and
the 10M extrapolation (the rounds' memory does not grow with M; everything else is O(M)).

    python benchmarks/bench_curriculum_memory.py                   # M = 100k and 1M
    python benchmarks/bench_curriculum_memory.py --sizes 10000000  # the 10M case (a dedicated machine: ~10 GB RSS to build)

Writes ``benchmarks/results/curriculum_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_order as bo  # noqa: E402

TARGET_10M_MB = 2048  # issue 45: greedy_curriculum at 10M sequences within 2 GB


def case(m: int, seed: int) -> dict:
    """One size, in this process."""
    from pipeline.ordering import OrderParams, sequence_order
    from pipeline.ordering.curriculum import curriculum_from_dict

    t0 = time.perf_counter()
    f = bo.instance(m, seed)
    doc = bo.bench_curriculum(f, seed)
    build_s = time.perf_counter() - t0
    bo.warm_up()
    small = bo.instance(2_000, seed + 1)
    with tempfile.TemporaryDirectory() as tmp:
        knots = Path(tmp) / "curriculum.json"
        knots.write_text(json.dumps(bo.bench_curriculum(small, seed)))
        params = OrderParams(objective=bo.OBJECTIVE, length_bins=bo.B, curriculum=str(knots), greedy_exact_max=0, greedy_block=512)
        sequence_order("greedy_curriculum", small, params, seed)  # numba's compilation outside the measurement
        knots.write_text(json.dumps(doc))
        params = OrderParams(objective=bo.OBJECTIVE, length_bins=bo.B, curriculum=str(knots), greedy_exact_max=0)
        matrix_held = _matrix_held(f, params)
        rss_before = bo.rss_mb()
        hwm = _reset_peak_rss()
        tracemalloc.start()
        t0, c0 = time.perf_counter(), time.process_time()
        rows = sequence_order("greedy_curriculum", f, params, seed)
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        order_rss = _peak_rss_since_reset() if hwm else None
    cur = curriculum_from_dict(doc, f.clusters.n_cols)
    q = bo.curriculum_quality(f, rows, cur)
    return {"M": f.n_sequences, "order_peak_mb": peak, "bytes_per_sequence": peak * 2**20 / f.n_sequences,
            "matrix_held_mb": matrix_held, "rss_before_order_mb": rss_before, "peak_rss_mb": bo.peak_rss_mb(),
            "order_peak_rss_mb": order_rss, "order_rss_above_instance_mb": order_rss - rss_before if order_rss else None,
            "order_seconds": secs, "order_cpu_s": cpu, "build_s": build_s,
            "deviation_mean": q["dev"], "deviation_worst": q["dev_max"]}


def _reset_peak_rss() -> bool:
    """Reset the process's resident high-water mark (Linux: ``/proc/self/clear_refs`` 5), so that
    the peak read after the ordering is the ordering's, whatever the instance's building took;
    it counts what tracemalloc cannot see (numba's and polars' own allocators)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss_since_reset() -> float:
    """VmHWM of ``/proc/self/status`` in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _matrix_held(f, params) -> float:
    """MB the objective's matrix holds for ``f`` (its parts as the greedies keep them)."""
    tracemalloc.start()
    chars = params.objective_weights().matrix(f)
    held = tracemalloc.get_traced_memory()[0] / 2**20
    tracemalloc.stop()
    del chars
    return held


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000], help="numbers of sequences (one process each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "results" / "curriculum_memory.json"))
    ap.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(case(*args.child)))
        return
    results = []
    for m in args.sizes:
        proc = subprocess.run([sys.executable, __file__, "--child", str(m), str(args.seed)], capture_output=True, text=True)
        if proc.returncode:
            sys.exit(proc.stderr[-3000:])
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(r)
        print(f"M={r['M']:>11,}: ordering peak {r['order_peak_mb']:8.1f} MB ({r['bytes_per_sequence']:.0f} B/sequence), "
              f"matrix held {r['matrix_held_mb']:.1f} MB, resident during the ordering {r['order_peak_rss_mb'] or 0:.0f} MB "
              f"({r['order_rss_above_instance_mb'] or 0:.0f} above the instance), process peak RSS {r['peak_rss_mb']:.0f} MB, "
              f"{r['order_cpu_s']:.1f} CPU s, deviation mean/worst {r['deviation_mean']:.4f}/{r['deviation_worst']:.4f}", flush=True)
    largest = max(results, key=lambda r: r["M"])
    at_10m = largest["bytes_per_sequence"] * 10_000_000 / 2**20
    rev, dirty = bo._commit()
    doc = {"benchmark": "greedy_curriculum peak memory (blocked, objective stationary, K=1000, L=2048)", "commit": rev,
           "dirty_files": dirty, "machine": bo._machine(), "results": results,
           "extrapolated_10m_order_peak_mb": at_10m, "target_10m_mb": TARGET_10M_MB,
           "measured_10m": any(r["M"] >= 10_000_000 for r in results)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"10M ordering peak, extrapolated from M={largest['M']:,}: {at_10m:.0f} MB (target {TARGET_10M_MB} MB) -> {args.out}")


if __name__ == "__main__":
    main()
