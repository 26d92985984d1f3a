"""Export speed per format on a 100M-token ordering (targets: numpy and megatron
<= 30 s, mds and hf <= 2 min). Run: ``nice python benchmarks/bench_export.py [--tokens N]``.

Builds a synthetic data root in a temp dir (log-normal document lengths, a token store of one
file, concat packing, a random ordering), then exports it with the library's own reader
(``open_stream``: ``SequenceStore`` rows gathered from the token store on a thread a core). Prints
seconds and tokens/s, with the load average, since the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.data.token_index import TokenRuns, write_token_runs
from pipeline.export import FORMATS, export_stream, open_stream
from pipeline.packing.pack import pack
from pipeline.storage.layout import Layout


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=100_000_000)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--global-batch", type=int, default=512)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--formats", nargs="*", default=list(FORMATS))
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir, removed)")
    args = ap.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_export."))
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
