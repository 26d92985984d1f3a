"""The TerRIFIC primitive (TerRIFIC curricula, "Warmup: Metagradient Descent + The TerRIFIC Optimizer").

    mG_theta(z) = R^{-1/2} P_d clip_t(grad_theta L(z, theta))
    v = mean_{z in V} mG(z),   g_j = mean_{z in c_j} mG(z),   I_j = <g_j, v>

and the stabilized logit increment Delta l (scores minus their mean over clusters, divided by
their standard deviation over clusters, clipped to [-c, c]).

Choices where the paper is vague (documented here, set in ``mixture:`` of the config):

* L(z, theta) is the mean next-token loss of one packed sequence z (within-document tokens only,
  as in training). Per-example gradients are exact: ``torch.func.vmap(grad(.))`` over the batch,
  every parameter (tied embedding included).
* clip_t scales a per-example gradient to norm <= t. t = 0 (default) takes the median
  per-example norm of the measurement, so a few outlier examples cannot dominate the means.
  Since P_d is linear, clip_t is applied after projecting: P(s g) = s P g.
* P_d is a block sparse Johnson-Lindenstrauss projection (Kane & Nelson): each coordinate i of
  theta goes, for r = 1..s, to one row of block r of size d/s with a random sign, scaled by
  1/sqrt(s). It is generated per parameter tensor from the seed (int32 bucket + int8 sign per
  coordinate and nonzero), never a dense d x |theta| matrix; applying it is ``s`` index_adds,
  O(s |theta|) per example. E<Px, Py> = <x, y> and inner products keep the JL guarantee
  for d = O(eps^-2 log n).
* R is the uncentered second moment of the projected, clipped gradients of the cluster examples
  (the empirical Fisher of the training distribution, the usual curvature proxy), regularized
  as R + ridge * (tr R / d) I. Whitening both sides gives <R^{-1/2}a, R^{-1/2}b> = a^T R^{-1} b,
  the influence-function form with R in place of the Hessian.
* Alignment is taken with the loss gradients on both sides: a positive I_j means a step on
  cluster j lowers the target loss, so the cluster's logit goes up.
* "a running mean over clusters is subtracted": the mean over clusters of this checkpoint's
  scores (logits are shift-invariant under softmax, so only relative values matter).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from pipeline.errors import StrataInputError
from pipeline.heavy import lazy

torch = lazy("torch")  # imported on first use (pipeline/heavy.py)
torch_func = lazy("torch.func")
F = lazy("torch.nn.functional")


@dataclass(frozen=True)
class InfluenceSettings:
    dim: int = 1024  # d
    nnz: int = 4  # s, nonzeros per column of P_d
    clip: float = 0.0  # t; 0 = median per-example gradient norm
    ridge: float = 0.1  # relative damping of R
    score_clip: float = 2.0  # c, clip of the normalized scores
    batch: int = 8  # examples per vmap call
    seed: int = 0  # the projection's seed (fixed across iterations)


class SparseProjection:
    """Block sparse JL projection R^{|theta|} -> R^d over a model's named parameters (see module doc)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], dim: int, nnz: int, seed: int):
        if not 1 <= nnz <= dim:
            raise StrataInputError(f"projection nnz={nnz} with dim={dim} is impossible", fix="use 1 <= projection_nnz <= projection_dim")
        self.dim, self.nnz = int(dim), int(nnz)
        block = dim // nnz
        self.block = block
        gen = torch.Generator().manual_seed(int(seed))
        self.buckets: dict[str, object] = {}
        self.signs: dict[str, object] = {}
        for name in sorted(shapes):
            n = int(np.prod(shapes[name]))
            b = torch.randint(0, block, (nnz, n), generator=gen, dtype=torch.int64)
            b += torch.arange(nnz, dtype=torch.int64)[:, None] * block
            self.buckets[name] = b.to(torch.int32)
            self.signs[name] = (torch.randint(0, 2, (nnz, n), generator=gen, dtype=torch.int8) * 2 - 1)

    @classmethod
    def for_vector(cls, n: int, dim: int, nnz: int, seed: int) -> "SparseProjection":
        return cls({"x": (n,)}, dim, nnz, seed)

    def __call__(self, grads: dict[str, object]):
        """Project per-example tensors ``{name: (B, *shape)}`` (all parameters) to ``(B, d)``."""
        out = None
        scale = 1.0 / np.sqrt(self.nnz)
        for name, g in grads.items():
            g2 = g.reshape(g.shape[0], -1).float()
            if out is None:
                out = torch.zeros(g2.shape[0], self.dim, dtype=torch.float32, device=g2.device)
            bk, sg = self.buckets[name].to(g2.device), self.signs[name].to(g2.device)
            for r in range(self.nnz):
                out.index_add_(1, bk[r].long(), g2 * sg[r].to(g2.dtype))
        return out * scale

    def vector(self, x):
        """Project plain vectors ``(B, n)`` (the ``for_vector`` layout)."""
        return self({"x": x})


def example_losses(model, batch: dict, params: dict | None = None):
    """Mean next-token loss of each sequence of a ``batch_tensors`` batch, shape (B,)."""
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"])
    logits = torch_func.functional_call(model, params, (), kwargs).logits if params is not None else model(**kwargs).logits
    y = batch["labels"]
    tok = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100, reduction="none").view(y.shape)
    scored = (y != -100).float()
    return (tok * scored).sum(1) / scored.sum(1).clamp(min=1.0)


def per_example_grads(model, batch: dict) -> dict[str, object]:
    """Exact per-example gradients of :func:`example_losses`: ``{name: (B, *param.shape)}``."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def one(p, ids, mask, pos, labels):
        b = {"input_ids": ids[None], "attention_mask": mask[None], "position_ids": pos[None], "labels": labels[None]}
        return example_losses(model, b, p)[0]

    with torch.enable_grad(), warnings.catch_warnings():
        # torch has no vmap batching rule for CPU SDPA yet; its fallback loop is exact, only slower
        warnings.filterwarnings("ignore", message="There is a performance drop")
        return torch_func.vmap(torch_func.grad(one), in_dims=(None, 0, 0, 0, 0))(
            params, batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["labels"]
        )


def project_examples(model, make_batch, ids: np.ndarray, proj: SparseProjection,
                     batch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(P g (n, d), ||g|| (n,), loss (n,))`` of the examples ``ids``; ``make_batch(ids)`` gives model inputs."""
    rows, norms, losses = [], [], []
    was_training = model.training
    model.eval()
    for start in range(0, len(ids), batch_size):
        batch = make_batch(np.asarray(ids[start : start + batch_size]))
        g = per_example_grads(model, batch)
        sq = sum(v.reshape(v.shape[0], -1).double().pow(2).sum(1) for v in g.values())
        norms.append(sq.sqrt().cpu().numpy())
        rows.append(proj(g).double().cpu().numpy())
        with torch.no_grad():
            losses.append(example_losses(model, batch).double().cpu().numpy())
    model.train(was_training)
    return np.concatenate(rows), np.concatenate(norms), np.concatenate(losses)


def clip_scale(norms: np.ndarray, t: float) -> np.ndarray:
    """Per-example factor of clip_t: min(1, t / ||g||) (0-norm examples keep factor 1)."""
    norms = np.asarray(norms, dtype=np.float64)
    return np.minimum(1.0, t / np.maximum(norms, 1e-30))


def whitening(x: np.ndarray, ridge: float) -> np.ndarray:
    """R^{-1/2} for R = x^T x / n + ridge * (tr R / d) I (symmetric, d x d)."""
    n, d = x.shape
    r = x.T @ x / max(n, 1)
    lam = ridge * max(np.trace(r) / d, 1e-30)
    w, v = np.linalg.eigh(r + lam * np.eye(d))
    return (v / np.sqrt(w)) @ v.T


def cluster_scores(mg_target: np.ndarray, mg_clusters: np.ndarray, example_cluster: np.ndarray,
                   n_clusters: int) -> tuple[np.ndarray, np.ndarray]:
    """(I_j = <g_j, v> per cluster, and which clusters had examples); v and g_j are plain means."""
    v = mg_target.mean(axis=0)
    counts = np.bincount(example_cluster, minlength=n_clusters)
    sums = np.zeros((n_clusters, mg_clusters.shape[1]))
    np.add.at(sums, example_cluster, mg_clusters)
    g = sums / np.maximum(counts, 1)[:, None]
    return g @ v, counts > 0


def stabilize(scores: np.ndarray, clip: float, present: np.ndarray | None = None) -> np.ndarray:
    """Delta l: scores minus their mean over clusters, over their standard deviation, clipped to [-clip, clip].

    Clusters without examples (``present`` false) get 0. Equal scores give all zeros.
    """
    s = np.asarray(scores, dtype=np.float64)
    ok = np.ones(s.size, dtype=bool) if present is None else np.asarray(present, dtype=bool)
    out = np.zeros_like(s)
    if ok.sum() < 2:
        return out
    c = s[ok] - s[ok].mean()
    sd = c.std()
    if sd <= 1e-12 * max(1.0, np.abs(s[ok]).max()):
        return out
    out[ok] = np.clip(c / sd, -clip, clip)
    return out


@dataclass(frozen=True)
class Measurement:
    scores: np.ndarray  # I_j (C,)
    delta: np.ndarray  # stabilized Delta l (C,)
    present: np.ndarray  # clusters with examples (C,) bool
    clip_t: float  # the t used
    target_loss: float  # mean per-sequence loss of the target examples at theta
    n_examples: int


def measure(
    model,
    make_target_batch,
    target_ids: np.ndarray,
    make_pool_batch,
    cluster_ids: np.ndarray,
    cluster_of_example: np.ndarray,
    n_clusters: int,
    settings: InfluenceSettings,
) -> Measurement:
    """One TerRIFIC "Measure" step at the model's current parameters: scores I_j and Delta l."""
    if len(target_ids) == 0 or len(cluster_ids) == 0:
        raise StrataInputError("TerRIFIC needs target and cluster examples", fix="give a non-empty target set and clusters with sequences")
    shapes = {k: tuple(v.shape) for k, v in model.named_parameters()}
    proj = SparseProjection(shapes, settings.dim, settings.nnz, settings.seed)
    pt, nt, lt = project_examples(model, make_target_batch, target_ids, proj, settings.batch)
    pc, nc, _ = project_examples(model, make_pool_batch, cluster_ids, proj, settings.batch)
    t = settings.clip if settings.clip > 0 else float(np.median(np.concatenate([nt, nc])))
    xt = pt * clip_scale(nt, t)[:, None]
    xc = pc * clip_scale(nc, t)[:, None]
    w = whitening(xc, settings.ridge)
    scores, present = cluster_scores(xt @ w, xc @ w, np.asarray(cluster_of_example, dtype=np.int64), n_clusters)
    return Measurement(scores, stabilize(scores, settings.score_clip, present), present, t, float(lt.mean()),
                       len(target_ids) + len(cluster_ids))
