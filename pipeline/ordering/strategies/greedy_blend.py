"""``greedy_blend``: a blend of named groups (sources, or any documents column) realized over the
corpus and ordered by the greedy against its stages (``pipeline/ordering/blend.py``, docs/mixture.md).

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
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.ordering.blend import (
    GROUP_FAMILY,
    BudgetFit,
    FrozenPlan,
    blend_accounting,
    blend_objective,
    blend_order,
    document_groups,
    document_plan,
    document_uses,
    frozen_document_uses,
    group_tokens,
    piece_caps,
    planned_after,
    planned_counts,
    row_caps,
    stage_l1,
)
from pipeline.ordering.doc_arrays import document_arrays
from pipeline.ordering.engine import Inputs, OrderingResult, order_frame
from pipeline.ordering.schedule import accounting as cluster_accounting
from pipeline.ordering.schedule import cluster_tokens
from pipeline.ordering.stage import load_parts_plan, ordering_documents
from pipeline.ordering.strategies import StrategySpec
from pipeline.ordering.strategies.greedy import GREEDY
from pipeline.packing import frozen
from pipeline.stage import CheckFact, Markdown
from pipeline.storage.atomic import write_parquet
from pipeline.storage.layout import Store

BLEND_KEYS = ("mixture", "mixture_budget_tokens", "max_sequence_copies", "mixture_tolerance")
STAGES_CHECK, USES_CHECK, BUDGET_CHECK = "schedule_realizes_mixture", "schedule_within_caps", "schedule_meets_budget"
BUDGET_SCHEMA = {"asked_tokens": pl.Int64, "allowed_tokens": pl.Int64, "scheduled_tokens": pl.Int64, "corpus_tokens": pl.Int64,
                 "binding_group": pl.String, "on_infeasible": pl.String}


def _need_blend(params):
    if params.blend is None:
        raise StrataInputError("greedy_blend needs a blend",
                               fix="set mixture.weights (e.g. {web: 0.5, code: 0.3, books: 0.2}) or mixture.stages, "
                                   "over the documents column mixture.column (default source)")
    return params.blend


def _groups(inp):
    """(features, (rows x groups) tokens, group names) of the inputs' packing."""
    f = inp.features()
    doc_group, names = inp.blend_groups
    seg_rows = np.searchsorted(f.sequence_ids, inp.segments["sequence_id"].to_numpy())
    doc = inp.segments["doc_id"].to_numpy()
    groups = group_tokens(seg_rows, doc_group[doc], inp.segments["n_tokens"].to_numpy().astype(np.float64), f.n_sequences, len(names))
    return f, groups, names


def _schedule(inp):
    """(features, group tokens, names, planned copies, stage weights, ``BudgetFit``) of the inputs' packing."""
    p = inp.params
    blend = _need_blend(p)
    f, groups, names = _groups(inp)
    budget = p.mixture_budget_tokens or float(f.lengths.sum())
    counts, weights, fit = planned_counts(f, groups, blend, names, budget, p.max_sequence_copies, inp.seed)
    return f, groups, names, counts, weights, fit


def _frozen_schedule(inp, prefix: np.ndarray):
    """(features, group tokens, names, ``FrozenPlan``) of a blend continuing the frozen ``prefix``
    (sequence ids, repeating): ``pipeline.ordering.blend.planned_after``."""
    p = inp.params
    blend = _need_blend(p)
    f, groups, names = _groups(inp)
    rows = np.searchsorted(f.sequence_ids, prefix)
    if prefix.size and (rows.max() >= f.n_sequences or not np.array_equal(f.sequence_ids[np.minimum(rows, f.n_sequences - 1)], prefix)):
        raise StrataInputError("a frozen sequence is missing from the packing",
                               fix="re-materialize sequences (it keeps the frozen sequences)")
    budget = p.mixture_budget_tokens or float(f.lengths.sum())
    return f, groups, names, planned_after(f, groups, blend, names, budget, p.max_sequence_copies, inp.seed, rows)


def run_after(inp, prefix: np.ndarray):
    """The frozen ``prefix`` (its sequence ids, as consumed), then the blend's plan after it
    (``_frozen_schedule``) in greedy order against the stages' targets counted from the prefix's end."""
    f, groups, _, plan = _frozen_schedule(inp, np.asarray(prefix, dtype=np.int64))
    p = inp.params
    after = np.zeros(0, dtype=np.int64)
    if plan.suffix.sum():
        after = blend_order(f, groups, plan.suffix, plan.weights, p.blend.ends, p.objective_weights(), max(2, p.greedy_block), p.noise,
                            inp.seed, prefix_tokens=plan.prefix_tokens)
    return OrderingResult(order_frame(np.concatenate([np.asarray(prefix, dtype=np.int64), f.sequence_ids[after]])), None, "blocked")


def run(inp):
    """The blend's schedule (sequence ids, repeating) in greedy order."""
    f, groups, _, counts, weights, _ = _schedule(inp)
    p = inp.params
    rows = blend_order(f, groups, counts, weights, p.blend.ends, p.objective_weights(), max(2, p.greedy_block), p.noise, inp.seed)
    return OrderingResult(order_frame(f.sequence_ids[rows]), None, "blocked")


def run_part(features, params, seed: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """greedy_blend on one part of a partitioned ordering, whose parts make the stream batch by batch
    (each holds the whole blend, stage after stage): the part's own plan (step 1) at its share of
    the budget (a set ``mixture_budget_tokens`` times the part's share of the corpus's tokens; 0:
    the part's own tokens) ordered against the stages (step 2). The deal balances the blend's groups
    first (:func:`part_objective`), so every part holds the corpus's group tokens to within a
    sequence or two and its plan is the corpus's at its share. ``features.columns[GROUP_FAMILY]``:
    the rows' group tokens; ``params.blend.groups``: the groups' names. Returns the rows in order
    and the plan (``copies`` per row, the ``BudgetFit``'s figures) the accounting checks the order
    against."""
    p = params
    blend = _need_blend(p)
    groups, names = features.columns[GROUP_FAMILY], list(blend.groups)
    tokens = float(features.lengths.sum())
    budget = p.mixture_budget_tokens * tokens / float(features.cluster_bin_tokens.sum()) if p.mixture_budget_tokens else tokens
    counts, weights, fit = planned_counts(features, groups, blend, names, budget, p.max_sequence_copies, seed)
    rows = blend_order(features, groups, counts, weights, blend.ends, p.objective_weights(), max(2, p.greedy_block), p.noise, seed)
    return rows, {"copies": counts, "asked": np.float64(fit.asked), "allowed": np.float64(fit.allowed),
                  "corpus": np.float64(fit.corpus), "binding": np.array(fit.binding)}


def part_objective(params):
    """What the deal balances for greedy_blend's parts: the blend's groups first (``blend_objective``)."""
    return blend_objective(params.objective_weights())


def parts_fit(plans: list[dict[str, np.ndarray]]) -> BudgetFit:
    """The schedule's fit from its parts' (:func:`run_part`): the sizes summed; the binding group the
    one binding the most parts ("" when none binds)."""
    bound = [str(q["binding"]) for q in plans if str(q["binding"])]
    return BudgetFit(sum(float(q["asked"]) for q in plans), sum(float(q["allowed"]) for q in plans),
                     max(sorted(set(bound)), key=bound.count) if bound else "", sum(float(q["corpus"]) for q in plans))


def accounting(layout, params, strategy: str, tolerance: float, seed: int):
    """Writes and checks the blend's accounting of the written order: per stage and group the
    target and realized shares (``<strategy>.blend.parquet``, DuckDB-bound), per document piece its
    planned and realized uses (``<strategy>.uses.parquet``), and per cluster the schedule's
    tokens (``<strategy>.mixture.parquet``, the clusters' target being their share of the
    schedule). Planned uses are the solver's copies solved again from the same inputs; for an order
    made in parts, the parts' own plans as their workers wrote them (``run_part``).

    Under ``freeze_prefix`` the uses are split into the frozen prefix's (the record's positions)
    and the rest's (the plan after it, ``_frozen_schedule``), each piece carries its cap, and
    ``<strategy>.plan.parquet`` (DuckDB ``blend_document_plan``) holds per document its token uses
    against the plan it replaced: a document that plan used and this one does not is ``dropped``."""
    blend = _need_blend(params)
    written = Store(layout).ordering(strategy)
    docs, seg, codes, names, inp = _accounting_inputs(layout, params, strategy, blend, seed)
    doc_id = docs["doc_id"].to_numpy()
    rec, plan, f, seq_groups, planned_by_id, weights, fit = _plan_of_order(layout, params, strategy, blend, names, inp, seed)
    n_prefix = rec.sequences if rec is not None else 0
    n_seq = seq_groups.shape[0]
    table = blend_accounting(written.order, seq_groups, weights, blend.ends, names, blend.caps(names, "max_repetition", 1.0),
                             blend.caps(names, "max_fraction", 1.0), frozen=n_prefix)
    doc_groups = dict(zip(doc_id.tolist(), [names[c] for c in codes]))
    caps = piece_caps(blend, names, params.max_sequence_copies)
    uses = (document_uses(seg, doc_groups, planned_by_id, written.order, caps) if plan is None else
            frozen_document_uses(seg, doc_groups, plan, f.sequence_ids, written.order, n_prefix, caps))
    clusters = _cluster_accounting(written, docs, doc_id, inp.cluster.size)
    outs = [write_parquet(table, layout.inside("orderings", f"{strategy}.blend.parquet")),
            write_parquet(uses, layout.inside("orderings", f"{strategy}.uses.parquet")),
            write_parquet(clusters, layout.ordering_mixture(strategy))]
    tables = {}
    if plan is not None:
        plan_path = layout.inside("orderings", f"{strategy}.plan.parquet")
        previous = pl.read_parquet(plan_path) if plan_path.exists() else None  # the plan this order replaces
        outs.append(write_parquet(document_plan(uses, frozen.doc_keys(layout), previous), plan_path))
        tables["blend_document_plan"] = pl.read_parquet(plan_path)
    back, back_uses = pl.read_parquet(outs[0]), pl.read_parquet(outs[1])
    problems = _accounting_problems(written.order, rec, plan is not None, n_prefix, table, uses, back, back_uses, planned_by_id,
                                    n_seq, params.max_sequence_copies)
    dropped = tables["blend_document_plan"].filter(pl.col("status") == "dropped") if plan is not None else None
    worst, checks, meta = _accounting_checks(strategy, blend, back, written.order, n_prefix, dropped, problems, tolerance)
    budget, check = _budget(blend, fit, int(back.filter(pl.col("stage") == 0)["scheduled_tokens"].sum()), meta)
    tables = {"blend_stages": back, "blend_document_uses": back_uses, "blend_budget": budget, **tables}
    return outs, [*checks, check], {"l1_to_target": worst, **meta, "tables": tables}


def _accounting_inputs(layout, params, strategy: str, blend, seed: int):
    """What the accounting solves the plan again from, as the order was made: the ordering's
    documents, the base packing's segments, each document's group (codes into the blend's group
    names) and the engine's ``Inputs``."""

    docs = ordering_documents(layout, params, strategy)
    seg = pl.read_parquet(layout.segments, columns=["sequence_id", "doc_id", "n_tokens"])
    doc_id = docs["doc_id"].to_numpy()
    cluster, length = document_arrays(doc_id, docs["cluster"].to_numpy(), docs["n_tokens"].to_numpy())
    codes, names = document_groups(docs, blend)
    by_doc = np.full(cluster.size, -1, dtype=np.int64)
    by_doc[doc_id] = codes
    inp = Inputs(cluster, length, np.flatnonzero(cluster >= 0), None, seg, Store(layout).sequences.seq_len, params, seed, {},
                 (by_doc, names))
    return docs, seg, codes, names, inp


def _plan_of_order(layout, params, strategy: str, blend, names, inp, seed: int):
    """``(frozen record, frozen plan, features, group tokens and planned copies by sequence id,
    weights, fit)`` of the plan the written order realized: the parts' own plans when it was made
    in parts (``load_parts_plan``; the features None), else the one plan solved again (:func:`_replanned`)."""
    parts = load_parts_plan(layout, strategy)
    if parts is None:
        rec, plan, f, groups, planned, weights, fit = _replanned(layout, params, strategy, blend, names, inp, seed)
        return (rec, plan, f, *_by_sequence_id(f, groups, len(names), planned), weights, fit)
    if Store(layout).sequences.freeze_prefix:
        raise StrataInputError("greedy_blend ordered in parts does not freeze a prefix",
                               fix="set freeze_prefix: 0, or order_part_bytes: 0 (one part orders the blend)")
    seg, by_doc = inp.segments, inp.blend_groups[0]
    sid = seg["sequence_id"].to_numpy()
    seq_groups = np.zeros((int(sid.max()) + 1, len(names)))
    np.add.at(seq_groups, (sid, by_doc[seg["doc_id"].to_numpy()]), seg["n_tokens"].to_numpy().astype(np.float64))
    planned_by_id = np.zeros(seq_groups.shape[0], dtype=np.int64)
    planned_by_id[parts["sequence_ids"]] = parts["copies"]
    plans = [{k: parts[k][i] for k in ("asked", "allowed", "corpus", "binding")} for i in range(parts["asked"].size)]
    return None, None, None, seq_groups, planned_by_id, blend.matrix(names), parts_fit(plans)


def _replanned(layout, params, strategy: str, blend, names, inp, seed: int):
    """The plan the order realized, solved again: ``(frozen record, frozen plan, features, group
    tokens, planned copies, weights)``. After a frozen prefix it is the plan that continued it;
    under ``freeze_prefix`` without a record yet, the whole plan split with an empty prefix; the
    record and frozen plan are None otherwise."""

    n_frozen = Store(layout).sequences.freeze_prefix
    rec = frozen.load(layout, strategy) if n_frozen else None
    plan = None
    if rec is not None:  # the order continued this frozen prefix (the record is replaced after these checks)
        f, groups, _, plan = _frozen_schedule(inp, rec.sequence_ids)
        planned, weights, fit = plan.prefix + plan.suffix, plan.weights, plan.fit
    else:
        f, groups, _, planned, weights, fit = _schedule(inp)
        if n_frozen:  # frozen from this order on: the split, with an empty prefix
            caps = row_caps(f, groups, blend.caps(names, "max_repetition", 1.0), blend.caps(names, "max_fraction", 1.0),
                            params.max_sequence_copies, seed)
            plan = FrozenPlan(np.zeros_like(planned), planned, caps, weights, 0.0, fit)
    return rec, plan, f, groups, planned, weights, fit


def _by_sequence_id(f, groups, n_groups: int, planned: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each group's tokens per sequence (a dense ``(sequence ids x groups)`` matrix) and the planned
    copies per sequence id, indexed by the packing's sequence ids rather than the features' rows."""
    dense = np.zeros((f.n_sequences, n_groups))
    rows = np.repeat(np.arange(groups.n_rows), np.diff(groups.indptr))
    dense[rows, groups.indices] = groups.data
    n_seq = int(f.sequence_ids.max()) + 1
    seq_groups = np.zeros((n_seq, n_groups))
    seq_groups[f.sequence_ids] = dense
    planned_by_id = np.zeros(n_seq, dtype=np.int64)
    planned_by_id[f.sequence_ids] = planned
    return seq_groups, planned_by_id


def _cluster_accounting(written, docs, doc_id: np.ndarray, n_docs: int):
    """The schedule's tokens per cluster, each cluster's target being its own share of the
    schedule (a blend targets groups, not clusters): the mixture accounting every schedule writes."""

    doc_cluster = np.zeros(n_docs, dtype=np.int64)
    doc_cluster[doc_id] = docs["cluster"].to_numpy()
    pieces = cluster_tokens(written.segments, doc_cluster)
    realized = cluster_accounting(written.order, pieces, np.zeros(int(docs["cluster"].max()) + 1))
    share = realized["realized_share"].to_numpy()
    return cluster_accounting(written.order, pieces, share)


def _accounting_problems(order: np.ndarray, rec, frozen_plan: bool, n_prefix: int, table, uses, back, back_uses,
                         planned: np.ndarray, n_seq: int, max_copies: int) -> list[str]:
    """What the written order and accounting (``back``, ``back_uses``, read back) break: the frozen
    prefix not kept or a piece beyond its cap, files that differ from what was computed, pieces
    used other than planned, positions or sequences outside the plan, too many copies, a group over
    its ``max_fraction``. Empty when the order realizes its plan."""
    problems = []
    if frozen_plan and n_prefix and not np.array_equal(order[:n_prefix], rec.sequence_ids):
        problems.append(f"the order does not start with its frozen prefix of {n_prefix} positions")
    over = back_uses.filter(pl.col("realized_uses") > pl.col("cap"))  # per piece: its own group's cap
    if over.height:
        problems.append(f"{over.height} document pieces ({int(over['n_tokens'].sum()):,} tokens) used beyond their own group's cap, "
                        f"e.g. doc {over['doc_id'][0]} ({over['group'][0]}): {over['realized_uses'][0]} uses > cap {over['cap'][0]}"
                        + (f" ({over['prefix_realized'][0]} in the frozen prefix)" if frozen_plan else ""))
    if not back.equals(table) or not back_uses.equals(uses):
        problems.append("the written accounting differs from the order's")
    differ = back_uses.filter(pl.col("planned_uses") != pl.col("realized_uses"))
    if differ.height:
        problems.append(f"{differ.height} document pieces used other than planned, e.g. doc {differ['doc_id'][0]}: "
                        f"planned {differ['planned_uses'][0]}, realized {differ['realized_uses'][0]}")
    if int(order.size) != int(planned.sum()):
        problems.append(f"the order holds {order.size} positions, the plan {int(planned.sum())}")
    if order.size and (order.min() < 0 or order.max() >= n_seq):
        problems.append("the order names sequences outside the packing")
    copies = int(np.bincount(order).max()) if order.size else 0
    if copies > max_copies:
        problems.append(f"a sequence appears {copies} times > max_sequence_copies={max_copies}")
    per_group = back.filter(pl.col("stage") == 0)
    over = per_group.filter(pl.col("distinct_fraction") > pl.col("max_fraction") + 1e-9)
    if over.height:
        problems.append(f"groups {over['group'].to_list()} use more of their distinct tokens than mixture.max_fraction")
    return problems


def _accounting_checks(strategy: str, blend, back, order: np.ndarray, n_prefix: int, dropped, problems: list[str],
                       tolerance: float):
    """``(worst stage L1, [uses check, stages check], metadata)``: the uses check fails on any of
    ``problems``; the stages check warns when a stage's group shares are further than
    ``tolerance`` (L1) from the blend. ``dropped``: the documents the replaced plan used and this
    one does not (None without a frozen plan)."""

    # after a frozen prefix, the stages the rest reaches (a stage inside the prefix was realized under its own mix)
    l1 = stage_l1(back.filter(pl.col("realized_tokens").sum().over("stage") > 0) if n_prefix else back)
    worst = max(l1.values(), default=0.0)
    meta = {"strategy": strategy, "column": blend.column, "stages": len(blend.ends), "l1_per_stage": {str(k): v for k, v in l1.items()},
            "tolerance": tolerance, "positions": int(order.size), "repeated_positions": int(order.size - np.unique(order).size),
            "per_stage": Markdown(back.select("stage", "group", "target_share", "realized_share", "repetition", "distinct_fraction")
                                  .to_pandas().to_markdown(index=False)),
            **({"frozen_positions": n_prefix, "documents_dropped": dropped.height} if dropped is not None else {})}
    kept = ("every document piece used as planned (DuckDB blend_document_uses), at most its own group's cap; within "
            "max_sequence_copies and mixture.max_fraction"
            + ("" if dropped is None else f"; frozen prefix of {n_prefix} positions kept"
               + (f"; {dropped.height} documents the replaced plan used are planned 0 times now (blend_document_plan "
                  "status dropped)" if dropped.height else "")))
    checks = [
        CheckFact(USES_CHECK, not problems, meta, "; ".join(problems) or kept),
        CheckFact(STAGES_CHECK, worst <= tolerance, meta, warn=True,
                  description=(f"every stage's group shares within L1 {worst:.4f} of the blend (tolerance {tolerance})"
                               if worst <= tolerance else
                               f"stages {[k for k, v in l1.items() if v > tolerance]} (of {len(blend.ends)}, from 0) miss their weights: "
                               f"L1 {worst:.4f} > {tolerance} from the blend: raise "
                               "mixture.max_repetition or max_sequence_copies, lower mixture_budget_tokens, or accept it "
                               "(mixture_tolerance)")),
    ]
    return worst, checks, meta


def _budget(blend, fit, scheduled: int, meta: dict) -> tuple[pl.DataFrame, CheckFact]:
    """The schedule's size against the budget asked (DuckDB ``blend_budget``, one row; the keys
    ``budget_*`` of ``meta``) and the check ``schedule_meets_budget``, which warns, naming the
    binding group and the share of the corpus used, when the caps cut the schedule."""
    row = {"asked_tokens": int(round(fit.asked)), "allowed_tokens": int(fit.allowed), "scheduled_tokens": scheduled,
           "corpus_tokens": int(fit.corpus), "binding_group": fit.binding or None, "on_infeasible": blend.on_infeasible}
    meta.update({"budget_asked_tokens": row["asked_tokens"], "budget_allowed_tokens": row["allowed_tokens"],
                 "budget_binding_group": fit.binding or "none", "scheduled_tokens": scheduled,
                 "scheduled_share_of_corpus": scheduled / max(fit.corpus, 1.0)})
    text = (f"{fit.warning(blend)}; scheduled {scheduled:,} tokens. Fix: raise mixture.max_repetition of {fit.binding!r} "
            "(or max_sequence_copies), lower its weight or mixture_budget_tokens, or set mixture.on_infeasible: error"
            if fit.binding else f"the schedule holds the {scheduled:,} tokens asked (within one sequence): no cap binds")
    return pl.DataFrame([row], schema=BUDGET_SCHEMA), CheckFact(BUDGET_CHECK, not fit.binding, meta, text, warn=True)


SPECS = (
    StrategySpec("greedy_blend", "sequence",
                 "a blend of groups of a documents column (mixture.column, default source: mixture.weights or mixture.stages, "
                 "max_repetition, max_fraction) realized over the corpus and ordered by the greedy against its stages, the "
                 "clusters and length bins held at their share",
                 seed_free=False, reads=(*GREEDY, *BLEND_KEYS), greedy_based=True, run=run, accounting=accounting,
                 run_after=run_after, part_order=run_part, part_layout="batches", part_objective=part_objective),
)
