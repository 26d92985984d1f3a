"""The ordering stage: one strategy's order of the packed sequences (``orderings``), and the order
a training seed trains on (:func:`seeded_ordering`).

:func:`order_strategy` writes ``orderings/<strategy>.parquet`` (a repacking's segments beside it;
a schedule's accounting; a frozen prefix's record) and returns the checks' facts. A strategy
derived from another's order (``greedy_block_shuffle`` from ``greedy``) reuses that order when its
lineage row shows it was made from the same sequences, parameters and seed (:func:`base_order`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import polars as pl

from pipeline.clean.removals import training_documents
from pipeline.data.tokenizer import load_tokenizer
from pipeline.data.tokens import open_tokens
from pipeline.errors import StrataInputError
from pipeline.ordering import strategies
from pipeline.ordering.blend_kept import check_groups_kept
from pipeline.ordering.composition import ordering_ids
from pipeline.ordering.engine import OrderingResult, OrderParams, order_frame, run_strategy, seed_dependent
from pipeline.ordering.frozen_boundary import boundary_summary
from pipeline.ordering.schedule import accounting, cluster_tokens, l1_distance, schedule_problems
from pipeline.packing import frozen
from pipeline.packing.pack import SequenceStore
from pipeline.segments import warm_kernels
from pipeline.stage import CheckFact, Connect, Markdown, StageParams, StageResult, setting
from pipeline.storage.atomic import atomic_path, file_sha256, write_parquet
from pipeline.storage.integrity import verify_ordering_inputs
from pipeline.storage.layout import Store
from pipeline.storage.lineage import newest_row
from pipeline.storage.warehouse import latest_data_version, replace_rows
from pipeline.threads import concurrently

PERMUTATION_CHECK, CAPS_CHECK, MIXTURE_CHECK = "ordering_is_permutation", "schedule_within_caps", "schedule_realizes_mixture"
BUDGET_CHECK = "schedule_meets_budget"  # a blend's schedule as large as the budget asked (warns where its caps cut it)


@dataclass(frozen=True)
class OrderStageParams(StageParams):
    """The ordering stage's settings (``orderings``, and the order a training seed trains on). The
    strategies' knobs are parameters through each spec's ``reads``, not all of them here."""

    order: OrderParams = setting(versioned=False, convert=OrderParams)
    seed: int = setting()
    mixture_enabled: bool = setting("mixture.enabled", versioned=False)  # greedy_curriculum takes the learned curriculum
    mixture_tolerance: float = setting(versioned=False)  # a schedule's check (greedy_mixture's reads)
    packing: str = setting(versioned=False)  # a frozen prefix's record (sequences' parameter)
    engine: str = setting(versioned=False)  # where a partitioned ordering's parts run: local (worker processes) | ray (tasks)
    ray: Any = setting(versioned=False)  # pipeline.config.RayConfig


def order_params(stage_params: OrderStageParams, layout) -> OrderParams:
    """The ordering knobs of ``stage_params``; greedy_mixture's weights default to the mixture stage's
    ``mixture/weights.parquet`` when ``mixture_weights_file`` is not set, and with the mixture
    stage on (``mixture.enabled``) greedy_curriculum's curriculum to its learned
    ``mixture/curriculum.yaml`` when ``curriculum`` is not set: one ``strata run`` learns and uses it."""
    params = stage_params.order
    if params.mixture_weights_file is None and layout.mixture_weights.exists():
        params = replace(params, mixture_weights_file=str(layout.mixture_weights))
    if params.curriculum is None and stage_params.mixture_enabled and layout.mixture_curriculum.exists():
        params = replace(params, curriculum=str(layout.mixture_curriculum))
    return params


def base_order(layout, connect: Connect, spec, params: OrderParams, seed: int, code_version: str) -> tuple[np.ndarray, str | None] | None:
    """The sequence ids of the materialized ordering ``spec.derived`` starts from (``greedy`` for
    ``greedy_block_shuffle``) and its greedy mode, when its newest lineage row shows it was made by
    this code version from the sequences materialized now, with the same parameters and seed and
    no frozen prefix, and its file is unchanged since (SHA-256); else None: run the strategy."""
    base = spec.derived[0]
    path = layout.ordering(base)
    with connect() as con:
        row = newest_row(con, "orderings", base)
        sequences = latest_data_version(con, "sequences")
    if row is None or not path.is_file() or not sequences:
        return None
    wanted = json.loads(json.dumps({"strategy": base, **params.recorded(), "seed": seed, "freeze_prefix": 0}, sort_keys=True, default=str))
    made_with = {k: v for k, v in row["parameters"].items() if k != "greedy_mode"}
    if row["code_version"] != code_version or row["input_versions"].get("sequences") != sequences or made_with != wanted:
        return None
    try:
        unchanged = row["outputs"].get(str(path)) == file_sha256(path)
    except StrataInputError:  # changed on disk since it was written: not a base to reuse (the strategy runs itself)
        return None
    return (Store(layout).ordering(base).order, row["parameters"].get("greedy_mode")) if unchanged else None


def schedule_checks(strategy: str, layout, params: OrderParams, tolerance: float, seed: int = 0) -> tuple[list, list[CheckFact], dict]:
    """For a strategy that realizes a mixture: its accounting written beside the order and both
    checks' facts (recomputed from the written files); (outputs, checks, metadata)."""
    spec = strategies.spec(strategy)
    path = layout.ordering_mixture(strategy)
    if spec.accounting is not None:  # a schedule with its own accounting (greedy_blend)
        return spec.accounting(layout, params, strategy, tolerance, seed)
    if not spec.realizes_mixture:
        if path.exists():
            path.unlink()
        skip = "not a schedule: the permutation check applies"
        return [], [CheckFact(c, True, {"strategy": strategy}, skip) for c in (CAPS_CHECK, MIXTURE_CHECK, BUDGET_CHECK)], {}
    written = Store(layout).ordering(strategy)
    docs = Store(layout).document_clusters([])
    doc_cluster = np.full(int(docs["doc_id"].max()) + 1, 0, dtype=np.int64)
    doc_cluster[docs["doc_id"].to_numpy()] = docs["cluster"].to_numpy()
    pieces = cluster_tokens(written.segments, doc_cluster)
    target = spec.mixture(params, int(docs["cluster"].max()) + 1)
    table = accounting(written.order, pieces, target)
    out = write_parquet(table, path)
    reread = pl.read_parquet(out)
    n_seq = int(written.segments["sequence_id"].max()) + 1
    problems = schedule_problems(written.order, n_seq, reread, params.max_sequence_copies)
    if not reread.equals(table):
        problems.append("the written accounting differs from the order's")
    l1 = l1_distance(reread)
    shown = reread.select("cluster", "target_share", "realized_share", "scheduled_tokens", "repeated_tokens", "omitted_tokens",
                          "max_copies")
    meta = {"strategy": strategy, "l1_to_target": l1, "tolerance": tolerance, "positions": int(written.order.size),
            "sequences": n_seq, "scheduled_tokens": int(reread["scheduled_tokens"].sum()),
            "omitted_tokens": int(reread["omitted_tokens"].sum()), "repeated_tokens": int(reread["repeated_tokens"].sum()),
            "budget_tokens": int(params.mixture_budget_tokens or reread["corpus_tokens"].sum()),
            "per_cluster": Markdown(shown.to_pandas().to_markdown(index=False))}
    checks = [
        CheckFact(CAPS_CHECK, not problems, meta,
                  "; ".join(problems) or f"every sequence at most {params.max_sequence_copies} times; every token accounted for"),
        CheckFact(MIXTURE_CHECK, l1 <= tolerance, meta, warn=True,
                  description=(f"realized shares within L1 {l1:.4f} of the mixture (tolerance {tolerance})" if l1 <= tolerance else
                               f"the corpus gives the mixture only within L1 {l1:.4f} > {tolerance}: raise max_sequence_copies, "
                               "lower mixture_budget_tokens, or accept it (mixture_tolerance)")),
        CheckFact(BUDGET_CHECK, True, meta, "not a blend: its budget is lowered to the mixture (see schedule_realizes_mixture)"),
    ]
    return [out], checks, meta


def ordering_documents(layout, params: OrderParams | None = None, strategy: str | None = None) -> pl.DataFrame:
    """Per-document doc_id, cluster, n_tokens as stream length incl. EOS, the documents columns
    ``params``' families name (e.g. source) and the ``corpus.parquet`` columns ``strategy`` reads
    (e.g. content_hash; other strategies never hold the 64-character hashes); without the documents
    the clean stage removed, content_hash equal within each duplicate group (docs/cleaning.md)."""
    extra = params.document_columns() if params is not None else []
    blend = params.blend.column if params is not None and params.blend is not None and strategy is not None \
        and "mixture" in strategies.spec(strategy).reads else None  # greedy_blend's column
    have = [*pl.read_parquet_schema(layout.documents), *Store(layout).quality_columns()]
    _check_named_columns(layout, have, [c for c in extra if c != "quality"], blend)  # quality: the engine names the quality stage
    docs = Store(layout).document_clusters(["n_tokens"] + [c for c in dict.fromkeys([*extra, *([blend] if blend else [])]) if c in have])
    corpus_cols = strategies.spec(strategy).documents if strategy is not None else ()
    if blend and blend not in have and blend in pl.read_parquet_schema(layout.corpus):
        corpus_cols = (*corpus_cols, blend)
    if corpus_cols:
        docs = docs.join(pl.read_parquet(layout.corpus, columns=["doc_id", *corpus_cols]), on="doc_id", how="left").sort("doc_id")

    return training_documents(layout, docs.with_columns(pl.col("n_tokens") + 1))


def _check_named_columns(layout, have: list[str], families: list[str], blend: str | None) -> None:
    """A documents column a family or ``mixture.column`` names that neither the documents table nor
    ``corpus.parquet`` holds stops here, listing the columns there are, the declared corpus columns
    (``corpus.columns``) among them."""
    corpus = list(pl.read_parquet_schema(layout.corpus)) if layout.corpus.is_file() else []
    options = sorted({*have, *corpus, "cluster"} - {"doc_id", "content_hash", "shard", "shard_row"})
    for key, name in [*(("families", f) for f in families), *([("mixture.column", blend)] if blend else [])]:
        if name not in have and name not in corpus:
            raise StrataInputError(f"{key} names {name!r}, which is no column of the documents", path=layout.documents,
                                   fix=f"use one of {options}; a field of your corpus records becomes a documents column when "
                                       f"corpus.columns declares it, e.g. corpus: {{columns: {{{name}: number}}}} "
                                       "(docs/mixture.md, \"Your corpus's own columns\")")


def ordering_inputs(layout, params: OrderParams | None = None, strategy: str | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """:func:`ordering_documents` and the base segments."""
    return ordering_documents(layout, params, strategy), pl.read_parquet(layout.segments)


def order_strategy(layout, stage_params: OrderStageParams, strategy: str, connect: Connect, code_version: str) -> StageResult:
    """Order the sequences with ``strategy``: ``orderings/<strategy>.parquet`` (position,
    sequence_id), a repacking's ``<strategy>.segments.parquet``, a schedule's accounting
    (``<strategy>.mixture.parquet``, DuckDB ``mixture_schedule``) and, under a frozen prefix, its
    record (``frozen/<strategy>.*``, DuckDB ``ordering_frozen_prefix``). A training-time strategy
    gets the packing of its spec's ``packing_from``. The checks: the order is a permutation of the
    sequences, or a schedule within its caps that realizes the mixture."""
    params = order_params(stage_params, layout)
    spec = strategies.spec(strategy)
    verify_ordering_inputs(layout)  # the packing, documents and clusters against their recorded SHA-256: corrupt bytes stop here
    seq_len = Store(layout).sequences.seq_len  # the base packing's: a repacking fills sequences as long
    n_frozen = Store(layout).sequences.freeze_prefix  # the packing's: sequences kept the frozen sequences
    previous = frozen.load(layout, strategy) if n_frozen else None
    prefix = previous.sequence_ids if previous is not None else None
    if params.blend is not None and "mixture" in spec.reads:
        check_groups_kept(layout, params.blend)  # a group the clean stage emptied is named as such
    result, base = _computed_order(layout, connect, spec, strategy, stage_params, params, code_version, seq_len, prefix, n_frozen)
    outputs = _write_order(layout, strategy, result)
    n_positions, greedy_mode, repacked = result.order.height, result.greedy_mode, result.segments is not None
    del result
    written = Store(layout).ordering(strategy)
    more, mixture_checks, mixture_meta = schedule_checks(strategy, layout, params, stage_params.mixture_tolerance, stage_params.seed)
    tables = mixture_meta.pop("tables", {})  # a schedule's own DuckDB tables (greedy_blend)
    outputs += more
    ok, check = _order_check(layout, connect, spec, strategy, written, tables)
    order = written.order
    boundary = {}
    if n_frozen and ok:
        outputs += freeze(layout, connect, strategy, order, written.segments, n_frozen, previous, seq_len, stage_params.packing)
        boundary = boundary_summary(layout, strategy) or {}
    summary = {k: v for k, v in mixture_meta.items() if k in ("l1_to_target", "scheduled_tokens", "omitted_tokens", "repeated_tokens",
                                                              "per_cluster") or k.startswith("budget_")}
    return StageResult(
        outputs=outputs,
        rows={"sequences": n_positions},
        parameters={"strategy": strategy, **params.recorded(), "seed": stage_params.seed, "greedy_mode": greedy_mode,
                    "freeze_prefix": n_frozen,
                    **({"mixture_weights_sha256": file_sha256(params.mixture_weights_file)} if spec.mixture is not None else {}),
                    **({"curriculum_sha256": file_sha256(params.curriculum)} if "curriculum" in spec.reads and params.curriculum else {})},
        facts={"repacked": repacked, "greedy_mode": greedy_mode or "none", **summary, **boundary,
               **({"computed_from": f"orderings[{spec.derived[0]}]"} if base is not None else {})},
        checks=[check, *mixture_checks],
        deps={"orderings": spec.derived[0]} if base is not None else {},
    )


def _computed_order(layout, connect: Connect, spec, strategy: str, stage_params: OrderStageParams, params, code_version: str,
                    seq_len: int, prefix: np.ndarray | None, n_frozen: int) -> tuple[OrderingResult, tuple | None]:
    """``(the strategy's ordering, its base strategy's materialized order or None)``: a derived
    strategy (e.g. greedy_block_shuffle) computed from its base's order when that was made from the
    same inputs (never under a frozen prefix), else the strategy run on the documents and the
    base packing (a training-time strategy: on its ``packing_from``'s), continuing ``prefix``."""
    name, seed = spec.packing_from or strategy, stage_params.seed
    base = base_order(layout, connect, spec, params, seed, code_version) if spec.derived and not n_frozen else None
    if base is not None:  # e.g. greedy_block_shuffle: the greedy partition's order, its blocks shuffled
        return OrderingResult(order_frame(spec.derived[1](base[0], params, seed)), None, base[1]), base
    warm_kernels()  # numba's first load, beside the reading of the documents and segments
    # contiguous columns: the strategies' NumPy views are not copies beside the frames' chunks; the
    # documents are read by run_strategy itself, which frees the frame once it holds their arrays
    # the segments as their file: the engine reads what the strategy needs, a partitioned order's deal a batch at a time
    result = run_strategy(name, lambda: ordering_documents(layout, params, name).rechunk(), layout.segments,
                          seq_len, params, seed, prefix=prefix, **_engine(layout, stage_params))
    return result, base


def _engine(layout, stage_params: OrderStageParams) -> dict:
    """Where a partitioned ordering's parts run and keep their files (``work/orderings/`` under the data root)."""
    return {"engine": stage_params.engine, "ray_cfg": stage_params.ray, "work_dir": layout.inside("work", "orderings")}


def _write_order(layout, strategy: str, result: OrderingResult) -> list:
    """``orderings/<strategy>.parquet`` and, for a repacking, its segments (written beside the
    order; a stale segments file of an earlier repacking is removed)."""

    seg_path = layout.ordering_segments(strategy)
    if result.segments is not None:  # a repacking's segments written while the order is
        return concurrently(partial(write_parquet, result.order, layout.ordering(strategy)),
                            partial(write_parquet, result.segments, seg_path))
    outputs = [write_parquet(result.order, layout.ordering(strategy))]
    seg_path.unlink(missing_ok=True)
    return outputs + _write_parts_plan(layout, strategy, result.plan)


def parts_plan_path(layout, strategy: str):
    """``orderings/<strategy>.parts_plan.npz``: the plan of a schedule ordered in parts, which its accounting checks."""
    return layout.inside("orderings", f"{strategy}.parts_plan.npz")


def _write_parts_plan(layout, strategy: str, plans: list[dict[str, np.ndarray]] | None) -> list:
    """A schedule's parts' plans in one file (``sequence_ids`` and ``copies`` joined; per part each
    other figure), or a stale one removed when the order was made in one part."""
    path = parts_plan_path(layout, strategy)
    if plans is None:
        path.unlink(missing_ok=True)
        return []
    arrays = {k: (np.concatenate if k in ("sequence_ids", "copies") else np.stack)([q[k] for q in plans]) for k in plans[0]}
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
    return [path]


def load_parts_plan(layout, strategy: str) -> dict[str, np.ndarray] | None:
    """The parts' plans :func:`_write_parts_plan` wrote, as one plan (per part figures kept per part), or None."""
    path = parts_plan_path(layout, strategy)
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _order_check(layout, connect: Connect, spec, strategy: str, written, tables: dict[str, pl.DataFrame]) -> tuple[bool, CheckFact]:
    """``(ok, the permutation check)``: an order must hold every sequence once; a schedule (a
    strategy that realizes a mixture) is checked by its accounting instead, whose tables are
    written to DuckDB here (``mixture_schedule`` and the schedule's own)."""
    order, m = written.order, written.n_sequences
    if spec.realizes_mixture:
        check = CheckFact(PERMUTATION_CHECK, True, {"strategy": strategy},
                          f"{strategy} realizes a mixture: a schedule (see schedule_within_caps)")
        with connect() as con:
            replace_rows(con, "mixture_schedule",
                         pl.read_parquet(layout.ordering_mixture(strategy)).with_columns(strategy=pl.lit(strategy)),
                         {"strategy": strategy})
            for table, rows in tables.items():
                replace_rows(con, table, rows.with_columns(strategy=pl.lit(strategy)), {"strategy": strategy})
        return True, check
    ok = bool(order.size == m and np.array_equal(np.sort(order), np.arange(m)))
    return ok, CheckFact(PERMUTATION_CHECK, ok, {"strategy": strategy, "positions": int(order.size), "sequences": m})


def freeze(layout, connect: Connect, strategy: str, order: np.ndarray, segments: pl.DataFrame, n_frozen: int,
           previous, seq_len: int, packing: str) -> list:
    """Record the first ``n_frozen`` positions of the order just written (continuing ``previous``,
    a ``pipeline.packing.frozen.FrozenPrefix``), extend the version chain, and upsert the strategy's
    row of ``ordering_frozen_prefix``."""
    tokens, offsets = open_tokens(layout.tokens, layout.doc_offsets)
    # as sequences writes them
    store = SequenceStore(tokens, offsets, segments, seq_len, pad_id=load_tokenizer(layout.tokenizer).pad_token_id)
    rec = frozen.capture(layout, strategy, order, segments, n_frozen, store, tokens.dtype, seq_len, packing, previous)
    chain = frozen.extend_chain(rec, frozen.chain_entry(layout, order.size, rec.sequences))
    paths = frozen.save(layout, rec)
    row = pl.DataFrame({"strategy": [strategy], "frozen_sequences": [rec.sequences], "sequences": [int(order.size)],
                        "version": [chain[-1]["version"]], "tokens_sha256": [rec.meta["tokens_sha256"]],
                        "version_chain": [json.dumps(chain, sort_keys=True)]})
    with connect() as con:
        replace_rows(con, "ordering_frozen_prefix", row, {"strategy": strategy})
    return paths


def load_ordering(layout, strategy: str) -> tuple[np.ndarray, pl.DataFrame]:
    """The order (sequence ids) and the segments table it refers to (``Store.ordering``)."""
    ordering = Store(layout).ordering(strategy)
    return ordering.order, ordering.segments


def seeded_ordering(layout, stage_params: OrderStageParams, strategy: str, seed: int) -> tuple[np.ndarray, pl.DataFrame]:
    """The order training seed ``seed`` trains on: the materialized ordering (the config's ``seed``) for
    a seed-free strategy or that seed, else the strategy re-run with ``seed`` (same parameters), so
    seeds vary the shuffle / noise, not only the model init."""
    params, spec = order_params(stage_params, layout), strategies.spec(strategy)
    if frozen.load(layout, strategy) is not None:
        return load_ordering(layout, strategy)  # a frozen stream is one stream: every seed trains on it
    if not spec.scheduled or seed == stage_params.seed or not seed_dependent(strategy, params):
        return load_ordering(layout, strategy)
    if spec.reseed is not None:  # e.g. greedy_block_shuffle: the greedy beneath is seed-free, re-shuffle its blocks only
        order, segments = load_ordering(layout, strategy)
        if (reseeded := spec.reseed(order, params, stage_params.seed, seed)) is not None:
            return reseeded, segments
    docs, segments = ordering_inputs(layout, params, strategy)
    result = run_strategy(strategy, docs, segments, Store(layout).sequences.seq_len, params, seed, **_engine(layout, stage_params))
    return ordering_ids(result.order), (result.segments if result.segments is not None else segments)
