"""Curriculum-aligned targets (TerRIFIC curricula, "Dynamic Schedules: From Fixed Mixtures to Continuous Curricula").

p(N) = softmax(f(N)) with f piecewise linear in log N between user knots and clamped outside;
the cumulative group target is E_j(S) = int_0^S p_j(n) dn and the length target
U*_b(S) = sum_j E_j(S) kappa_{b|j}. The greedy then scores
sum_j [(T_j + c_sj) - E_j(S + l_s)]^2 + lam sum_b [(U_b + l_sb) - U*_b(S + l_s)]^2.

Knots file (JSON or YAML)::

    knots:
      - tokens: 1.0e5            # N at this knot
        logits: {0: 2.0, 3: -1}  # cluster -> logit; unlisted clusters get `default_logit` (0)
      - tokens: 1.0e7
        logits: [0.0, 0.5, ...]  # or a full list of K logits
    default_logit: 0.0           # optional

The integral is evaluated with 16-point Gauss-Legendre in u = log n on each piece between
knots (f is linear in u there, so the integrand is smooth), and E(S) is rescaled so that
sum_j E_j(S) = S exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import yaml

from pipeline.errors import StrataInputError
from pipeline.ordering.features import Csr, SequenceFeatures
from pipeline.ordering.greedy import Objective, tie_tolerance

_GL_X, _GL_W = np.polynomial.legendre.leggauss(16)


@dataclass(frozen=True)
class Curriculum:
    """Knots (log N_k, logits f_k in R^K) of a piecewise-linear-in-log-N logit schedule."""

    log_tokens: np.ndarray  # (n_knots,) strictly increasing
    logits: np.ndarray  # (n_knots, K)

    def probabilities(self, log_n: np.ndarray) -> np.ndarray:
        """p(N) = softmax(f(N)) at the given log N (clamped outside the knots); (len, K)."""
        u = np.clip(np.atleast_1d(log_n), self.log_tokens[0], self.log_tokens[-1])
        k = np.clip(np.searchsorted(self.log_tokens, u, side="right") - 1, 0, self.log_tokens.size - 2)
        if self.log_tokens.size == 1:
            f = np.repeat(self.logits[:1], u.size, axis=0)
        else:
            x0, x1 = self.log_tokens[k], self.log_tokens[k + 1]
            alpha = ((u - x0) / (x1 - x0))[:, None]
            f = (1.0 - alpha) * self.logits[k] + alpha * self.logits[k + 1]
        f = f - f.max(axis=1, keepdims=True)
        e = np.exp(f)
        return e / e.sum(axis=1, keepdims=True)

    def integral(self, lo: float, hi: float) -> np.ndarray:
        """int_lo^hi p(n) dn for 0 <= lo <= hi, piecewise over the knots."""
        total = np.zeros(self.logits.shape[1])
        n0 = float(np.exp(self.log_tokens[0]))
        if lo < n0:  # below the first knot p is constant
            total += (min(hi, n0) - lo) * self.probabilities(np.array([self.log_tokens[0]]))[0]
            lo = n0
        if hi <= lo:
            return total
        cuts = np.concatenate([[np.log(lo)], self.log_tokens[(self.log_tokens > np.log(lo)) & (self.log_tokens < np.log(hi))], [np.log(hi)]])
        for u0, u1 in zip(cuts[:-1], cuts[1:]):
            u = 0.5 * (u1 - u0) * _GL_X + 0.5 * (u1 + u0)
            total += 0.5 * (u1 - u0) * (_GL_W * np.exp(u)) @ self.probabilities(u)
        return total

    def cumulative(self, s_values: np.ndarray) -> np.ndarray:
        """E(S) for ascending S values: (len, K), each row summing to its S."""
        s_values = np.asarray(s_values, dtype=np.float64)
        out = np.empty((s_values.size, self.logits.shape[1]))
        acc = np.zeros(self.logits.shape[1])
        prev = 0.0
        for i, s in enumerate(s_values):
            acc = acc + self.integral(prev, float(s))
            prev = float(s)
            tot = acc.sum()
            out[i] = acc * (s / tot) if tot > 0 else acc
        return out


def load_curriculum(path: str | Path, n_clusters: int) -> Curriculum:
    """Read a knots file (JSON or YAML, see module docstring) for ``n_clusters`` clusters."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) if path.suffix in (".yaml", ".yml") else json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise StrataInputError(f"cannot read the curriculum file ({exc})", fix="give a readable JSON or YAML knots file", path=path) from None
    return curriculum_from_dict(raw, n_clusters, path)


def curriculum_from_dict(raw: object, n_clusters: int, path: object = "<curriculum>") -> Curriculum:
    fix = "write {knots: [{tokens: N, logits: {cluster: value} or [K values]}, ...]} with N > 0 increasing"
    if not isinstance(raw, dict) or not isinstance(raw.get("knots"), list) or not raw["knots"]:
        raise StrataInputError("the curriculum has no list of knots", fix=fix, path=path)
    default = float(raw.get("default_logit", 0.0))
    logs, rows = [], []
    for i, knot in enumerate(raw["knots"]):
        if not isinstance(knot, dict) or "tokens" not in knot or "logits" not in knot:
            raise StrataInputError(f"knot {i} lacks `tokens` or `logits`", fix=fix, path=path)
        n = float(knot["tokens"])
        if not n > 0:
            raise StrataInputError(f"knot {i} has tokens={knot['tokens']!r}", fix=fix, path=path)
        f = np.full(n_clusters, default)
        lg = knot["logits"]
        if isinstance(lg, dict):
            for c, val in lg.items():
                c = int(c)
                if not 0 <= c < n_clusters:
                    raise StrataInputError(f"knot {i} names cluster {c}, outside 0..{n_clusters - 1}", fix=fix, path=path)
                f[c] = float(val)
        elif isinstance(lg, list) and len(lg) == n_clusters:
            f[:] = np.asarray(lg, dtype=np.float64)
        else:
            raise StrataInputError(f"knot {i} logits are neither a mapping nor a list of {n_clusters} values", fix=fix, path=path)
        logs.append(np.log(n))
        rows.append(f)
    logs = np.asarray(logs)
    if np.any(np.diff(logs) <= 0):
        raise StrataInputError("knot token counts are not strictly increasing", fix=fix, path=path)
    return Curriculum(logs, np.vstack(rows))


def curriculum_greedy_order(
    features: SequenceFeatures, curriculum: Curriculum, objective: Objective, noise: float = 0.0, seed: int = 0
) -> np.ndarray:
    """Greedy with curriculum targets E_j(S + l_s) and U*_b(S + l_s) (TerRIFIC curricula); rows in order.

    ``objective``'s ``cluster`` family follows the curriculum, its ``length_bin`` family (weight lam)
    the curriculum's length target, its ``norm`` family the fixed rho and its sequence families
    (``concentration``, ``documents``, ``cluster_count``) their fixed shares of sequences, as in
    ``greedy``; other token families (documents columns) have no curriculum target and are refused. The targets move for every cluster at every
    step, so there is no sparse update: each step scores all remaining sequences with one sparse
    mat-vec per distinct sequence length, O(M * nnz) per step. Meant for demo-sized inputs
    (thousands of sequences). Ties and noise follow ``greedy`` (lowest row within
    ``tie_tolerance``; sigma in units of Lbar^2).
    """
    if curriculum.logits.shape[1] != features.clusters.n_cols:
        raise StrataInputError(
            f"the curriculum has {curriculum.logits.shape[1]} clusters, the sequences {features.clusters.n_cols}",
            fix="give one logit per cluster (or a mapping of cluster ids)",
        )
    weights = {f.name: f.weight for f in objective.families}
    other = sorted(set(weights) - {"cluster", "length_bin", "norm", "concentration", "documents", "cluster_count"})
    if other or "cluster" not in weights:
        raise StrataInputError(
            f"greedy_curriculum cannot balance the families {other or ['(no cluster family)']}",
            fix="use the families cluster, length_bin, norm, concentration, documents and cluster_count (any preset)",
        )
    wc, lam, wn = weights["cluster"], weights.get("length_bin", 0.0), weights.get("norm", 0.0)
    seq_fams = Objective(tuple(f for f in objective.families if f.level == "sequences"))
    m = features.n_sequences
    c = _scipy_csr(features.clusters, m)
    bm = _scipy_csr(features.bins, m)
    joint = features.cluster_bin_tokens
    kappa_cond = joint / np.maximum(joint.sum(axis=1, keepdims=True), 1e-300)
    c2 = np.asarray(c.multiply(c).sum(axis=1)).ravel()
    b2 = np.asarray(bm.multiply(bm).sum(axis=1)).ravel()
    lengths = features.lengths
    norms = np.sqrt(c2)
    rho = norms.sum() / lengths.sum()
    N = 0.0
    if seq_fams.families:
        chars = seq_fams.matrix(features)
        xs, t_seq, unit = _scipy_csr(chars.x, m), chars.targets(lengths), chars.unit
        a_seq = np.asarray(xs.multiply(xs).sum(axis=1)).ravel() - 2.0 * unit * (xs @ t_seq) + unit**2 * (t_seq @ t_seq)
        Xs = np.zeros(xs.shape[1])
    tol = tie_tolerance(max(lengths.max(), lengths.mean()), objective.total_weight)
    sigma = float(noise) * float(lengths.mean()) ** 2
    rng = np.random.default_rng(seed)
    T = np.zeros(c.shape[1])
    U = np.zeros(bm.shape[1])
    S = 0.0
    acc = np.zeros(c.shape[1])  # unnormalized int_0^S p
    live = np.ones(m, dtype=bool)
    out = np.empty(m, dtype=np.int64)
    score = np.empty(m)
    for step in range(m):
        for length in np.unique(lengths[live]):
            e = acc + curriculum.integral(S, S + length)
            e *= (S + length) / e.sum()
            dc = T - e
            db = U - e @ kappa_cond
            sel = live & (lengths == length)
            sc = wc * (c2 + 2.0 * (c @ dc) + dc @ dc) + lam * (b2 + 2.0 * (bm @ db) + db @ db)
            score[sel] = sc[sel]
        if seq_fams.families:
            score += a_seq + 2.0 * (xs @ (Xs - t_seq * unit * step))
        if wn:
            score += wn * (N + norms - rho * (S + lengths)) ** 2
        score[~live] = np.inf
        if sigma > 0:
            score[live] += sigma * rng.standard_normal(int(live.sum()))
        r = int(np.flatnonzero(score <= score.min() + tol)[0])
        out[step] = r
        live[r] = False
        lo, hi = c.indptr[r], c.indptr[r + 1]
        T[c.indices[lo:hi]] += c.data[lo:hi]
        lo, hi = bm.indptr[r], bm.indptr[r + 1]
        U[bm.indices[lo:hi]] += bm.data[lo:hi]
        if seq_fams.families:
            lo, hi = xs.indptr[r], xs.indptr[r + 1]
            Xs[xs.indices[lo:hi]] += xs.data[lo:hi]
        acc = acc + curriculum.integral(S, S + lengths[r])
        S += lengths[r]
        N += norms[r]
    return out


def _scipy_csr(x: Csr, m: int) -> sp.csr_matrix:
    return sp.csr_matrix((x.data, x.indices, x.indptr), shape=(m, x.n_cols))
