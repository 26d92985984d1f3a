"""Training throughput (tokens/s) of the ablation loop, on CPU or CUDA (whichever torch sees).

    python benchmarks/bench_train.py [--presets tiny small base 100m] [--steps 30] [--batch-size 16] [--seq-len 1024]

Runs :func:`pipeline.training.loop.train` itself (block-diagonal document masks, bf16 autocast on
CUDA, fused AdamW) on a packed store of synthetic documents (log-normal lengths, Zipfian token
ids, vocabulary 50,257 like GPT-2/NeoX). The first ``--warmup`` steps (allocation, kernel
selection) are left out of the median tokens/s. Also prints the loss at the first and last step,
so a run that does not learn shows.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.devices import device  # noqa: E402
from pipeline.packing.pack import SequenceStore, pack_concat  # noqa: E402
from pipeline.training.loop import TrainSettings, train  # noqa: E402
from pipeline.training.model import preset_parameters  # noqa: E402

EOS, PAD = 0, 1


def synthetic_store(n_tokens: int, vocab: int, seq_len: int, seed: int = 0) -> SequenceStore:
    rng = np.random.default_rng(seed)
    lengths = np.maximum(2, rng.lognormal(np.log(300), 1.0, n_tokens // 300 + 1)).astype(np.int64)
    lengths = lengths[np.cumsum(lengths) <= n_tokens]
    flat = np.minimum(rng.zipf(1.2, int(lengths.sum())) + 1, vocab - 1).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat[offsets[1:] - 1] = EOS
    packing = pack_concat(np.arange(lengths.size), lengths, seq_len)
    return SequenceStore(flat, offsets, packing.segments, seq_len)


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="*", default=["tiny", "small"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=50257)
    args = ap.parse_args()
    dev = device()
    name = torch.cuda.get_device_name() if dev == "cuda" else f"{platform.processor() or 'cpu'}, {torch.get_num_threads()} threads"
    print(f"device {dev} ({name}); torch {torch.__version__}; batch {args.batch_size} x seq_len {args.seq_len}; {args.steps} steps")
    store = synthetic_store(args.batch_size * args.seq_len * (args.steps + 1), args.vocab, args.seq_len)
    order = np.arange(store.n_sequences)
    print(f"{'preset':<8}{'params':>8}{'tokens/s':>12}{'ms/step':>9}{'loss first':>12}{'loss last':>11}{'peak GiB':>10}")
    for preset in args.presets:
        if dev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        settings = TrainSettings(preset=preset, batch_size=args.batch_size, max_steps=args.steps,
                                 warmup_steps=max(1, args.steps // 10))
        _, rows = train(store, order, args.vocab, EOS, PAD, settings, progress=False)
        tps = float(np.median([r["tokens_per_s"] for r in rows[args.warmup:]] or [rows[-1]["tokens_per_s"]]))
        peak = torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else float("nan")
        params = preset_parameters(preset, args.vocab)["total"]
        print(f"{preset:<8}{params / 1e6:>7.1f}M{tps:>12,.0f}{1000 * args.batch_size * args.seq_len / tps:>9.1f}"
              f"{rows[0]['loss']:>12.3f}{rows[-1]['loss']:>11.3f}{peak:>10.2f}")


if __name__ == "__main__":
    main()
