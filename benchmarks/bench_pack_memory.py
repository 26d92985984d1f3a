"""The packing's memory a document: the segments table made whole (``pack``, then written) against
streamed to its file a stretch of documents at a time (``pack_concat_file``), and token
conservation checked on the whole table (``conservation``) against a batch at a time
(``conservation_file``). Each mode runs in a fresh process; its peak RSS (VmHWM) is taken beside
the RSS before the documents' arrays exist, at two corpus sizes: what a mode's peak adds per
document between them (``added_bytes_a_document``) is what grows with the corpus, the order and the
lengths (the stage's inputs: int32 for the streamed pair, as ``narrow_lengths`` gives them) included;
the rest is a stretch's or a batch's, the same at any size.

Run: ``nice python benchmarks/bench_pack_memory.py [--docs N1 N2] [--out benchmarks/results/pack_memory.json]``.
Document stream lengths are log-normal (median ~200 tokens, long tail), as in ``bench_pack.py``.
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
import pyarrow.parquet as pq

MODES = ("pack_whole", "pack_streamed", "check_whole", "check_streamed")


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def run_mode(mode: str, n_docs: int, seq_len: int, work: Path) -> dict:
    """One mode in this process: its seconds, peak RSS and RSS before the inputs (MiB)."""
    import polars as pl

    from pipeline.packing.pack import conservation, conservation_file, pack, pack_concat_file
    from pipeline.storage.atomic import write_parquet

    pack("concat", np.arange(100), np.full(100, 300), seq_len)  # numba compile, not timed
    conservation_file(_small_file(work, seq_len), np.full(100, 300), seq_len)
    before = _rss_kb("VmRSS")
    lengths = _lengths(n_docs, np.int32 if mode.endswith("streamed") else np.int64)  # the stage narrows them for the streamed pair
    order = np.random.default_rng(1).permutation(n_docs) if mode.startswith("pack") else None  # a check reads no order
    path = work / f"segments-{n_docs}.parquet"
    t0 = time.perf_counter()
    if mode == "pack_whole":
        write_parquet(pack("concat", order, lengths, seq_len).segments, path)
    elif mode == "pack_streamed":
        pack_concat_file(order, lengths, seq_len, path)
    else:
        result = (conservation(pl.read_parquet(path), lengths, seq_len) if mode == "check_whole"
                  else conservation_file(path, lengths, seq_len))
        assert result["ok"], result
    seconds = time.perf_counter() - t0
    return {"mode": mode, "seconds": round(seconds, 2), "peak_mib": round(_rss_kb("VmHWM") / 1024, 1),
            "before_inputs_mib": round(before / 1024, 1)}


def _lengths(n_docs: int, dtype=np.int64, chunk: int = 1 << 20) -> np.ndarray:
    """The documents' stream lengths, made a chunk at a time: no temporaries as long as the corpus
    raise the peak the modes are measured by."""
    rng = np.random.default_rng(0)
    out = np.empty(n_docs, dtype)
    for a in range(0, n_docs, chunk):
        b = min(a + chunk, n_docs)
        out[a:b] = np.maximum(1, rng.lognormal(np.log(200), 1.2, b - a)).astype(np.int64) + 1
    return out


def _small_file(work: Path, seq_len: int) -> Path:
    from pipeline.packing.pack import pack_concat_file

    path = work / "warm.parquet"
    pack_concat_file(np.arange(100), np.full(100, 300), seq_len, path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, nargs=2, default=[10_000_000, 20_000_000])
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.docs[0], args.seq_len, args.work)))
        return
    rows, segments = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.docs:
            for mode in MODES:  # the checks read the file the streamed packing wrote
                cmd = [sys.executable, __file__, "--mode", mode, "--docs", str(n), str(n), "--seq-len", str(args.seq_len), "--work", tmp]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
                row = {"docs": n, **json.loads(out.stdout.strip().splitlines()[-1])}
                row["bytes_a_document"] = round((row["peak_mib"] - row["before_inputs_mib"]) * 2**20 / n, 1)
                rows.append(row)
                print(row, flush=True)
            segments[n] = pq.ParquetFile(Path(tmp) / f"segments-{n}.parquet").metadata.num_rows
    lo, hi = args.docs
    added = {m: round((_peak(rows, m, hi) - _peak(rows, m, lo)) * 2**20 / (hi - lo), 1) for m in MODES}
    print("added bytes a document:", added)
    if args.out:
        from bench_ablate import commit

        args.out.write_text(json.dumps({"benchmark": "bench_pack_memory.py", "commit": commit(),
                                        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                        "machine": {"cores": os.cpu_count()}, "docs": args.docs, "seq_len": args.seq_len,
                                        "segments": {str(k): v for k, v in segments.items()}, "runs": rows,
                                        "added_bytes_a_document": added}, indent=2) + "\n")


def _peak(rows: list[dict], mode: str, n: int) -> float:
    return next(r["peak_mib"] for r in rows if r["mode"] == mode and r["docs"] == n)

if __name__ == "__main__":
    main()
