"""Export speed per format on a 100M-token ordering (targets: numpy and megatron
<= 30 s, mds and hf <= 2 min). Run: ``nice python benchmarks/bench_export.py [--tokens N]``.

``--writers 1 2`` instead compares ``export.writers`` (``pipeline/export/stretches.py``) on the
flat formats: each (format, writers) export runs ``--repeats`` times, alternating, in a fresh
process of its own (``--case``), which reports its wall and CPU seconds (its own and its worker
processes'), its peak RSS (``VmHWM``: the driver's, memory-mapped pages it read included) and the
largest worker's (``RUSAGE_CHILDREN``); every writers count's files are checked byte for byte
against the first's. Results: ``benchmarks/results/<--json>.json`` (docs/export.md, "Several writers").

Builds a synthetic data root in a temp dir (log-normal document lengths, a token store of one
file, concat packing, a random ordering), then exports it with the library's own reader
(``open_stream``: ``SequenceStore`` rows gathered from the token store on a thread a core). Prints
seconds and tokens/s, with the load average, since the machine is shared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_ablate import commit, machine  # noqa: E402
from bench_near_bands import _status_mb  # noqa: E402

from pipeline.data.token_index import TokenRuns, write_token_runs  # noqa: E402
from pipeline.export import FORMATS, export_stream, open_stream  # noqa: E402
from pipeline.export.stretches import Writers  # noqa: E402
from pipeline.packing.pack import pack  # noqa: E402
from pipeline.storage.layout import Layout  # noqa: E402


def build_root(root: Path, n_tokens: int, seq_len: int) -> Layout:
    rng = np.random.default_rng(0)
    n_docs = int(n_tokens / 300) + 1
    lengths = np.maximum(2, rng.lognormal(np.log(200), 1.2, n_docs)).astype(np.int64)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), n_tokens + seq_len) + 1]
    layout = Layout(root)
    for d in ("tokens", "sequences", "orderings"):
        (root / d).mkdir(parents=True, exist_ok=True)
    offsets = np.r_[0, np.cumsum(lengths)]
    store_path = root / "tokens" / "store.bin"
    tokens = np.memmap(store_path, dtype=np.uint16, mode="w+", shape=(int(offsets[-1]),))
    for lo in range(0, tokens.size, 1 << 24):
        tokens[lo : lo + (1 << 24)] = rng.integers(2, 50_000, size=min(1 << 24, tokens.size - lo), dtype=np.uint16)
    tokens[offsets[1:] - 1] = 1
    tokens.flush()
    one_run = TokenRuns([store_path], np.array([0, tokens.size], np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64))
    write_token_runs(one_run, tokens.dtype, layout.tokens)
    np.save(layout.doc_offsets, offsets)
    packing = pack("concat", rng.permutation(lengths.size), lengths, seq_len)
    packing.segments.write_parquet(layout.segments)
    layout.sequences_meta.write_text(json.dumps({"seq_len": seq_len, "packing": "concat", "freeze_prefix": 0}))
    order = rng.permutation(packing.n_sequences)
    pl.DataFrame({"position": np.arange(order.size), "sequence_id": order}).write_parquet(layout.ordering("bench"))
    return layout


def case(root: Path, fmt: str, writers: int, out: Path, global_batch: int, seq_len: int) -> dict:
    """One export of the bench ordering in this process: wall, CPU, peaks, and the files' SHA-256."""
    stream = open_stream(Layout(root), "bench", eos_id=1, pad_id=0, seq_len=seq_len)
    before = _status_mb("VmRSS")
    cpu0, t0 = time.process_time(), time.perf_counter()
    info = export_stream(stream, fmt, out, global_batch=global_batch, writers=Writers(writers))
    wall, cpu, peak = time.perf_counter() - t0, time.process_time() - cpu0, _status_mb("VmHWM")  # before the files are hashed
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"format": fmt, "writers": writers, "sequences": info["sequences"], "tokens": info["tokens"], "wall_s": round(wall, 2),
            "driver_cpu_s": round(cpu, 2), "workers_cpu_s": round(children.ru_utime + children.ru_stime, 2),
            "rss_before_mb": round(before, 1), "driver_peak_rss_mb": round(peak, 1),
            "largest_worker_peak_rss_mb": round(children.ru_maxrss / 1024, 1) if writers > 1 else None,
            "load_average": round(os.getloadavg()[0], 2),
            "digests": {f.relative_to(out).as_posix(): _sha256(f) for f in sorted(out.rglob("*"))
                        if f.is_file() and not f.name.startswith(".")}}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def compare_writers(args, work: Path) -> None:
    """``--writers``: each (format, writers) export ``--repeats`` times, alternating, in a fresh process."""
    mach = machine()
    t0 = time.perf_counter()
    layout = build_root(work / "root", args.tokens, args.seq_len)
    built = time.perf_counter() - t0
    rows, reference = [], {}
    for rep in range(args.repeats):
        for fmt in args.formats:
            for n in args.writers:
                out = work / "out" / f"{fmt}-{n}"
                # run by -c: the workers it spawns then import what they run, not this script again (as __mp_main__)
                cmd = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r}); import bench_export; "
                       "bench_export.main()", "--case", "--root", str(layout.root), "--formats", fmt, "--writers", str(n),
                       "--out", str(out), "--global-batch", str(args.global_batch), "--seq-len", str(args.seq_len)]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode:
                    sys.exit(proc.stderr[-3000:])
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                digests = row.pop("digests")
                reference.setdefault(fmt, digests)  # the first writers count's files, first repeat
                rows.append({**row, "repeat": rep, "same_bytes_as_first": digests == reference[fmt]})
                print(json.dumps(rows[-1]), flush=True)
                shutil.rmtree(out)
    doc = {"benchmark": "bench_export.py --writers", "machine": mach, "commit": commit(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "tokens_asked": args.tokens, "seq_len": args.seq_len,
           "global_batch": args.global_batch, "root_build_s": round(built, 1), "cases": rows}
    (REPO / "benchmarks" / "results" / f"{args.json}.json").write_text(json.dumps(doc, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=100_000_000)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--global-batch", type=int, default=512)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--formats", nargs="*", default=list(FORMATS))
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir, removed)")
    ap.add_argument("--writers", type=int, nargs="*", default=None, help="compare these export.writers counts (flat formats)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default="export_writers", help="results name for --writers")
    ap.add_argument("--case", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        print(json.dumps(case(Path(args.root), args.formats[0], args.writers[0], Path(args.out), args.global_batch, args.seq_len)))
        return
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_export."))
    if args.writers:
        try:
            compare_writers(args, work)
        finally:
            if not args.dir:
                shutil.rmtree(work, ignore_errors=True)
        return
    try:
        t0 = time.perf_counter()
        layout = build_root(work / "root", args.tokens, args.seq_len)
        stream = open_stream(layout, "bench", eos_id=1, pad_id=0, seq_len=args.seq_len)
        print(f"{stream.n_sequences:,} sequences x {args.seq_len} = {stream.n_sequences * args.seq_len:,} tokens "
              f"(data root built in {time.perf_counter() - t0:.0f} s); global batch {args.global_batch}, world size {args.world_size}")
        print(f"{'format':<26}{'seconds':>9}{'M tokens/s':>12}{'output MB':>11}{'load avg':>10}")
        for fmt in args.formats:
            out = work / "out" / fmt
            info = export_stream(stream, fmt, out, global_batch=args.global_batch, world_size=args.world_size, workers=2)
            size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 1e6
            print(f"{fmt:<26}{info['wall_s']:>9.1f}{info['tokens'] / info['wall_s'] / 1e6:>12.1f}{size:>11.0f}"
                  f"{os.getloadavg()[0]:>10.2f}")
            shutil.rmtree(out)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
