"""Gradient analyses of an ordering (Don't Shuffle, Optimize; TerRIFIC curricula, "The Merits of Our Scheduler").

* Stable rank of per-batch gradients, per layer: for a weight matrix W of a decoder layer
  (attention q/k/v/o, MLP gate/up/down) and one training batch, M = dLoss/dW and
  ``srank(M) = ||M||_F^2 / ||M||_2^2`` (TerRIFIC curricula, eq. srank). Don't Shuffle, Optimize probes checkpoints at 20% and
  100% of the steps and reports the minimum and the mean over batches per layer. TerRIFIC curricula
  write "for a fixed layer, we collect gradient matrix M in R^{T x d}": T tokens by the layer's
  width d, i.e. the gradient of the loss with respect to the layer's output at every token of the
  batch, M[t] = dLoss/dy_t for y_t = W x_t (``matrix="activations"``, **the paper's method**).
  Strata's default, ``matrix="weights"``, takes the weight gradient dLoss/dW = M^T X (out x in),
  the quantity the optimizer applies, which is what "effective directions explored in parameter
  space" measures. Config ``stable_rank_matrix``.
* Mixture fidelity (TerRIFIC curricula): at one frozen checkpoint, the large-batch gradient of each of 10
  consecutive chunks of a schedule, and the 10 x 10 matrix of their cosine similarities. A schedule
  without drift has a flat matrix (TerRIFIC curricula reports 0.945-0.947 everywhere). As the paper
  does ("a frozen model checkpoint (trained on non-overlapping data)"), the checkpoint is trained on
  documents no schedule holds (the held-out split: ``pipeline.training.heldout_store.heldout_store``).

Gradients come from ``torch.autograd.grad``: no optimizer step, ``.grad`` buffers untouched, the
model's train/eval mode restored. Forward passes use bf16 autocast on CUDA.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.heavy import lazy
from pipeline.packing.pack import SequenceStore
from pipeline.training.loop import autocast, batch_positions
from pipeline.training.model import batch_tensors, mask_mode_of, token_losses

torch = lazy("torch")  # imported on first use (pipeline/heavy.py)

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def stable_rank(m) -> float:
    """||M||_F^2 / ||M||_2^2 of a 2D matrix (numpy or torch); nan for the zero matrix."""
    t = torch.as_tensor(m).detach().float()
    if t.ndim != 2:
        raise StrataInputError(f"stable rank needs a matrix, got shape {tuple(t.shape)}", fix="pass a 2D array")
    s = torch.linalg.svdvals(t)
    top = float(s[0]) if s.numel() else 0.0
    return float((s.double() ** 2).sum()) / top**2 if top > 0 else float("nan")


def layer_matrices(model) -> list[tuple[str, int, str, str, object]]:
    """``(name, layer, block, matrix, parameter)`` of every attention and MLP weight, in layer order."""
    out = []
    for i, layer in enumerate(model.model.layers):
        for block, mod, names in (("attention", layer.self_attn, ATTENTION), ("mlp", layer.mlp, MLP)):
            for n in names:
                out.append((f"layers.{i}.{block}.{n}", i, block, n.removesuffix("_proj"), getattr(mod, n).weight))
    return out


def _loss(model, store: SequenceStore, ids: np.ndarray, cross_document: bool, dev: str, reduction: str):
    batch = batch_tensors(store, ids, cross_document, dev, mask_mode_of(model))
    with autocast(dev):
        tok, scored = token_losses(model, batch)
    total = (tok * scored).sum()
    return total / scored.sum().clamp(min=1) if reduction == "mean" else (total, scored.sum())


def batch_ids(order: np.ndarray, position: int, batch_size: int, epochs: int = 0) -> np.ndarray:
    """The sequence ids of batch ``position`` of a stream (wrapping like ``train`` does, or with
    ``epochs`` the drop-last epochs of ``train``)."""
    order = np.asarray(order, dtype=np.int64)
    return order[batch_positions(position, batch_size, order.size, epochs)]


def gradient_stable_ranks(
    model,
    store: SequenceStore,
    order: np.ndarray,
    positions: Sequence[int],
    batch_size: int,
    cross_document: bool = False,
    epochs: int = 0,
    matrix: str = "weights",
) -> pl.DataFrame:
    """Stable rank of each layer matrix's gradient on each probed batch (no optimizer step).

    ``matrix="weights"``: srank of dLoss/dW (out x in); ``matrix="activations"``: srank of
    M in R^{T x d}, the gradient with respect to the layer's output at each of the batch's T token
    positions (TerRIFIC curricula), from :func:`output_gradients`.

    Batch p is ``order[p*B:(p+1)*B]``, the batch the run trains on at step p (``epochs`` as in
    ``train``). Returns one row per (batch, matrix): ``probe`` (the batch's index among
    ``positions``, which pairs the probes of two runs), ``position, layer_name, layer, block,
    matrix, stable_rank``.
    """
    if len(positions) == 0:
        raise StrataInputError("no batch positions to probe", fix="pass e.g. the next few steps after a checkpoint")
    if matrix not in ("weights", "activations"):
        raise StrataInputError(f"unknown stable-rank matrix {matrix!r}",
                               fix="set stable_rank_matrix: weights (dLoss/dW) or activations (M in R^{T x d}, the paper's)")
    mats = layer_matrices(model)
    params = [m[4] for m in mats]
    dev = params[0].device.type
    was_training = model.training
    model.eval()
    rows = []
    try:
        for probe, p in enumerate(positions):
            ids = batch_ids(order, int(p), batch_size, epochs)
            if matrix == "activations":
                grads = [g for g, _ in output_gradients(model, store, ids, cross_document)]
            else:
                grads = torch.autograd.grad(_loss(model, store, ids, cross_document, dev, "mean"), params)
            for (name, i, block, kind, _), g in zip(mats, grads):
                rows.append({"probe": probe, "position": int(p), "layer_name": name, "layer": i, "block": block, "matrix": kind,
                             "stable_rank": stable_rank(g)})
    finally:
        model.train(was_training)
    return pl.DataFrame(rows)


def output_gradients(model, store: SequenceStore, ids: np.ndarray, cross_document: bool = False) -> list[tuple[object, object]]:
    """(M, X) of every layer matrix of :func:`layer_matrices` on the batch ``ids``: M in R^{T x d_out}
    the gradient of the batch's mean loss with respect to the layer's output y_t = W x_t at each of
    the T = B * seq_len positions, X in R^{T x d_in} its inputs; so dLoss/dW = M^T X."""
    modules = [m for _, _, _, _, m in _modules(model)]
    dev = modules[0].weight.device.type
    seen: dict[int, tuple[object, object]] = {}

    def keep(i):
        def hook(_module, inp, out):
            if i in seen:
                raise StrataInputError("a layer ran twice in one forward pass", fix="probe stable ranks with stable_rank_matrix: weights")
            seen[i] = (inp[0], out)
        return hook

    hooks = [mod.register_forward_hook(keep(i)) for i, mod in enumerate(modules)]
    try:
        loss = _loss(model, store, ids, cross_document, dev, "mean")
    finally:
        for h in hooks:
            h.remove()
    seen = [seen[i] for i in range(len(modules))]
    outs = torch.autograd.grad(loss, [o for _, o in seen])
    return [(g.reshape(-1, g.shape[-1]).float(), x.detach().reshape(-1, x.shape[-1]).float()) for g, (x, _) in zip(outs, seen)]


def _modules(model) -> list[tuple[str, int, str, str, object]]:
    """:func:`layer_matrices` with the linear modules instead of their weights, in the same order."""
    out = []
    for i, layer in enumerate(model.model.layers):
        for block, mod, names in (("attention", layer.self_attn, ATTENTION), ("mlp", layer.mlp, MLP)):
            for n in names:
                out.append((f"layers.{i}.{block}.{n}", i, block, n.removesuffix("_proj"), getattr(mod, n)))
    return out


def summarize_stable_ranks(rows: pl.DataFrame) -> pl.DataFrame:
    """Min and mean stable rank over the probed batches per layer matrix (TerRIFIC curricula figs. 6-7).

    Extra key columns present in ``rows`` (e.g. ``strategy``, ``seed``, ``checkpoint``) are kept.
    """
    keys = [c for c in ("strategy", "seed", "checkpoint") if c in rows.columns] + ["layer_name", "layer", "block", "matrix"]
    return (
        rows.group_by(keys)
        .agg(
            pl.col("stable_rank").min().alias("min_stable_rank"),
            pl.col("stable_rank").mean().alias("mean_stable_rank"),
            pl.len().alias("n_batches"),
        )
        .sort(keys)
    )


def chunk_gradients(
    model,
    store: SequenceStore,
    order: np.ndarray,
    n_chunks: int = 10,
    sequences_per_chunk: int = 64,
    batch_size: int = 16,
    cross_document: bool = False,
    param_filter: Callable[[str], bool] | None = None,
):
    """(n_chunks, P) float32 tensor: the large-batch gradient of each consecutive chunk of ``order``.

    Chunk c is ``order[c*M//n : (c+1)*M//n]``; its gradient is that of the token-mean loss over
    ``sequences_per_chunk`` sequences at evenly spaced positions of the chunk (all of them if the
    chunk is smaller), accumulated over micro-batches of ``batch_size``. Parameters: the decoder
    layers' attention and MLP matrices by default (``param_filter(name)`` on ``named_parameters``
    names otherwise); embeddings are left out by default because their rows mostly encode token
    frequency.
    """
    order = np.asarray(order, dtype=np.int64)
    if n_chunks < 2 or order.size < n_chunks:
        raise StrataInputError(
            f"cannot split {order.size} sequences into {n_chunks} chunks", fix="use n_chunks >= 2 and a longer schedule"
        )
    if param_filter is None:
        chosen = {id(m[4]) for m in layer_matrices(model)}
        params = [p for _, p in model.named_parameters() if id(p) in chosen]
    else:
        params = [p for n, p in model.named_parameters() if param_filter(n)]
    if not params:
        raise StrataInputError("the parameter filter selects no parameter", fix="select e.g. names containing 'mlp'")
    dev = params[0].device.type
    bounds = np.arange(n_chunks + 1) * order.size // n_chunks
    was_training = model.training
    model.eval()
    out = []
    try:
        for c in range(n_chunks):
            chunk = order[bounds[c] : bounds[c + 1]]
            take = min(sequences_per_chunk, chunk.size)
            ids = chunk[np.linspace(0, chunk.size, take, endpoint=False).astype(np.int64)]
            acc = [torch.zeros_like(p, dtype=torch.float32) for p in params]
            n_tok = 0
            for a in range(0, ids.size, batch_size):
                total, count = _loss(model, store, ids[a : a + batch_size], cross_document, dev, "sum")
                for buf, g in zip(acc, torch.autograd.grad(total, params)):
                    buf += g.float()
                n_tok += int(count)
            out.append(torch.cat([b.flatten() for b in acc]) / max(1, n_tok))
    finally:
        model.train(was_training)
    return torch.stack(out)


def cosine_matrix(vectors) -> np.ndarray:
    """(n, n) cosine similarities of the rows of ``vectors`` (float64)."""
    v = torch.as_tensor(vectors).double()
    norms = v.norm(dim=1)
    if (norms == 0).any():
        raise StrataInputError("a chunk gradient is zero", fix="probe a model whose loss depends on the selected parameters")
    u = v / norms[:, None]
    return (u @ u.T).clamp(-1, 1).cpu().numpy()


def mixture_fidelity(model, store: SequenceStore, order: np.ndarray, **chunking: Any) -> np.ndarray:
    """The n_chunks x n_chunks cosine-similarity matrix of chunk gradients (TerRIFIC curricula, fig. 5);
    ``chunking``: the keywords of :func:`chunk_gradients`."""
    return cosine_matrix(chunk_gradients(model, store, order, **chunking))


def fidelity_rows(matrix: np.ndarray) -> pl.DataFrame:
    """Tidy form of a fidelity matrix: ``chunk_i, chunk_j, cosine``."""
    n = matrix.shape[0]
    i, j = np.divmod(np.arange(n * n), n)
    return pl.DataFrame({"chunk_i": i.astype(np.int64), "chunk_j": j.astype(np.int64), "cosine": np.asarray(matrix).ravel()})
