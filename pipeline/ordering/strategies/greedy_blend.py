"""``greedy_blend``: a blend of named groups (sources, or any documents column) realized over the
corpus and ordered by the greedy against its stages (``pipeline/mixture/blend.py``, docs/mixture.md).

The schedule repeats or leaves out sequences of the base packing so that each stage's tokens hold
the blend's weights over ``mixture.column`` (``mixture.weights`` or ``mixture.stages``) within
``mixture.max_repetition`` / ``mixture.max_fraction``; the blocked curriculum greedy orders it
against the blend's cumulative targets while the clusters, length bins and kind of sequence stay
at their share of the schedule. Its accounting (``orderings/<strategy>.blend.parquet``,
``<strategy>.uses.parquet``; DuckDB ``blend_stages``, ``blend_document_uses``) is written and
checked by the orderings stage.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import StrataInputError
from pipeline.ordering.strategies import StrategySpec
from pipeline.ordering.strategies.greedy import GREEDY

BLEND_KEYS = ("mixture", "mixture_budget_tokens", "max_sequence_copies", "mixture_tolerance")
STAGES_CHECK, USES_CHECK = "schedule_realizes_mixture", "schedule_within_caps"


def _need_blend(params):
    if params.blend is None:
        raise StrataInputError("greedy_blend needs a blend",
                               fix="set mixture.weights (e.g. {web: 0.5, code: 0.3, books: 0.2}) or mixture.stages, "
                                   "over the documents column mixture.column (default source)")
    return params.blend


def _schedule(inp):
    """(features, group tokens, names, planned copies, stage weights) of the inputs' packing."""
    from pipeline.mixture.blend import group_tokens, planned_counts

    p = inp.params
    blend = _need_blend(p)
    f = inp.features()
    doc_group, names = inp.blend_groups
    seg_rows = np.searchsorted(f.sequence_ids, inp.segments["sequence_id"].to_numpy())
    doc = inp.segments["doc_id"].to_numpy()
    groups = group_tokens(seg_rows, doc_group[doc], inp.segments["n_tokens"].to_numpy().astype(np.float64), f.n_sequences, len(names))
    budget = p.mixture_budget_tokens or float(f.lengths.sum())
    counts, weights = planned_counts(f, groups, blend, names, budget, p.max_sequence_copies, inp.seed)
    return f, groups, names, counts, weights


def run(inp):
    """The blend's schedule (sequence ids, repeating) in greedy order."""
    from pipeline.mixture.blend import blend_order
    from pipeline.ordering.engine import OrderingResult, order_frame

    f, groups, _, counts, weights = _schedule(inp)
    p = inp.params
    rows = blend_order(f, groups, counts, weights, p.blend.ends, p.objective_weights(), max(2, p.greedy_block), p.noise, inp.seed)
    return OrderingResult(order_frame(f.sequence_ids[rows]), None, "blocked")


def accounting(layout, params, strategy: str, tolerance: float, seed: int):
    """Writes and checks the blend's accounting of the written order: per stage and group the
    target and realized shares (``<strategy>.blend.parquet``, DuckDB-bound), per document piece its
    planned and realized uses (``<strategy>.uses.parquet``), and per cluster the schedule's
    tokens (``<strategy>.mixture.parquet``, the clusters' target being their share of the
    schedule). Planned uses are the solver's copies solved again from the same inputs."""
    import polars as pl

    from pipeline.mixture.blend import blend_accounting, document_groups, document_uses, stage_l1
    from pipeline.mixture.schedule import accounting as cluster_accounting
    from pipeline.mixture.schedule import cluster_tokens
    from pipeline.ordering.doc_arrays import document_arrays
    from pipeline.ordering.engine import Inputs
    from pipeline.ordering.stage import ordering_documents
    from pipeline.stage import CheckFact, Markdown
    from pipeline.storage.atomic import write_parquet
    from pipeline.storage.layout import Store

    blend = _need_blend(params)
    written = Store(layout).ordering(strategy)
    docs = ordering_documents(layout, params, strategy)
    seg = pl.read_parquet(layout.segments, columns=["sequence_id", "doc_id", "n_tokens"])
    doc_id = docs["doc_id"].to_numpy()
    cluster, length = document_arrays(doc_id, docs["cluster"].to_numpy(), docs["n_tokens"].to_numpy())
    codes, names = document_groups(docs, blend)
    by_doc = np.full(cluster.size, -1, dtype=np.int64)
    by_doc[doc_id] = codes
    inp = Inputs(cluster, length, np.flatnonzero(cluster >= 0), None, seg, Store(layout).sequences.seq_len, params, seed, {},
                 (by_doc, names))
    f, groups, _, planned, weights = _schedule(inp)
    dense = np.zeros((f.n_sequences, len(names)))
    rows = np.repeat(np.arange(groups.n_rows), np.diff(groups.indptr))
    dense[rows, groups.indices] = groups.data
    n_seq = int(f.sequence_ids.max()) + 1
    seq_groups = np.zeros((n_seq, len(names)))
    seq_groups[f.sequence_ids] = dense
    planned_by_id = np.zeros(n_seq, dtype=np.int64)
    planned_by_id[f.sequence_ids] = planned
    table = blend_accounting(written.order, seq_groups, weights, blend.ends, names, blend.caps(names, "max_repetition", 1.0),
                             blend.caps(names, "max_fraction", 1.0))
    uses = document_uses(seg, dict(zip(doc_id.tolist(), [names[c] for c in codes])), planned_by_id, written.order)
    doc_cluster = np.zeros(cluster.size, dtype=np.int64)
    doc_cluster[doc_id] = docs["cluster"].to_numpy()
    pieces = cluster_tokens(written.segments, doc_cluster)
    realized = cluster_accounting(written.order, pieces, np.zeros(int(docs["cluster"].max()) + 1))
    share = realized["realized_share"].to_numpy()
    clusters = cluster_accounting(written.order, pieces, share)
    outs = [write_parquet(table, layout.inside("orderings", f"{strategy}.blend.parquet")),
            write_parquet(uses, layout.inside("orderings", f"{strategy}.uses.parquet")),
            write_parquet(clusters, layout.ordering_mixture(strategy))]
    back, back_uses = pl.read_parquet(outs[0]), pl.read_parquet(outs[1])
    problems = []
    if not back.equals(table) or not back_uses.equals(uses):
        problems.append("the written accounting differs from the order's")
    differ = back_uses.filter(pl.col("planned_uses") != pl.col("realized_uses"))
    if differ.height:
        problems.append(f"{differ.height} document pieces used other than planned, e.g. doc {differ['doc_id'][0]}: "
                        f"planned {differ['planned_uses'][0]}, realized {differ['realized_uses'][0]}")
    if int(written.order.size) != int(planned.sum()):
        problems.append(f"the order holds {written.order.size} positions, the plan {int(planned.sum())}")
    if written.order.size and (written.order.min() < 0 or written.order.max() >= n_seq):
        problems.append("the order names sequences outside the packing")
    copies = int(np.bincount(written.order).max()) if written.order.size else 0
    if copies > params.max_sequence_copies:
        problems.append(f"a sequence appears {copies} times > max_sequence_copies={params.max_sequence_copies}")
    per_group = back.filter(pl.col("stage") == 0)
    over = per_group.filter(pl.col("distinct_fraction") > pl.col("max_fraction") + 1e-9)
    if over.height:
        problems.append(f"groups {over['group'].to_list()} use more of their distinct tokens than mixture.max_fraction")
    l1 = stage_l1(back)
    worst = max(l1.values())
    meta = {"strategy": strategy, "column": blend.column, "stages": len(blend.ends), "l1_per_stage": {str(k): v for k, v in l1.items()},
            "tolerance": tolerance, "positions": int(written.order.size), "repeated_positions": int(written.order.size
                                                                                                  - np.unique(written.order).size),
            "per_stage": Markdown(back.select("stage", "group", "target_share", "realized_share", "repetition", "distinct_fraction")
                                  .to_pandas().to_markdown(index=False))}
    checks = [
        CheckFact(USES_CHECK, not problems, meta, "; ".join(problems) or
                  "every document piece used as planned (DuckDB blend_document_uses); within max_sequence_copies and mixture.max_fraction"),
        CheckFact(STAGES_CHECK, worst <= tolerance, meta, warn=True,
                  description=(f"every stage's group shares within L1 {worst:.4f} of the blend (tolerance {tolerance})"
                               if worst <= tolerance else
                               f"a stage's group shares are L1 {worst:.4f} > {tolerance} from the blend: raise "
                               "mixture.max_repetition or max_sequence_copies, lower mixture_budget_tokens, or accept it "
                               "(mixture_tolerance)")),
    ]
    return outs, checks, {"l1_to_target": worst, **meta, "tables": {"blend_stages": back, "blend_document_uses": back_uses}}


SPECS = (
    StrategySpec("greedy_blend", "sequence",
                 "a blend of groups of a documents column (mixture.column, default source: mixture.weights or mixture.stages, "
                 "max_repetition, max_fraction) realized over the corpus and ordered by the greedy against its stages, the "
                 "clusters and length bins held at their share",
                 seed_free=False, reads=(*GREEDY, *BLEND_KEYS), greedy_based=True, run=run, accounting=accounting),
)
