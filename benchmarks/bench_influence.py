"""TerRIFIC influence throughput: examples/s of exact per-example gradients + sparse projection.

    python benchmarks/bench_influence.py [--presets tiny small] [--seq-len 256] [--vocab 8192] [--examples 32]
                                         [--dim 1024] [--nnz 4] [--batch 8]
    python benchmarks/bench_influence.py --meta-root DATA_ROOT [--config CFG]   # + one static meta-iteration

Per preset: a fresh model (``pipeline.training.model``) on packed synthetic documents (log-normal
lengths, Zipfian ids); times ``per_example_grads`` (torch.func vmap(grad)) and the projection
separately over ``--examples`` sequences after one warm-up batch, and prints examples/s of both
together. ``--meta-root`` times one Train -> Measure -> Update iteration
(``pipeline.mixture.loop.static_iteration``) on a data root whose tokens, clusters and
``mixture_target`` are materialized (e.g. ``strata run --select '*mixture_target or *clusters or *tokens'``).
Runs on CUDA when torch sees it.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_train import synthetic_store  # noqa: E402
from pipeline.devices import device  # noqa: E402
from pipeline.mixture.terrific import SparseProjection, per_example_grads  # noqa: E402
from pipeline.training.model import batch_tensors, build_model  # noqa: E402


def bench_preset(preset: str, seq_len: int, vocab: int, n: int, dim: int, nnz: int, batch: int) -> dict:
    import torch

    dev = device()
    store = synthetic_store(seq_len * (n + batch) * 2, vocab, seq_len)
    model = build_model(preset, vocab, seq_len, 0, 0, 1).to(dev).eval()
    params = sum(p.numel() for p in model.parameters())
    proj = SparseProjection({k: tuple(v.shape) for k, v in model.named_parameters()}, dim, nnz, 0)

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    b = batch_tensors(store, np.arange(batch), False, dev)
    proj(per_example_grads(model, b))  # warm-up
    t_grad = t_proj = 0.0
    c0 = time.process_time()
    for start in range(batch, batch + n, batch):
        b = batch_tensors(store, np.arange(start, start + batch), False, dev)
        sync()
        t0 = time.perf_counter()
        g = per_example_grads(model, b)
        sync()
        t1 = time.perf_counter()
        proj(g)
        sync()
        t2 = time.perf_counter()
        t_grad += t1 - t0
        t_proj += t2 - t1
    cpu = time.process_time() - c0
    return {"preset": preset, "params": params, "grad_s": t_grad, "proj_s": t_proj, "examples_per_s": n / (t_grad + t_proj),
            "examples_per_cpu_s": n / cpu}


def bench_meta(root: str, config: str | None) -> None:
    from pipeline.config import resolve_config
    from pipeline.mixture.loop import initial_logits, static_iteration
    from pipeline.mixture.stage import MixtureParams, corpus_shares, meta_context
    from pipeline.storage.layout import Layout

    cfg = resolve_config(config, root)
    ctx = meta_context(MixtureParams.from_config(cfg), Layout(cfg.root))
    t0, c0 = time.perf_counter(), time.process_time()
    it = static_iteration(ctx, initial_logits(corpus_shares(ctx)), seed=cfg.seed)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n_ex = len(ctx.cluster_examples) + len(ctx.target_fit)
    print(f"meta-iteration on {cfg.root}: {wall:.1f} s wall, {cpu:.1f} CPU-s ({cfg.max_steps} steps x {cfg.batch_size} x {cfg.seq_len}, "
          f"{cfg.model_preset}, {ctx.n_clusters} clusters, {n_ex} influence examples, d={cfg.mixture.projection_dim}); "
          f"target loss {it.scores['target_loss']:.4f}, top delta cluster {int(np.argmax(it.measurement.delta))}")


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="*", default=["tiny", "small"])
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--examples", type=int, default=32)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--nnz", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--meta-root", default="")
    ap.add_argument("--config", default=None)
    a = ap.parse_args()
    dev = device()
    name = (torch.cuda.get_device_name() if dev == "cuda"
            else f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    print(f"device: {dev} ({name}); seq_len {a.seq_len}, vocab {a.vocab}, d={a.dim}, s={a.nnz}, vmap batch {a.batch}")
    print("wall seconds; examples per CPU-second (all threads) beside them, for a shared machine")
    print(f"{'preset':8} {'params':>10} {'grad s':>8} {'proj s':>8} {'examples/s':>11} {'ex/CPU-s':>9}")
    for p in a.presets:
        r = bench_preset(p, a.seq_len, a.vocab, a.examples, a.dim, a.nnz, a.batch)
        print(f"{r['preset']:8} {r['params']:>10,} {r['grad_s']:>8.2f} {r['proj_s']:>8.2f} {r['examples_per_s']:>11.2f} "
              f"{r['examples_per_cpu_s']:>9.2f}")
    if a.meta_root:
        bench_meta(a.meta_root, a.config)


if __name__ == "__main__":
    main()
