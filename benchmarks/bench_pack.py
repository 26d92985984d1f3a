"""Packing speed and per-variant figures on 1M synthetic documents (targets:
concat <= 30 s, best_fit <= 120 s). Run: ``nice python benchmarks/bench_pack.py [--docs N]``.

Document stream lengths are log-normal (median ~200 tokens, long tail), like a web crawl.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pipeline.packing.pack import PACKING_SPECS, pack, packing_stats, parse_packing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--specs", nargs="*", default=list(PACKING_SPECS))
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    lengths = np.maximum(1, rng.lognormal(np.log(200), 1.2, args.docs)).astype(np.int64) + 1
    order = rng.permutation(args.docs)
    pack("best_fit", order[:100], lengths, args.seq_len)  # numba compile, not timed
    print(f"{args.docs:,} documents, {lengths.sum():,} tokens, mean stream {lengths.mean():.0f}, seq_len {args.seq_len}")
    print(f"{'packing':<14}{'seconds':>9}{'sequences':>11}{'kept %':>8}{'padding %':>10}{'docs cut %':>11}{'docs/seq':>9}")
    for spec in args.specs:
        variant, atom = parse_packing(spec)
        t0 = time.perf_counter()
        p = pack(variant, order, lengths, args.seq_len, atom_multiple=atom, seed=0)
        dt = time.perf_counter() - t0
        s = packing_stats(p)
        print(
            f"{spec:<14}{dt:>9.2f}{s['sequences']:>11,}{100 * s['tokens_kept'] / s['tokens_in']:>8.3f}"
            f"{100 * s['padding_fraction']:>10.3f}{100 * s['docs_cut'] / s['docs_packed']:>11.2f}{s['docs_per_sequence']:>9.2f}"
        )


if __name__ == "__main__":
    main()
