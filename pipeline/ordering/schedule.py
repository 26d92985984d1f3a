"""A learned mixture realized over the whole corpus: per-sequence repeat counts, and their accounting.

``greedy_mixture`` trains on a *schedule*, not a permutation: sequence s of the base packing appears
r_s times, 0 <= r_s <= R (``max_sequence_copies``), so that the schedule's tokens per cluster approach
w_j x B (weights w, token budget B). Packed sequences hold several clusters, so the repeat decision
cannot be made per cluster alone. The rule (:func:`repeat_counts`):

1. **Rates.** A sequence's rate is a blend of per-cluster rates lambda_j weighted by its tokens,
   capped: r_s = clip(sum_j c_sj lambda_j / l_s, 0, R). A cluster-pure sequence is repeated at its
   cluster's rate, a mixed one at the blend. These are the repeat counts of least token-weighted
   squared repetition sum_s l_s r_s^2 / 2 whose cluster tokens sum_s c_sj r_s equal w_j B (lambda
   are that problem's multipliers); damped Newton steps on lambda from lambda_j = w_j B / C_j
   (C_j: the corpus's tokens of j; exact for cluster-pure sequences) solve it.
2. **Rounding.** r_s = floor(r_s) + 1 for a systematic sample of the fractions: the sequences of
   each dominant cluster, in a seeded order, take an extra copy where floor(u + cumulative fraction)
   steps (u ~ U(0, 1) per stratum), so each stratum gets its expected number of extra copies
   within one, and no sequence exceeds R.

When the corpus cannot give the mixture at B (a cluster needs more than R passes, or its tokens
come mixed with clusters the mixture wants less of), smaller budgets are tried and the largest one
nearest the mixture is kept (:func:`sequence_rates`). :func:`accounting` reports how close
(achieved vs target shares, their L1 distance) and where every corpus token went (scheduled once
or more, repeated, omitted), per cluster.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import yaml

from pipeline.errors import StrataInputError
from pipeline.heavy import lazy
from pipeline.ordering.features import SequenceFeatures
from pipeline.ordering.greedy import _dominant

sparse = lazy("scipy.sparse")  # imported on first use (pipeline/heavy.py)

ACCOUNTING_SCHEMA = {
    "cluster": pl.Int64, "target_share": pl.Float64, "realized_share": pl.Float64, "corpus_tokens": pl.Int64,
    "scheduled_tokens": pl.Int64, "distinct_tokens": pl.Int64, "repeated_tokens": pl.Int64, "omitted_tokens": pl.Int64,
    "max_copies": pl.Int64,
}
RATE_ITERATIONS = 100  # Newton steps on the rates (a feasible mixture converges in a few)
BUDGET_STEPS = 12  # an infeasible mixture: budgets down to 1/64 of the asked one are tried


def load_weights(path: str | Path, n_clusters: int) -> np.ndarray:
    """Mixture weights per cluster (normalized to sum 1) from a JSON/YAML mapping ``cluster: weight``
    or the ``mixture_weights`` asset's ``mixture/weights.parquet`` (its last iteration). Clusters
    the file leaves out get weight 0."""
    path = Path(path)
    fix = "write a JSON/YAML mapping cluster id -> weight (>= 0, not all 0), e.g. {0: 0.5, 3: 0.5}"
    if not path.is_file():
        raise StrataInputError("the mixture weights file does not exist", path=path,
                               fix="set mixture_weights_file to a JSON/YAML mapping, "
                                   "or materialize mixture_weights (mixture.enabled: true)")
    if path.suffix == ".parquet":
        t = pl.read_parquet(path)
        if not {"iteration", "cluster", "weight"} <= set(t.columns):
            raise StrataInputError("the weights table lacks iteration, cluster, weight", path=path, fix="use mixture/weights.parquet")
        t = t.filter(pl.col("iteration") == t["iteration"].max())
        raw = dict(zip(t["cluster"].to_list(), t["weight"].to_list()))
    else:
        try:
            text = path.read_text(encoding="utf-8")
            raw = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise StrataInputError(f"cannot read the mixture weights ({exc})", path=path, fix=fix) from None
    if not isinstance(raw, dict) or not raw:
        raise StrataInputError("the mixture weights are not a mapping cluster -> weight", path=path, fix=fix)
    w = np.zeros(n_clusters)
    for key, value in raw.items():
        try:
            j, v = int(key), float(value)
        except (TypeError, ValueError):
            raise StrataInputError(f"cannot read the entry {key!r}: {value!r}", path=path, fix=fix) from None
        if not 0 <= j < n_clusters:
            raise StrataInputError(f"cluster {j} is outside 0..{n_clusters - 1}", path=path,
                                   fix="name clusters of this corpus's clustering")
        if not (np.isfinite(v) and v >= 0):
            raise StrataInputError(f"cluster {j} has weight {v}", path=path, fix=fix)
        w[j] = v
    if not w.sum() > 0:
        raise StrataInputError("every weight is 0", path=path, fix=fix)
    return w / w.sum()


def solve_rates(C, inv_l: np.ndarray, want: np.ndarray, max_sequence_copies: int) -> np.ndarray:
    """r_s = clip(sum_j c_sj lambda_j / l_s, 0, R) with cluster tokens C^T r as near ``want`` as
    damped Newton steps on lambda (from the pure-sequence rates want_j / C_j) get."""
    k = want.size
    corpus = np.asarray(C.sum(axis=0)).ravel()
    lam = np.where(corpus > 0, want / np.maximum(corpus, 1e-300), 0.0)

    def rates(lam: np.ndarray) -> np.ndarray:
        return np.clip(C @ lam * inv_l, 0.0, max_sequence_copies)

    r = rates(lam)
    res = want - C.T @ r
    for _ in range(RATE_ITERATIONS):
        if np.abs(res).max() <= 1e-9 * max(want.sum(), 1.0):
            break
        active = (r > 0) & (r < max_sequence_copies)
        J = (C.T @ sparse.diags(active * inv_l) @ C).toarray()
        step = np.linalg.solve(J + (1e-9 * max(np.trace(J), 1e-300) / k + 1e-12) * np.eye(k), res)
        t, before = 1.0, np.linalg.norm(res)
        while t > 1e-4:  # backtracking: accept the first step length that lowers the residual
            cand = lam + t * step
            r_c = rates(cand)
            res_c = want - C.T @ r_c
            if np.linalg.norm(res_c) < before:
                break
            t /= 2
        else:
            break
        lam, r, res = cand, r_c, res_c
    return r


def _share_l1(C, r: np.ndarray, weights: np.ndarray) -> float:
    got = C.T @ r
    return float(np.abs(got / max(got.sum(), 1e-300) - weights).sum()) if got.sum() > 0 else 2.0


def sequence_rates(f: SequenceFeatures, weights: np.ndarray, budget: float, max_sequence_copies: int) -> np.ndarray:
    """Continuous repeat counts r_s in [0, R] (step 1 of the module docstring).

    When the corpus cannot give the mixture at ``budget`` (the cap binds, or mixed sequences carry
    clusters the mixture wants less of), lower budgets B 2^(-i/2), i = 1..12, are tried and the
    largest one whose realized shares are nearest the weights (L1, within 1e-3 of the best) is kept:
    the mixture comes before the budget."""
    c = f.clusters
    k = max(c.n_cols, weights.size)
    C = sparse.csr_matrix((c.data, c.indices, c.indptr), shape=(c.n_rows, k))
    w = np.zeros(k)
    w[: weights.size] = weights
    inv_l = 1.0 / f.lengths
    r = solve_rates(C, inv_l, w * budget, max_sequence_copies)
    if _share_l1(C, r, w) <= 1e-6:
        return r
    tried = [(r, _share_l1(C, r, w))]
    for i in range(1, BUDGET_STEPS + 1):
        r_i = solve_rates(C, inv_l, w * budget * 2.0 ** (-i / 2), max_sequence_copies)
        tried.append((r_i, _share_l1(C, r_i, w)))
    best = min(err for _, err in tried)
    return next(r_i for r_i, err in tried if err <= best + 1e-3)


def repeat_counts(f: SequenceFeatures, weights: np.ndarray, budget: float, max_sequence_copies: int, seed: int,
                  caps: np.ndarray | None = None) -> np.ndarray:
    """Integer copies r_s in 0..R of every row of ``f`` (the module docstring's rule), seeded;
    ``caps``: a cap of each row's own, at most R (a blend's per-group repetition caps)."""
    if max_sequence_copies < 1:
        raise StrataInputError(f"max_sequence_copies={max_sequence_copies} is impossible", fix="use max_sequence_copies >= 1 (default 4)")
    if not budget > 0:
        raise StrataInputError(f"the token budget {budget} is impossible", fix="use mixture_budget_tokens > 0 (0 = the corpus's tokens)")
    cap = int(max_sequence_copies) if caps is None else np.minimum(np.asarray(caps, dtype=np.int64), int(max_sequence_copies))
    return round_counts(f, sequence_rates(f, np.asarray(weights, dtype=np.float64), float(budget), cap), cap, seed)


def round_counts(f: SequenceFeatures, r: np.ndarray, cap, seed: int) -> np.ndarray:
    """Step 2 of the module docstring: continuous copies ``r`` rounded by a seeded systematic
    sample of their fractions within each dominant cluster of ``f``, at most ``cap`` (a number or
    one a row)."""
    base = np.floor(r).astype(np.int64)
    frac = r - base
    rng = np.random.default_rng(seed)
    stratum = _dominant(f.clusters)
    order = np.lexsort((rng.permutation(r.size), stratum))
    s, fr = stratum[order], frac[order]
    start = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    u = rng.random(start.size)
    size = np.diff(np.r_[start, s.size])
    cum = np.cumsum(fr)
    before = np.repeat(cum[start] - fr[start], size)
    within = cum - before + np.repeat(u, size)
    extra = np.floor(within) - np.floor(within - fr)
    counts = base.copy()
    counts[order] += extra.astype(np.int64)
    return np.minimum(counts, cap)


def accounting(order: np.ndarray, seq_cluster_tokens: pl.DataFrame, target: np.ndarray) -> pl.DataFrame:
    """Per cluster: target and realized token share, and where the corpus's tokens went
    (``ACCOUNTING_SCHEMA``): corpus = distinct + omitted, scheduled = distinct + repeated.

    ``order``: the schedule's sequence ids; ``seq_cluster_tokens``: (sequence_id, cluster, tokens)
    of every sequence of the packing it draws from."""
    sid = seq_cluster_tokens["sequence_id"].to_numpy().astype(np.int64)
    cl = seq_cluster_tokens["cluster"].to_numpy().astype(np.int64)
    tok = seq_cluster_tokens["tokens"].to_numpy().astype(np.int64)
    m = int(sid.max()) + 1 if sid.size else 0
    k = max(int(cl.max()) + 1 if cl.size else 0, np.asarray(target).size)
    copies = np.bincount(np.asarray(order, dtype=np.int64), minlength=m)
    corpus = np.bincount(cl, weights=tok, minlength=k).astype(np.int64)
    scheduled = np.bincount(cl, weights=tok * copies[sid], minlength=k).astype(np.int64)
    distinct = np.bincount(cl, weights=tok * (copies[sid] > 0), minlength=k).astype(np.int64)
    most = np.zeros(k, dtype=np.int64)
    np.maximum.at(most, cl, copies[sid])
    t = np.zeros(k)
    t[: np.asarray(target).size] = target
    return pl.DataFrame({
        "cluster": np.arange(k, dtype=np.int64), "target_share": t,
        "realized_share": scheduled / max(int(scheduled.sum()), 1), "corpus_tokens": corpus, "scheduled_tokens": scheduled,
        "distinct_tokens": distinct, "repeated_tokens": scheduled - distinct, "omitted_tokens": corpus - distinct,
        "max_copies": most,
    }, schema=ACCOUNTING_SCHEMA)


def cluster_tokens(segments: pl.DataFrame, doc_cluster: np.ndarray) -> pl.DataFrame:
    """(sequence_id, cluster, tokens) of a packing's segments, ``doc_cluster`` indexed by doc_id."""
    return (segments.select("sequence_id", pl.Series("cluster", doc_cluster[segments["doc_id"].to_numpy()]), "n_tokens")
            .group_by("sequence_id", "cluster").agg(tokens=pl.col("n_tokens").sum()).sort("sequence_id", "cluster"))


def l1_distance(table: pl.DataFrame) -> float:
    """sum_j |realized_j - target_j| of an :func:`accounting` table."""
    return float((table["realized_share"] - table["target_share"]).abs().sum())


def schedule_problems(order: np.ndarray, n_sequences: int, table: pl.DataFrame, max_sequence_copies: int) -> list[str]:
    """What is wrong with a schedule over ``n_sequences`` packed sequences and its accounting
    ``table`` (empty when nothing): ids outside the packing, a sequence over ``max_sequence_copies``
    copies, or tokens the accounting loses (corpus != distinct + omitted, scheduled != distinct +
    repeated, a negative count)."""
    order = np.asarray(order, dtype=np.int64)
    out = []
    if order.size == 0:
        out.append("the schedule is empty")
    elif order.min() < 0 or order.max() >= n_sequences:
        out.append(f"sequence ids outside 0..{n_sequences - 1}")
    else:
        most = int(np.bincount(order, minlength=n_sequences).max())
        if most > max_sequence_copies:
            out.append(f"a sequence appears {most} times, more than max_sequence_copies={max_sequence_copies}")
    t = {c: table[c].to_numpy() for c in ACCOUNTING_SCHEMA}
    if (t["corpus_tokens"] != t["distinct_tokens"] + t["omitted_tokens"]).any():
        out.append("corpus tokens != distinct + omitted tokens for some cluster")
    if (t["scheduled_tokens"] != t["distinct_tokens"] + t["repeated_tokens"]).any():
        out.append("scheduled tokens != distinct + repeated tokens for some cluster")
    if min(int(v.min()) for k, v in t.items() if k.endswith("_tokens")) < 0:
        out.append("a negative token count")
    return out
