"""Ordering diagnostics: how evenly an ordering spreads clusters and document lengths.

Every metric is a deviation of some window of the schedule from the global mixture (Don't Shuffle, Optimize's
objective ``max_j max_[a:b] |rho_j(T[a:b]) - rho_j(T)|``) or a per-sequence diversity count
(Diversity-ordered training's table). Characteristics are *token* counts: a token belongs to its document's cluster
and to its document's length bin, so ``c_{s,j}`` and ``l_{s,b}`` are exactly the vectors of seed
000's f1-f3. All metrics are vectorized over a sparse (sequence, group, tokens) table; nothing
loops over sequences in Python. Results are tidy rows ``(strategy, metric, setting, value)``
(:data:`METRIC_SCHEMA`) for a DuckDB table.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.ordering import kernels as K
from pipeline.ordering.composition import (  # noqa: F401 (ordering_ids and the prefix errors: the diagnostics' API too)
    Composition,
    Schedule,
    _order_of,
    composition_of_docs,
    log_spaced_points,
    ordering_ids,
    prefix_errors,
    prefix_totals,
)
from pipeline.ordering.families import diagnosed
from pipeline.ordering.features import length_bin_edges, length_bin_of
from pipeline.reports import windows as W
from pipeline.segments import as_integers
from pipeline.threads import concurrently

METRIC_SCHEMA = {"strategy": pl.Utf8, "metric": pl.Utf8, "setting": pl.Utf8, "value": pl.Float64}
DEFAULT_BATCH_SIZES = (8, 32, 128)

Row = tuple[str, str, str, float]


def unroll(segments: pl.DataFrame, order: np.ndarray) -> tuple[pl.DataFrame, np.ndarray]:
    """A schedule (sequence ids that repeat, or leave some out) as a permutation: position p becomes
    sequence p, holding the segments of ``order[p]``; ``(segments, arange(P))``."""
    order = np.asarray(order, dtype=np.int64)
    pos = pl.DataFrame({"position": np.arange(order.size, dtype=np.int64), "sequence_id": order})
    seg = (pos.join(segments, on="sequence_id", how="inner").drop("sequence_id").rename({"position": "sequence_id"})
           .select(segments.columns))
    within = [c for c in ("seq_token_start",) if c in seg.columns]
    return seg.sort(["sequence_id", *within], maintain_order=True), np.arange(order.size, dtype=np.int64)


def prepare(segments: pl.DataFrame, ordering: pl.DataFrame | np.ndarray, doc_cluster: np.ndarray, doc_length: np.ndarray, *,
            bin_edges: np.ndarray | None = None, length_bins: int = 100, n_clusters: int | None = None,
            doc_source: np.ndarray | pl.Series | None = None, target_share: np.ndarray | None = None) -> Schedule:
    """Join an ordering with its packing's segments, document clusters and length bins.

    ``segments`` follows ``pipeline.packing.pack.SEGMENT_SCHEMA``; ``doc_cluster`` and ``doc_length``
    (stream length, n_tokens + 1) are indexed by doc_id. Length bins come from ``bin_edges`` when
    given (share them between strategies), else from :func:`length_bin_edges` over all documents.
    ``doc_source`` (optional, indexed by doc_id) is a per-document source label of any type; it is
    kept as dense integer codes (sorted label text; integer labels in value order, e.g. the codes of
    ``pipeline.storage.documents.label_codes``) for the stationarity diagnostics.
    ``target_share`` (per cluster): the ordering is a schedule realizing this mixture; it is
    unrolled (:func:`unroll`) and cluster deviations are measured against these shares.
    """
    order = ordering_ids(ordering)
    if target_share is not None:
        segments, order = unroll(segments, order)
    m = order.size
    position = _positions(order)
    doc_cluster = as_integers(doc_cluster)  # any integer dtype: the documents' int32 columns are not copied
    doc_length = as_integers(doc_length)
    if doc_cluster.shape != doc_length.shape:
        raise StrataInputError("doc_cluster and doc_length differ in length", fix="pass one entry per doc_id in both")
    seg_seq, seg_doc, seg_tok = _segment_arrays(segments, m, doc_cluster.size)
    k = int(doc_cluster.max()) + 1 if n_clusters is None else int(n_clusters)
    if doc_cluster.min() < 0 or doc_cluster.max() >= k:
        raise StrataInputError(f"cluster ids must lie in 0..{k - 1}", fix="relabel clusters densely from 0")

    def filled() -> None:  # beside the compositions, which need only ids in range
        if (K.token_sums(seg_seq, seg_tok, m)[0] <= 0).any():
            raise StrataInputError("a sequence of the ordering holds no tokens", fix="drop empty sequences before ordering")

    def by_length() -> tuple[np.ndarray, Composition]:
        edges = length_bin_edges(doc_length, length_bins) if bin_edges is None else np.asarray(bin_edges)
        return edges, composition_of_docs(seg_seq, seg_doc, seg_tok, length_bin_of(doc_length, edges), m, edges.size + 1)

    # independent passes at once: the one-core ones (checks, bins, gathers) beside the compositions' parallel ones
    _, clusters, (edges, bins), seg_doc_length, source = concurrently(
        filled, lambda: composition_of_docs(seg_seq, seg_doc, seg_tok, doc_cluster, m, k), by_length,
        lambda: doc_length[seg_doc], lambda: None if doc_source is None else source_codes(doc_source, doc_cluster.size))
    return Schedule(
        order=order,
        position=position,
        clusters=replace(clusters, target=_padded(target_share, k)),
        bins=bins,
        seg_seq=seg_seq,
        seg_tokens=seg_tok,
        seg_doc_length=seg_doc_length,
        bin_edges=edges,
        seg_doc=seg_doc,
        doc_source=source,
    )


def _positions(order: np.ndarray) -> np.ndarray:
    """The position of each sequence id in ``order``, which must be a permutation of 0..M-1 (an
    empty ordering, an id out of range or a repeated one is refused)."""
    m = order.size
    if m == 0:
        raise StrataInputError("the ordering is empty", fix="schedule at least one sequence")
    position = np.full(m, -1, dtype=np.int64)
    if order.min() < 0 or order.max() >= m:
        raise StrataInputError(
            f"the ordering's sequence ids are not 0..{m - 1}",
            fix="pass a permutation of the packing's sequence ids (a schedule that repeats or leaves out sequences: with its target_share)"
        )
    position[order] = np.arange(m, dtype=np.int64)
    if (position < 0).any():
        raise StrataInputError("the ordering repeats a sequence id",
                               fix="pass a permutation (each sequence once), or a schedule with its target_share")
    return position


def _segment_arrays(segments: pl.DataFrame, m: int, n_docs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The segments' sequence ids and doc ids (int64) and tokens, checked against an ordering of
    ``m`` sequences and ``n_docs`` documents with a cluster."""
    seg_seq = segments["sequence_id"].to_numpy().astype(np.int64, copy=False)
    seg_doc = segments["doc_id"].to_numpy().astype(np.int64, copy=False)
    seg_tok = segments["n_tokens"].to_numpy()  # Int32: a segment's tokens
    if seg_seq.size and (seg_seq.min() < 0 or seg_seq.max() >= m):
        raise StrataInputError("segments name a sequence the ordering lacks", fix="use the ordering of this packing")
    if seg_doc.size and (seg_doc.min() < 0 or seg_doc.max() >= n_docs):
        raise StrataInputError("segments name a doc_id without a cluster", fix="pass doc_cluster for every document")
    return seg_seq, seg_doc, seg_tok


def source_codes(doc_source: np.ndarray | pl.Series, n_docs: int) -> np.ndarray:
    """Dense integer codes of per-document source labels (see :func:`prepare`): integer labels
    without gaps in value order, else the labels' sorted text (a missing label is "")."""
    labels = pl.Series(doc_source)
    if labels.len() != n_docs:
        raise StrataInputError("doc_source and doc_cluster differ in length", fix="pass one source label per doc_id")
    if labels.dtype.is_integer() and not labels.null_count():  # codes already: densified in value order, no strings
        codes = labels.to_numpy()
        low = int(codes.min()) if codes.size else 0
        codes = codes - low if low else codes
        used = np.bincount(codes) > 0
        return codes if used.all() else (np.cumsum(used) - 1)[codes]
    return (labels.cast(pl.Utf8).fill_null("").rank("dense") - 1).to_numpy().astype(np.int64)


def _padded(share: np.ndarray | None, k: int) -> np.ndarray | None:
    if share is None:
        return None
    out = np.zeros(max(k, np.asarray(share).size))
    out[: np.asarray(share).size] = share
    return out[:k]


# ---------------------------------------------------------------------------------------------
# Metric kernels (arrays)
# ---------------------------------------------------------------------------------------------


def window_unique(comp: Composition, position: np.ndarray, window: int = 1) -> np.ndarray:
    """Distinct groups in each run of ``window`` consecutive sequences of the schedule.

    ``window=1`` is Diversity-ordered training's "unique clusters per training sequence", in training order. The
    last window may be shorter.
    """
    return K.window_unique(_order_of(position), K.row_pointers(comp.seq, comp.n_sequences), comp.group, comp.n_groups, int(window))


def batch_deviations(comp: Composition, position: np.ndarray, batch_size: int) -> np.ndarray:
    """max_j |rho_j(batch) - rho_j(global)| for each full batch of ``batch_size`` sequences.

    Don't Shuffle, Optimize's objective restricted to the training batches (consecutive, non-overlapping runs of
    ``batch_size`` sequences; an incomplete last batch is left out, as a trainer drops it).
    Groups absent from a batch deviate by their global share: their maximum is the share of the
    first absent group in descending-share order, found as the "mex" of the present ranks.
    """
    if batch_size < 1:
        raise StrataInputError(f"batch size {batch_size} is impossible", fix="use a batch size >= 1")
    n_batches = position.size // batch_size
    tau = comp.global_share()
    by_share = np.argsort(-tau, kind="stable")
    rank = np.empty_like(by_share)
    rank[by_share] = np.arange(by_share.size)
    tau_sorted = np.asarray(tau[by_share], dtype=np.float64)
    return K.batch_deviations(_order_of(position), K.row_pointers(comp.seq, comp.n_sequences), comp.group, comp.tokens, rank,
                              tau_sorted, int(batch_size), int(n_batches))


def decile_drift(schedule: Schedule, n_parts: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Per part of the schedule: token-weighted mean document length, and mean ||c_s||_2.

    Part ``i`` holds positions ``[i M / n, (i+1) M / n)``. The mean length is the average, over
    the part's tokens, of the stream length of the document the token comes from (the quantity
    the length bins balance); Don't Shuffle, Optimize warns that f1 front-loads short, mixed sequences, which
    shows as a rising length and ||c_s|| along the schedule. A schedule of fewer than ``n_parts``
    sequences gets one part per sequence.
    """
    m = schedule.n_sequences
    n_parts = min(n_parts, m)
    part_of_pos = np.arange(m, dtype=np.int64) * n_parts // m
    seq_part = part_of_pos[schedule.position]
    num, den = K.part_sums(seq_part, schedule.seg_seq, schedule.seg_tokens, schedule.seg_doc_length, n_parts)
    length = num / den
    norm = np.bincount(seq_part, weights=schedule.clusters.l2_norm(), minlength=n_parts) / np.bincount(
        seq_part, minlength=n_parts
    )
    return length, norm


# ---------------------------------------------------------------------------------------------
# Tidy rows
# ---------------------------------------------------------------------------------------------


def rows_frame(rows: Sequence[Row]) -> pl.DataFrame:
    """Rows ``(strategy, metric, setting, value)`` as a frame with :data:`METRIC_SCHEMA`."""
    return pl.DataFrame([list(r) for r in rows], schema=METRIC_SCHEMA, orient="row")


def diversity_rows(strategy: str, schedule: Schedule) -> list[Row]:
    """Diversity-ordered training's table: unique clusters per sequence (mean, min, max, population std)."""
    u = schedule.clusters.unique_per_sequence().astype(np.float64)
    return [
        (strategy, f"unique_clusters_per_seq_{name}", "", float(fn(u)))
        for name, fn in (("mean", np.mean), ("min", np.min), ("max", np.max), ("std", np.std))
    ]


def family_compositions(schedule: Schedule) -> list[tuple[str, Composition]]:
    """(metric name, composition) of every diagnosed characteristic family, in registry order
    (``pipeline/ordering/families/``: ``clusters`` and ``length_bins``, then any plugin's)."""
    out = []
    for spec in diagnosed():
        comp = spec.composition(schedule)
        if comp is not None:
            out.append((str(spec.diagnosed), comp))
    return out


def batch_rows(strategy: str, schedule: Schedule, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES) -> list[Row]:
    """Per-batch max share deviation for each diagnosed family (:func:`family_compositions`:
    clusters, length bins): max, mean, p95, best, and the indices of the best and worst batch.
    Batch sizes larger than the schedule give no rows."""
    rows: list[Row] = []
    for kind, comp in family_compositions(schedule):
        for bs in batch_sizes:
            dev = batch_deviations(comp, schedule.position, bs)
            if dev.size == 0:
                continue
            setting = f"batch={bs}"
            rows += [
                (strategy, f"batch_dev_{kind}_max", setting, float(dev.max())),
                (strategy, f"batch_dev_{kind}_mean", setting, float(dev.mean())),
                (strategy, f"batch_dev_{kind}_p95", setting, float(np.percentile(dev, 95))),
                (strategy, f"batch_dev_{kind}_best", setting, float(dev.min())),
                (strategy, f"batch_dev_{kind}_best_batch", setting, float(np.argmin(dev))),
                (strategy, f"batch_dev_{kind}_worst_batch", setting, float(np.argmax(dev))),
            ]
    return rows


def prefix_rows(strategy: str, schedule: Schedule, n_points: int = 64) -> list[Row]:
    """Prefix error trajectories of each diagnosed family (:func:`family_compositions`: clusters,
    length bins) at log-spaced t (sequences)."""
    t = log_spaced_points(schedule.n_sequences, n_points)
    rows: list[Row] = []
    for kind, comp in family_compositions(schedule):
        err = prefix_errors(comp, schedule.position, t)
        rows += [(strategy, f"prefix_error_{kind}", f"t={ti}", float(e)) for ti, e in zip(t, err)]
    return rows


def drift_rows(strategy: str, schedule: Schedule, n_parts: int = 10) -> list[Row]:
    """Mean document length and mean ||c_s||_2 per decile of the schedule."""
    length, norm = decile_drift(schedule, n_parts)
    rows: list[Row] = [(strategy, "drift_doc_length", f"decile={i}", float(v)) for i, v in enumerate(length)]
    rows += [(strategy, "drift_cluster_l2", f"decile={i}", float(v)) for i, v in enumerate(norm)]
    return rows


def curriculum_rows(strategy: str, schedule: Schedule, at: np.ndarray, target_share: np.ndarray) -> list[Row]:
    """Realized vs target cumulative cluster share T_j(t)/S(t) at prefix lengths ``at`` (sequences).

    ``target_share[p, j]`` is the curriculum's E_j(S(t_p)) / S(t_p) (TerRIFIC curricula: cumulative target
    tokens over prefix tokens). Rows: realized and target share per (checkpoint, cluster) and,
    per checkpoint, the max and L2 error over clusters.
    """
    at = np.asarray(at, dtype=np.int64)
    target = np.asarray(target_share, dtype=np.float64)
    k = schedule.clusters.n_groups
    if target.shape != (at.size, k):
        raise StrataInputError(
            f"curriculum targets have shape {target.shape}, expected ({at.size}, {k})",
            fix="give one row of K cluster shares per checkpoint",
        )
    totals, s = prefix_totals(schedule.clusters, schedule.position, at)
    realized = totals / s[:, None]
    err = realized - target
    rows: list[Row] = []
    for p, tp in enumerate(at):
        rows.append((strategy, "curriculum_max_error", f"t={tp}", float(np.abs(err[p]).max())))
        rows.append((strategy, "curriculum_l2_error", f"t={tp}", float(np.linalg.norm(err[p]))))
        rows += [(strategy, "curriculum_realized_share", f"t={tp};cluster={j}", float(v)) for j, v in enumerate(realized[p])]
        rows += [(strategy, "curriculum_target_share", f"t={tp};cluster={j}", float(v)) for j, v in enumerate(target[p])]
    return rows


def ordering_diagnostics(
    strategy: str,
    schedule: Schedule,
    *,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    n_points: int = 64,
    curriculum: tuple[np.ndarray, np.ndarray] | None = None,
    window_batch: int | None = None,
    window_shuffles: int = W.SHUFFLES,
    seed: int = 0,
    window_band_cache: Path | None = None,
) -> pl.DataFrame:
    """All ordering metrics of one strategy as tidy rows (``curriculum`` = (at, target_share)).

    With ``window_batch``, also Don't Shuffle, Optimize's objective over every window ``[a:b]``:
    the worst window of every length ``window_batch * 2**i`` and random's band over
    ``window_shuffles`` shuffles drawn from ``seed`` (:func:`pipeline.reports.windows.window_rows`;
    ``window_band_cache``: a ``.npy`` the band is read from, or written to)."""
    rows = diversity_rows(strategy, schedule)
    rows += batch_rows(strategy, schedule, batch_sizes)
    rows += prefix_rows(strategy, schedule, n_points)
    rows += drift_rows(strategy, schedule)
    if curriculum is not None:
        rows += curriculum_rows(strategy, schedule, *curriculum)
    if window_batch is not None:
        band, _ = W.cached_band(schedule, window_batch, window_shuffles, seed, window_band_cache)
        rows += W.window_rows(strategy, schedule, window_batch, n_random=window_shuffles, seed=seed, band=band)
    return rows_frame(rows)


def corpus_diagnostics(
    doc_cluster: np.ndarray,
    doc_length: np.ndarray,
    *,
    embeddings: np.ndarray | None = None,
    labels: np.ndarray | None = None,
    n_clusters: int | None = None,
    sample_size: int = 5000,
    seed: int = 0,
    strategy: str = "corpus",
) -> pl.DataFrame:
    """Corpus-side rows: cluster sizes (documents, tokens), cosine silhouette on a seeded sample of
    ``embeddings``, and ARI / NMI of clusters against ``labels`` (e.g. source domains) when given.

    The silhouette row is left out when the sample holds fewer than two clusters.
    """
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score, silhouette_score

    cl = np.asarray(doc_cluster, dtype=np.int64)
    k = int(cl.max()) + 1 if n_clusters is None else int(n_clusters)
    docs = np.bincount(cl, minlength=k)
    toks = np.bincount(cl, weights=np.asarray(doc_length, dtype=np.float64), minlength=k)
    rows: list[Row] = [(strategy, "cluster_docs", f"cluster={j}", float(v)) for j, v in enumerate(docs)]
    rows += [(strategy, "cluster_tokens", f"cluster={j}", float(v)) for j, v in enumerate(toks)]
    rows += [
        (strategy, "clusters_nonempty", "", float((docs > 0).sum())),
        (strategy, "cluster_docs_min", "", float(docs.min())),
        (strategy, "cluster_docs_max", "", float(docs.max())),
        (strategy, "cluster_token_share_max", "", float(toks.max() / toks.sum())),
    ]
    if embeddings is not None:
        x = embeddings if hasattr(embeddings, "shape") else np.asarray(embeddings)  # the sharded matrix: only the sample is read
        if len(x) != cl.size:
            raise StrataInputError("embeddings and doc_cluster differ in rows", fix="pass one embedding per doc_id")
        rng = np.random.default_rng(seed)
        idx = np.sort(rng.choice(cl.size, size=min(sample_size, cl.size), replace=False))
        if np.unique(cl[idx]).size >= 2:
            sil = silhouette_score(np.asarray(x[idx], dtype=np.float32), cl[idx], metric="cosine")
            rows.append((strategy, "silhouette_cosine", f"sample={idx.size};seed={seed}", float(sil)))
    if labels is not None:
        lab = np.asarray(labels)
        if lab.shape[0] != cl.size:
            raise StrataInputError("labels and doc_cluster differ in length", fix="pass one label per doc_id")
        rows.append((strategy, "ari_vs_labels", "", float(adjusted_rand_score(lab, cl))))
        rows.append((strategy, "nmi_vs_labels", "", float(normalized_mutual_info_score(lab, cl))))
    return rows_frame(rows)
