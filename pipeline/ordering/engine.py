"""The ordering engine: ``run_strategy``, the one entry point, with its inputs and parameters.

The strategies themselves are the specs of ``pipeline/ordering/strategies/`` (the registry).
Sequence-level strategies permute the given packing's sequences. Document-level strategies order
documents and repack them with ``pipeline.packing.pack.pack_concat``; their result carries the
new segments and the order refers to those sequence ids.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
import polars as pl

from pipeline.config import config_default
from pipeline.errors import StrataInputError
from pipeline.names import WITHIN_SORTS
from pipeline.ordering import strategies
from pipeline.ordering.blend import GROUP_FAMILY, Blend, document_groups
from pipeline.ordering.doc_arrays import document_arrays, names_absent
from pipeline.ordering.features import SequenceFeatures, SequenceIds, packed_sequence_features
from pipeline.ordering.greedy import Objective, greedy_mode
from pipeline.ordering.parquet_segments import ParquetSegments, parquet_sequences
from pipeline.ordering.partitioned import Corpus, partitioned_order
from pipeline.ordering.parts import PART_BYTES_PER_SEQUENCE, n_parts, part_sizes
from pipeline.ordering.strategies import StrategySpec
from pipeline.packing.pack import SEGMENT_SCHEMA, pack_concat
from pipeline.segments import as_integers

_PATHS = ("curriculum", "mixture_weights_file")  # "" in the config, None here: no file


def _default(key: str) -> Any:
    """The config's default of ``key`` as :class:`OrderParams` holds it: a list as a tuple, no file as None."""
    value = config_default(key)
    if key in _PATHS:
        return value or None
    return tuple(value) if isinstance(value, list) else value


@dataclass(frozen=True)
class OrderParams:
    """Knobs of all strategies (each uses the ones it names in its description); each field is
    named as its key of :class:`pipeline.config.StrataConfig` (``from_config``), and defaults to
    that key's default."""

    objective: str = _default("objective")  # greedy objective: stationary | f1 | f2 | f3 | custom (pipeline.ordering.characteristics)
    families: tuple[str, ...] = _default("families")  # objective custom: the families, "name[:weight[:classes]]"
    length_bins: int = _default("length_bins")  # B quantile length bins (f3)
    # quantiles of the length bins: tokens | documents (features.length_bin_edges)
    length_bin_weighting: str = _default("length_bin_weighting")
    lam: float = _default("lam")  # lambda: weight of the length term (f3) or the L2-norm term (f2)
    noise: float = _default("noise")  # sigma_sched, in units of Lbar^2 (0 = deterministic)
    batch_size: int = _default("batch_size")  # one training batch, in sequences: greedy_block_shuffle's block, the greedy's repair
    curriculum: str | None = _default("curriculum")  # knots file (JSON/YAML) for greedy_curriculum
    within: str = _default("within")  # within-cluster sort of the document-level strategies
    window: int = _default("window")  # candidate pool of greedy_fast
    greedy_exact_max: int = _default("greedy_exact_max")  # greedy family: exact greedy up to this many sequences, blocked above
    greedy_block: int = _default("greedy_block")  # sequences per block of the blocked greedy
    greedy_repair: bool = _default("greedy_repair")  # greedy family: swap-repair the worst batches after the greedy
    order_part_bytes: int = _default("order_part_bytes")  # greedy family: bytes a part's ordering may hold (pipeline.ordering.partitioned)
    # greedy_mixture: JSON/YAML cluster -> weight, or the stage's weights
    mixture_weights_file: str | None = _default("mixture_weights_file")
    mixture_budget_tokens: int = _default("mixture_budget_tokens")  # greedy_mixture: tokens to schedule (0 = the packing's tokens)
    max_sequence_copies: int = _default("max_sequence_copies")  # greedy_mixture: copies of a sequence at most
    duplicate_order: str = _default("duplicate_order")  # duplicate_separated: each subset by the greedy (greedy) or by Idea 2 (idea2)
    blend: Any = None  # greedy_blend: the pipeline.ordering.blend.Blend of mixture.weights / mixture.stages (None: no blend)

    @classmethod
    def from_config(cls, cfg: Any) -> "OrderParams":
        """The ordering knobs of a :class:`pipeline.config.StrataConfig`."""
        return cls(
            objective=cfg.objective, families=tuple(cfg.families), length_bins=cfg.length_bins,
            length_bin_weighting=cfg.length_bin_weighting, lam=cfg.lam, noise=cfg.noise, batch_size=cfg.batch_size,
            curriculum=cfg.curriculum or None, within=cfg.within, window=cfg.window,
            greedy_exact_max=cfg.greedy_exact_max, greedy_block=cfg.greedy_block, greedy_repair=cfg.greedy_repair,
            order_part_bytes=cfg.order_part_bytes,
            mixture_weights_file=cfg.mixture_weights_file or None, mixture_budget_tokens=cfg.mixture_budget_tokens,
            max_sequence_copies=cfg.max_sequence_copies, duplicate_order=cfg.duplicate_order, blend=_blend(cfg),
        )

    @classmethod
    def reads(cls) -> tuple[str, ...]:
        """The config keys :meth:`from_config` reads: each field's own key, and ``mixture`` for the blend."""
        return (*(f.name for f in fields(cls) if f.name != "blend"), "mixture")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The keys an order depends on: all it reads (each strategy's spec names its own, ``reads``)."""
        return cls.reads()

    def recorded(self) -> dict[str, Any]:
        """The knobs as a lineage row records them (the blend only when one is configured)."""
        return {k: v for k, v in self.__dict__.items() if not (k == "blend" and v is None)}

    def objective_weights(self) -> Objective:
        return Objective.named(self.objective, self.lam, self.families)

    def column_families(self) -> list[str]:
        """Families that read a documents column (e.g. ``source``, ``quality_bin``): the inputs must carry it."""
        return [f.name for f in self.objective_weights().families if f.spec.column is not None]

    def document_columns(self) -> list[str]:
        """The documents columns those families read (``quality_bin`` reads ``quality``)."""
        return list(dict.fromkeys(f.spec.column for f in self.objective_weights().families if f.spec.column is not None))


def _blend(cfg: Any) -> Any:
    """The blend of ``cfg.mixture`` (``pipeline.ordering.blend.Blend``), None without weights or stages."""
    m = getattr(cfg, "mixture", None)
    if m is None or not (m.weights or m.stages):
        return None

    return Blend.from_config(m)


@dataclass(frozen=True)
class OrderingResult:
    order: pl.DataFrame  # position Int64, sequence_id Int64
    segments: pl.DataFrame | None  # new packing (SEGMENT_SCHEMA) when the strategy repacked
    greedy_mode: str | None = None  # "exact" | "blocked" for strategies built on `greedy`, else None
    plan: list | None = None  # a schedule ordered in parts (greedy_blend): each part's plan (partitioned.load_plans)


@dataclass(frozen=True)
class Inputs:
    """Per-document arrays (indexed by doc_id) and the base packing."""

    cluster: np.ndarray  # int64, -1 where the doc_id is absent
    length: np.ndarray  # int64 stream length (n_tokens incl. EOS), 0 where absent
    present: np.ndarray  # doc ids present, ascending
    content_hash: np.ndarray | None  # per doc_id: int64 rank of its content hash (equal = same text), or None
    segments: pl.DataFrame | None  # the base packing's sequence_id, doc_id, n_tokens; None: read from Parquet by the deal
    seq_len: int
    params: OrderParams
    seed: int
    columns: dict[str, np.ndarray]  # per doc_id: dense category codes of the documents columns the families name
    blend_groups: tuple[np.ndarray, list[str]] | None = None  # per doc_id: its group of the blend's column, and the group names

    def sequence_ids(self) -> SequenceIds:
        return SequenceIds.of_segments(self.segments["sequence_id"].to_numpy())

    def features(self, segments: pl.DataFrame | None = None) -> SequenceFeatures:
        seg = self.segments if segments is None else segments
        return packed_sequence_features(seg["sequence_id"].to_numpy(), seg["doc_id"].to_numpy(), seg["n_tokens"].to_numpy(),
                                        self.cluster, self.length, self.params.length_bins, self.columns,
                                        length_bin_weighting=self.params.length_bin_weighting)


def order_frame(sequence_ids: np.ndarray) -> pl.DataFrame:
    """``(position, sequence_id)`` of ``sequence_ids`` in order."""
    return pl.DataFrame(
        {"position": np.arange(sequence_ids.size, dtype=np.int64), "sequence_id": np.asarray(sequence_ids, dtype=np.int64)},
        schema={"position": pl.Int64, "sequence_id": pl.Int64},
    )


def repack(inp: Inputs, doc_order: np.ndarray) -> tuple[pl.DataFrame, np.ndarray]:
    """The documents in ``doc_order`` packed into ``seq_len``-token sequences: their segments and
    the sequence ids, ascending (concat packing fills every id below its count)."""
    packing = pack_concat(doc_order, np.maximum(inp.length, 1), inp.seq_len)
    return packing.segments, np.arange(packing.n_sequences, dtype=np.int64)


def _array_api(name: str, level: str) -> StrategySpec:
    spec = strategies.REGISTRY.entries().get(name)
    if spec is None or spec.level != level or spec.order is None:
        listed = strategies.SEQUENCE_LEVEL if level == "sequence" else strategies.DOCUMENT_LEVEL
        raise StrataInputError(f"{name!r} is not a {level}-level strategy", fix=f"use one of {', '.join(listed)}")
    return spec


def sequence_order(name: str, features: SequenceFeatures, params: OrderParams, seed: int) -> np.ndarray:
    """Array API of the sequence-level strategies: rows of ``features`` in schedule order."""
    return _array_api(name, "sequence").order(features, params, seed)


def document_order(name: str, cluster: np.ndarray, length: np.ndarray, seq_len: int, params: OrderParams) -> np.ndarray:
    """Array API of the document-level strategies: a permutation of the documents' indices."""
    spec = _array_api(name, "document")
    if params.within not in WITHIN_SORTS:
        raise StrataInputError(f"unknown within-cluster sort {params.within!r}", fix=f"use one of {', '.join(WITHIN_SORTS)}")
    return spec.order(cluster, length, seq_len, params)


def _run(spec: StrategySpec, inp: Inputs) -> OrderingResult:
    """A strategy with a ``run`` of its own, or a document-level order, repacked."""
    if spec.run is not None:
        return spec.run(inp)
    local = document_order(spec.name, inp.cluster[inp.present], inp.length[inp.present], inp.seq_len, inp.params)
    seg, ids = repack(inp, inp.present[local])
    return OrderingResult(order_frame(ids), seg)


def _run_frozen(spec: StrategySpec, inp: Inputs, prefix: np.ndarray) -> OrderingResult:
    """Positions ``[0, P)`` hold the frozen ``prefix`` (sequence ids); the other sequences follow in
    the strategy's order, continuing from the prefix (``StrategySpec.order_after``), or a ``run``
    strategy's ``run_after`` gives the whole result (``greedy_blend``)."""
    if spec.run_after is not None:
        return spec.run_after(inp, prefix)
    if spec.realizes_mixture:
        raise StrataInputError(f"{spec.name!r} realizes a mixture (a schedule with repeats), which a frozen prefix does not extend",
                               fix="freeze permutation strategies only, or set freeze_prefix: 0")
    if spec.level != "sequence" or spec.order is None:
        raise StrataInputError(f"{spec.name!r} repacks documents, so it cannot keep a frozen prefix of the base packing",
                               fix="freeze sequence-level strategies only (strata list strategies), or set freeze_prefix: 0")
    f = inp.features()
    rows = np.searchsorted(f.sequence_ids, prefix)
    if prefix.size and (rows.max() >= f.n_sequences or not np.array_equal(f.sequence_ids[rows], prefix)):
        raise StrataInputError("a frozen sequence is missing from the packing",
                               fix="re-materialize sequences (it keeps the frozen sequences)")
    rest = np.setdiff1d(np.arange(f.n_sequences), rows)
    if spec.order_after is not None:
        after = spec.order_after(f, rows, inp.params, inp.seed)
    else:
        after = rest[spec.order(f.take_rows(rest), inp.params, inp.seed)] if rest.size else rest
    mode = greedy_mode(rest.size, inp.params.greedy_exact_max) if spec.greedy_based else None
    return OrderingResult(order_frame(f.sequence_ids[np.concatenate([rows, after]).astype(np.int64)]), None, mode)


def seed_dependent(name: str, params: OrderParams) -> bool:
    """Whether the strategy's order depends on its seed (a shuffle, a random stream, or noise > 0).

    Training seed s re-runs a seed-dependent strategy with seed s, so every seed of the ablation
    sees a different draw of the shuffle / noise (not only a different model init)."""
    return not strategies.spec(name).seed_free or params.noise > 0


_WHAT_COLUMNS = {"documents": "doc_id, cluster, n_tokens (stream length incl. EOS)", "segments": ", ".join(SEGMENT_SCHEMA)}


def _column(df: pl.DataFrame, name: str, what: str) -> np.ndarray:
    if name not in df.columns:
        raise StrataInputError(f"the {what} table has no `{name}` column", fix=f"provide columns {_WHAT_COLUMNS[what]}")
    col = df[name]
    if col.null_count():
        raise StrataInputError(f"the {what} column `{name}` has missing values", fix="fill or drop those rows")
    return col.to_numpy()



def segment_columns(name: str, frozen: bool = False) -> list[str]:
    """The base packing's segment columns :func:`run_strategy` reads for strategy ``name``: none
    for a document-level strategy (it repacks), the sequence ids alone for an order that reads
    nothing else (``StrategySpec.ids_only``, unless a frozen prefix is kept), else
    sequence_id, doc_id and n_tokens."""
    spec = strategies.spec(name)
    if spec.level == "document":
        return []
    return ["sequence_id"] if spec.ids_only and not frozen else ["sequence_id", "doc_id", "n_tokens"]


def run_strategy(
    name: str, docs: pl.DataFrame | Callable[[], pl.DataFrame], segments: pl.DataFrame | Callable[[], pl.DataFrame] | Path,
    seq_len: int, params: OrderParams, seed: int, prefix: np.ndarray | None = None, *, engine: str = "local",
    ray_cfg: Any = None, work_dir: Path | None = None,
) -> OrderingResult:
    """Order the training stream with strategy ``name`` (the one call of the asset and the CLI).

    ``prefix``: sequence ids of a frozen prefix (``pipeline/packing/frozen.py``): they keep
    positions ``[0, P)`` and the strategy orders the rest after them (sequence-level strategies only).

    ``docs``: doc_id, cluster, n_tokens (stream length incl. EOS), optional content_hash.
    ``segments``: the base packing (pipeline.packing.pack SEGMENT_SCHEMA); document-level strategies
    ignore it and repack, returning their own segments. Either may be given as a function that
    reads it: then no caller holds a reference, and the documents frame is freed once its arrays
    are built (the orderings asset, at 10M documents); ``segments`` may also be the packing's
    Parquet file, which a partitioned order's deal reads a batch at a time (``ParquetSegments``):
    then no process holds the segments. Only what the strategy reads is read and
    validated (:func:`segment_columns`): an order of the sequence ids alone (``random``) reads
    neither the documents nor the segments' other columns, a document-level strategy no segments.

    A strategy that reads ``order_part_bytes`` orders a packing above that bound in parts
    (:func:`_parts`; ``pipeline/ordering/partitioned.py``): each part in a worker process of its own
    (``engine: local``) or a Ray task (``engine: ray``), its files under ``work_dir``.
    """
    spec = strategies.spec(name)
    if not spec.scheduled:
        raise StrataInputError(f"{name!r} picks its sequences during training; it has no order to compute",
                               fix=f"order {spec.packing_from!r} for its packing, or use one of {', '.join(strategies.scheduled())}")
    if spec.level == "document":  # it repacks the documents: the base packing is not read
        segments = pl.DataFrame(schema={"sequence_id": pl.Int64, "doc_id": pl.Int64, "n_tokens": pl.Int32})
    segments, path, parts = _segments_and_parts(spec, segments, params, prefix is not None)
    if spec.ids_only and prefix is None:
        return _ordered(spec, SequenceIds.of_segments(_column(segments, "sequence_id", "segments")), params, int(seed))
    docs = docs() if callable(docs) else docs
    doc_id = as_integers(_column(docs, "doc_id", "documents"))
    clus = as_integers(_column(docs, "cluster", "documents"))
    ntok = as_integers(_column(docs, "n_tokens", "documents"))
    cluster, length = document_arrays(doc_id, clus, ntok)  # checked and scattered on every core
    n = cluster.size
    content_hash = _content_ranks(docs, doc_id, n)
    segments = _base_segments(segments, cluster) if segments is not None else None  # None: ParquetSegments checks them
    columns = _family_columns(docs, doc_id, n, params)
    blend_groups = _blend_groups(docs, doc_id, n, params) if params.blend is not None and "mixture" in spec.reads else None
    del docs, doc_id, clus, ntok  # per-document frame: the arrays above hold what the strategies read
    present = np.flatnonzero(cluster >= 0)  # the doc ids present, ascending
    inp = Inputs(cluster, length, present, content_hash, segments, int(seq_len), params, int(seed), columns, blend_groups)
    del cluster, length, present, content_hash, segments, columns  # held by ``inp`` alone
    if parts > 1:
        return _partitioned(name, inp, parts, engine, ray_cfg, work_dir, None if prefix is None else np.asarray(prefix, dtype=np.int64),
                            path)
    if prefix is not None:
        return _run_frozen(spec, inp, np.asarray(prefix, dtype=np.int64))
    if spec.level == "sequence" and spec.run is None:
        # the order reads the features alone: the per-document arrays and the segments are freed
        # once the features are built
        f = inp.features() if spec.features else inp.sequence_ids()
        del inp
        return _ordered(spec, f, params, int(seed))
    return _run(spec, inp)


def _segments_and_parts(spec: StrategySpec, segments: Any, params: OrderParams,
                        frozen: bool) -> tuple[pl.DataFrame | None, Path | None, int]:
    """(the segments frame, their Parquet file, the parts): a Parquet file is read whole for one
    part (the columns the strategy reads) and left to the deal for more (frame None); a frame, or a
    function giving it, is taken as it is."""
    if not isinstance(segments, (str, Path)):
        segments = segments() if callable(segments) else segments
        return segments, None, _parts(spec, partial(_n_sequences, segments), params, frozen)
    path = Path(segments)
    parts = _parts(spec, partial(parquet_sequences, path), params, frozen)
    return (None if parts > 1 else pl.read_parquet(path, columns=segment_columns(spec.name, frozen)).rechunk()), path, parts


def _n_sequences(segments: pl.DataFrame) -> int:
    return SequenceIds.of_segments(_column(segments, "sequence_id", "segments")).n_sequences


def _parts(spec: StrategySpec, n_sequences: Callable[[], int], params: OrderParams, frozen: bool) -> int:
    """The parts a strategy that reads ``order_part_bytes`` orders the packing in (1 for any other;
    ``n_sequences`` is asked only then); more than one for a strategy without a ``part_order``, or
    under a frozen prefix for one that does not continue it part by part (``order_after``, its parts
    in stretches), is refused."""
    if "order_part_bytes" not in spec.reads:
        return 1
    m = n_sequences()
    parts = n_parts(m, params.order_part_bytes, params.batch_size)
    continues = spec.order_after is not None and spec.derived is None and spec.part_layout == "stretches"
    if parts > 1 and (spec.part_order is None or (frozen and not continues)):
        what = f"{spec.name!r} under a frozen prefix (freeze_prefix)" if frozen and spec.part_order is not None else f"{spec.name!r}"
        need = m * PART_BYTES_PER_SEQUENCE
        raise StrataInputError(
            f"{m:,} sequences need {parts} parts of order_part_bytes={params.order_part_bytes:,}, and {what} is ordered in one part only",
            fix=f"set order_part_bytes: 0 or >= {need:,} (one process orders all sequences, about {PART_BYTES_PER_SEQUENCE} bytes each), "
                "or use greedy (a frozen prefix too) / greedy_block_shuffle / greedy_curriculum / greedy_mixture / greedy_blend "
                "(docs/scale.md)")
    return parts


def _partitioned(name: str, inp: Inputs, parts: int, engine: str, ray_cfg: Any, work_dir: Path | None,
                 prefix: np.ndarray | None = None, path: Path | None = None) -> OrderingResult:
    """The strategy's order in ``parts`` parts (``pipeline.ordering.partitioned``), a frozen
    ``prefix`` (sequence ids) first; its greedy mode is each part's. ``path``: the segments'
    Parquet file, read batch by batch (``ParquetSegments``) instead of ``inp.segments``."""
    seg, p, seed, columns = inp.segments, inp.params, inp.seed, dict(inp.columns)
    if inp.blend_groups is not None:  # greedy_blend: the deal balances the groups, each part's worker plans them by name
        columns[GROUP_FAMILY] = inp.blend_groups[0]
        p = replace(p, blend=replace(p.blend, groups=tuple(inp.blend_groups[1])))
    if path is not None:
        corpus = ParquetSegments(path, inp.cluster, inp.length, columns, p)
    else:
        corpus = Corpus(seg["sequence_id"].to_numpy(), seg["doc_id"].to_numpy(), seg["n_tokens"].to_numpy(), inp.cluster, inp.length,
                        columns, p)
    if inp.blend_groups is not None:
        corpus.widths[GROUP_FAMILY] = len(inp.blend_groups[1])  # every group, those the packing lacks too
    del inp, seg, columns
    if prefix is not None and np.unique(prefix).size != prefix.size:
        raise StrataInputError("a frozen sequence is frozen twice", fix="re-materialize sequences (it keeps the frozen sequences)")
    if prefix is not None and path is None and not np.isin(prefix, corpus.seq[corpus.starts[:-1]]).all():
        raise StrataInputError("a frozen sequence is missing from the packing",
                               fix="re-materialize sequences (it keeps the frozen sequences)")
    ids, plans = partitioned_order(name, corpus, parts, seed, engine=engine, ray_cfg=ray_cfg, work_dir=work_dir, prefix=prefix)
    largest = int(part_sizes(ids.size, parts, p.batch_size, strategies.spec(name).part_layout).max())
    return OrderingResult(order_frame(ids), None, greedy_mode(largest, p.greedy_exact_max), plans)


def _content_ranks(docs: pl.DataFrame, doc_id: np.ndarray, n: int) -> np.ndarray | None:
    """Per doc_id the dense rank of its content hash in sorted hash order (equal = same text), or
    None without a ``content_hash`` column: np.unique sees the same groups, in the same order, as
    on the strings, at 8 bytes a document."""
    if "content_hash" not in docs.columns:
        return None
    content_hash = np.zeros(n, dtype=np.int64)
    content_hash[doc_id] = docs["content_hash"].rank("dense").to_numpy().astype(np.int64)
    return content_hash


def _base_segments(segments: pl.DataFrame, cluster: np.ndarray) -> pl.DataFrame:
    """The base packing's columns the strategies read (the other columns are freed when the caller
    kept no reference), checked to name only documents present in ``cluster``."""
    for c in ("sequence_id", "doc_id", "n_tokens"):
        _column(segments, c, "segments")
    segments = segments.select("sequence_id", "doc_id", "n_tokens")
    if names_absent(segments["doc_id"].to_numpy(), cluster):
        raise StrataInputError("a segment names a doc_id missing from the documents", fix="pack and order the same documents table")
    return segments


def _family_columns(docs: pl.DataFrame, doc_id: np.ndarray, n: int, params: OrderParams) -> dict[str, np.ndarray]:
    """Per documents column a family names, each doc_id's dense code in sorted category order
    (nulls: one category)."""
    columns = {}
    for f in params.objective_weights().families:
        if f.spec.column is None:
            continue
        if f.spec.column not in docs.columns:
            raise StrataInputError(
                f"the family {f.name!r} names no column of the documents ({f.spec.column!r})",
                fix=f"use one of the documents columns {docs.columns} or a built-in family"
                    + (" (quality: enable the quality stage, docs/quality.md)" if f.spec.column == "quality" else "")
            )
        columns[f.name] = np.zeros(n, dtype=np.int64)
        columns[f.name][doc_id] = f.spec.codes(docs)
    return columns


def _blend_groups(docs: pl.DataFrame, doc_id: np.ndarray, n: int, params: OrderParams) -> tuple[np.ndarray, list[str]]:
    """greedy_blend's groups: each doc_id's group (-1 where absent) of the blend's column, and the groups' names."""
    codes, names = document_groups(docs, params.blend)
    blend_groups = (np.full(n, -1, dtype=np.int64), names)
    blend_groups[0][doc_id] = codes
    return blend_groups


def _ordered(spec: StrategySpec, f: SequenceFeatures | SequenceIds, params: OrderParams, seed: int) -> OrderingResult:
    """A sequence-level strategy's order of the sequences ``f`` describes."""
    mode = greedy_mode(f.n_sequences, params.greedy_exact_max) if spec.greedy_based else None
    return OrderingResult(order_frame(f.sequence_ids[spec.order(f, params, seed)]), None, mode)
