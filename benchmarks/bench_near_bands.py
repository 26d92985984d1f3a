"""The clean gather's near pairs from one index (today's default) and from band groups run as tasks
(``near_band_tasks``): wall time, the driver's peak RSS, the largest task's, and whether the pairs
are the same.

The gather reads only the stored MinHash signatures, so the corpus here is signatures: ``--docs``
rows of seeded random values (distinct documents: their values agree by chance only) in ``--shards``
files, of which ``--copies`` are planted near copies of an earlier row with a share of their values,
drawn evenly from 0 to 0.35, replaced (so the copies' signature agreement spreads across the 0.8
threshold). Each case runs in a fresh process of its own (``--case``), so each peak is its own
(``VmHWM``; the signature files' pages a process reads count in it); the driver's peak includes its
imports (``rss_before_mb``: after the imports, before the gather). A task's peak is measured by
running each band group's task again, alone, in a process spawned as the engine spawns them
(``task_rss_before_mb``: its RSS once the task's module is imported). Beside each ``VmHWM``, the
largest ``RssAnon`` a thread sampled (``*_peak_anon_mb``): the process's own memory, without the
pages of files it memory-mapped. More tasks than the 12 bands: each band a task per key part.

    nice -n 15 python benchmarks/bench_near_bands.py --docs 200000   # writes benchmarks/results/near_bands.json
    nice -n 10 taskset -c 1 python benchmarks/bench_near_bands.py --docs 1000000 --copies 100000 --tasks 0 4 12 48 \
        --out benchmarks/results/near_bands_1m.json
    nice -n 10 taskset -c 1 python benchmarks/bench_near_bands.py --docs 3000000 --copies 300000 --tasks 0 12 36 \
        --out benchmarks/results/near_bands_3m.json
"""

from __future__ import annotations

import argparse
import json
import os
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


def _status_mb(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (the peak) of this process, in MB: per address space, so a
    spawned process's figures are its own (``ru_maxrss`` keeps the parent's peak across the exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def generate(folder: Path, docs: int, copies: int, shards: int, num_perm: int, seed: int) -> None:
    """The signature files ``sig{j}.npy`` and the planted (original, copy) rows ``planted.npy``."""
    rng = np.random.default_rng(seed)
    sig = rng.integers(0, 2 ** 32 - 1, (docs, num_perm), dtype=np.uint32)
    copy = np.sort(rng.choice(np.arange(docs // 10, docs), copies, replace=False))
    orig = (rng.random(copies) * copy).astype(np.int64)  # an earlier row
    share = np.linspace(0.0, 0.35, copies)
    for c, o, s in zip(copy.tolist(), orig.tolist(), rng.permutation(share).tolist()):
        sig[c] = sig[o]
        at = rng.choice(num_perm, round(num_perm * s), replace=False)
        sig[c, at] = rng.integers(0, 2 ** 32 - 1, at.size, dtype=np.uint32)
    for j, (a, b) in enumerate(zip(*(lambda e: (e[:-1], e[1:]))(np.linspace(0, docs, shards + 1).astype(int)))):
        np.save(folder / f"sig{j}.npy", sig[a:b])
    np.save(folder / "planted.npy", np.column_stack([orig, copy]))


class _AnonPeak:
    """The largest ``RssAnon`` (the process's own memory, without the memory-mapped files' pages,
    which ``VmHWM`` counts too) seen by a thread sampling ``/proc/self/status`` while in the block."""

    def __enter__(self):
        import threading

        self.peak, self._stop = _status_mb("RssAnon"), threading.Event()

        def sample() -> None:
            while not self._stop.wait(0.005):
                self.peak = max(self.peak, _status_mb("RssAnon"))

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _status_mb("RssAnon"))


def _task_peak(*args) -> tuple[float, float, float]:
    """One band group's task (:func:`pipeline.clean.near_bands.band_group_pairs`) in this spawned
    process: (RSS once its module is imported, peak RSS after the task, sampled peak of its
    anonymous memory), MB."""
    from pipeline.clean.near_bands import band_group_pairs

    before = _status_mb("VmRSS")
    with _AnonPeak() as anon:
        band_group_pairs(*args)
    return before, _status_mb("VmHWM"), anon.peak


def task_peaks(scans: list, exact_rep: np.ndarray, d, tasks: int, folder: Path) -> tuple[float, float, float]:
    """Each band group's task run again, alone, in a process spawned as the engine spawns them: the
    largest (baseline, peak, anonymous peak) RSS, MB."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from pipeline.clean.near_bands import _members_file, band_jobs

    folder.mkdir(exist_ok=True)
    shards = [_members_file(s, exact_rep, folder / f"members{j}.npy") for j, s in enumerate(scans)]
    out = []
    for g, (a, b, k, parts) in enumerate(band_jobs(d.near_num_perm // d.near_rows, tasks)):
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            out.append(pool.submit(_task_peak, shards, a, b, d.near_rows, d.near_threshold, str(folder / f"pairs{g}.npy"), k,
                                   parts).result())
    return max(o[0] for o in out), max(o[1] for o in out), max(o[2] for o in out)


def case(folder: Path, tasks: int, out: Path) -> dict:
    """One run of the gather's near pairs over the files of ``folder`` (``tasks`` 0: one index)."""
    from pipeline.clean.near_bands import band_near_pairs
    from pipeline.clean.shards import ShardScan
    from pipeline.clean.stage import _near_pairs
    from pipeline.config import StrataConfig

    cfg = StrataConfig.model_validate({})
    d = cfg.dedup
    scans, start = [], 0
    for j in range(len(list(folder.glob("sig*.npy")))):
        f = folder / f"sig{j}.npy"
        n = np.load(f, mmap_mode="r").shape[0]
        scans.append(ShardScan(start, n, None, {"sig": f}))
        start += n
    exact_rep = np.arange(start, dtype=np.int64)
    before = _status_mb("VmRSS")
    t, cpu = time.perf_counter(), time.process_time()
    with _AnonPeak() as anon:
        if tasks:
            pairs, candidates = band_near_pairs(scans, exact_rep, d.near_num_perm, d.near_rows, d.near_threshold, tasks, folder / "work")
        else:
            pairs, candidates = _near_pairs(cfg, scans, exact_rep)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    np.save(out, pairs)
    peak = _status_mb("VmHWM")
    task_before, task_peak, task_anon = task_peaks(scans, exact_rep, d, tasks, folder / "peaks") if tasks else (None, None, None)
    return {"tasks": tasks, "wall_s": round(wall, 2), "driver_cpu_s": round(cpu, 2), "pairs": int(pairs.shape[0]),
            "candidates": int(candidates), "rss_before_mb": round(before, 1), "driver_peak_rss_mb": round(peak, 1),
            "driver_peak_anon_mb": round(anon.peak, 1), "task_rss_before_mb": task_before and round(task_before, 1),
            "largest_task_peak_rss_mb": task_peak and round(task_peak, 1), "largest_task_peak_anon_mb": task_anon and round(task_anon, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--copies", type=int, default=20_000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--tasks", type=int, nargs="+", default=[0, 1, 4, 12])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "near_bands.json"))
    ap.add_argument("--case", type=int, help=argparse.SUPPRESS)  # internal: run one case in this process
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case is not None:
        print(json.dumps(case(Path(args.dir), args.case, Path(args.dir) / f"pairs{args.case}.npy")))
        return
    t0 = time.perf_counter()
    mach = machine()
    with tempfile.TemporaryDirectory(prefix="near-bands-") as tmp:
        folder = Path(tmp)
        generate(folder, args.docs, args.copies, args.shards, 72, 0)
        rows = []
        for tasks in args.tasks:
            proc = subprocess.run([sys.executable, __file__, "--case", str(tasks), "--dir", tmp],
                                  capture_output=True, text=True, check=True)
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            same = np.array_equal(np.load(folder / f"pairs{tasks}.npy"), np.load(folder / f"pairs{args.tasks[0]}.npy"))
            rows[-1]["same_pairs_as_one_index"] = bool(same) if args.tasks[0] == 0 else None  # None: no one-index case run
            print(json.dumps(rows[-1]), flush=True)
        planted = np.load(folder / "planted.npy")
        found = {tuple(p) for p in np.load(folder / f"pairs{args.tasks[0]}.npy").tolist()}
        planted_found = int(sum((min(a, b), max(a, b)) in found for a, b in planted.tolist()))
    doc = {"benchmark": "bench_near_bands.py", "machine": mach, "commit": commit(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "docs": args.docs, "copies": args.copies,
           "shards": args.shards, "cpus_allowed": len(os.sched_getaffinity(0)), "planted_pairs_found": planted_found,
           "cases": rows, "wall_s": round(time.perf_counter() - t0, 1)}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
