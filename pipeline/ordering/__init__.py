"""Ordering strategies (interim: random and greedy f3; the full engine lands with issue 3)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import scipy.sparse as sp

from pipeline.errors import StrataInputError


@dataclass(frozen=True)
class OrderingResult:
    order: pl.DataFrame  # position, sequence_id
    segments: pl.DataFrame | None = None  # set when the strategy repacked documents


def _characteristics(docs: pl.DataFrame, segments: pl.DataFrame, n_bins: int) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    lengths = docs["n_tokens"].to_numpy()
    edges = np.quantile(lengths, np.linspace(0, 1, n_bins + 1)[1:-1])
    k = int(docs["cluster"].max()) + 1
    doc_bin = np.searchsorted(edges, lengths, side="right")
    d = segments["doc_id"].to_numpy()
    sid = segments["sequence_id"].to_numpy()
    n = segments["n_tokens"].to_numpy().astype(np.float64)
    m = int(sid.max()) + 1
    cols = np.concatenate([docs["cluster"].to_numpy()[d], k + doc_bin[d]])
    c = sp.csr_matrix((np.concatenate([n, n]), (np.concatenate([sid, sid]), cols)), shape=(m, k + n_bins))
    c.sum_duplicates()
    return c, np.asarray(c.sum(axis=0)).ravel(), np.r_[np.zeros(k, bool), np.ones(n_bins, bool)]


def greedy_f3(c: sp.csr_matrix, is_len: np.ndarray, lam: float) -> np.ndarray:
    """Seed 000 f3 via f(s) = const + sum_j w_j (2 D_j c_sj + c_sj^2), D = T - tau (S + l_s)."""
    m = c.shape[0]
    w = np.where(is_len, lam, 1.0)
    ell = np.asarray(c[:, ~is_len].sum(axis=1)).ravel()
    tau = np.asarray(c.sum(axis=0)).ravel() / ell.sum()
    sq = np.asarray(c.multiply(c) @ w).ravel()
    ct = c.T.tocsr()
    tw = c @ (w * tau)  # sum_j w_j tau_j c_sj
    tt = float((w * tau * tau).sum())
    T = np.zeros(c.shape[1])
    S = 0.0
    left = np.ones(m, bool)
    out = np.empty(m, np.int64)
    for t in range(m):
        base = T - tau * S
        # f(s) - const = sum_j w (base_j + c_sj - tau_j l_s)^2 expanded; drop s-independent terms
        score = 2 * (c @ (w * base)) + sq - 2 * ell * (tau * w * base).sum() - 2 * ell * tw + tt * ell * ell
        score[~left] = np.inf
        s = int(np.argmin(score))
        out[t] = s
        left[s] = False
        row = c.getrow(s)
        T[row.indices] += row.data
        S += ell[s]
    del ct
    return out


def run_strategy(name: str, docs: pl.DataFrame, segments: pl.DataFrame, seq_len: int, params: dict, seed: int) -> OrderingResult:
    m = int(segments["sequence_id"].max()) + 1
    if name == "random":
        order = np.random.default_rng(seed).permutation(m)
    elif name == "greedy":
        c, _, is_len = _characteristics(docs, segments, int(params.get("bins", 100)))
        order = greedy_f3(c, is_len, float(params.get("lam", 1.0)))
    else:
        raise StrataInputError(f"unknown ordering strategy {name!r}", fix=f"use one of {sorted(STRATEGIES)}")
    return OrderingResult(pl.DataFrame({"position": np.arange(m, dtype=np.int64), "sequence_id": order.astype(np.int64)}))


STRATEGIES = ("random", "greedy")
