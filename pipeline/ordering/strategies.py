"""The ordering strategies, their registry and the one entry point (``run_strategy``).

Sequence-level strategies permute the given packing's sequences. Document-level strategies
(and ``cluster_packed`` / ``duplicate_separated``) order documents and repack them with
``pipeline.packing.pack.pack_concat``; their result carries the new segments and the order refers to
those sequence ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.names import TOKEN_FAMILIES
from pipeline.ordering.control import cluster_sorted_order
from pipeline.ordering.curriculum import curriculum_greedy_order, load_curriculum
from pipeline.ordering.documents import (
    WITHIN_SORTS,
    bin_packing_order,
    round_robin_order,
    stratified_order,
    token_weighted_order,
)
from pipeline.ordering.features import SequenceFeatures, sequence_features
from pipeline.ordering.greedy import BLOCK, EXACT_MAX, Objective, greedy_mode, greedy_scaled_order, greedy_windowed_order
from pipeline.packing.pack import SEGMENT_SCHEMA, check_seq_len, pack_concat

Level = Literal["sequence", "document"]


@dataclass(frozen=True)
class OrderParams:
    """Knobs of all strategies (each uses the ones it names in its description)."""

    objective: str = "stationary"  # greedy objective: stationary | f1 | f2 | f3 | custom (pipeline.ordering.characteristics)
    families: tuple[str, ...] = ()  # objective custom: the families, "name[:weight[:classes]]"
    bins: int = 100  # B quantile length bins (f3)
    lam: float = 1.0  # lambda: weight of the length term (f3) or the L2-norm term (f2)
    noise: float = 0.0  # sigma_sched, in units of Lbar^2 (0 = deterministic)
    block_size: int = 32  # one training batch, in sequences: greedy_block_shuffle's block, the blocked greedy's repair
    curriculum: str | None = None  # knots file (JSON/YAML) for greedy_curriculum
    within: str = "original"  # within-cluster sort of the document-level strategies
    window: int = 4096  # candidate pool of greedy_fast
    greedy_exact_max: int = EXACT_MAX  # greedy family: exact greedy up to this many sequences, blocked above
    greedy_block: int = BLOCK  # sequences per block of the blocked greedy

    def objective_weights(self) -> Objective:
        return Objective.named(self.objective, self.lam, self.families)

    def column_families(self) -> list[str]:
        """Families that name a documents column (e.g. ``source``): the inputs must carry it."""
        return [f.name for f in self.objective_weights().families if f.level == "tokens" and f.name not in TOKEN_FAMILIES]


@dataclass(frozen=True)
class OrderingResult:
    order: pl.DataFrame  # position Int64, sequence_id Int64
    segments: pl.DataFrame | None  # new packing (SEGMENT_SCHEMA) when the strategy repacked
    greedy_mode: str | None = None  # "exact" | "blocked" for strategies built on `greedy`, else None


@dataclass(frozen=True)
class Inputs:
    """Per-document arrays (indexed by doc_id) and the base packing."""

    cluster: np.ndarray  # int64, -1 where the doc_id is absent
    length: np.ndarray  # int64 stream length (n_tokens incl. EOS), 0 where absent
    present: np.ndarray  # doc ids present, ascending
    content_hash: np.ndarray | None  # per doc_id: int64 rank of its content hash (equal = same text), or None
    segments: pl.DataFrame
    seq_len: int
    params: OrderParams
    seed: int
    columns: dict[str, np.ndarray]  # per doc_id: dense category codes of the documents columns the families name

    def features(self, segments: pl.DataFrame | None = None) -> SequenceFeatures:
        seg = self.segments if segments is None else segments
        d = seg["doc_id"].to_numpy()
        return sequence_features(
            seg["sequence_id"].to_numpy(), self.cluster[d], self.length[d], seg["n_tokens"].to_numpy(), self.params.bins, d,
            seg_columns={name: codes[d] for name, codes in self.columns.items()},
        )


@dataclass(frozen=True)
class Strategy:
    name: str
    level: Level
    description: str
    run: Callable[[Inputs], OrderingResult]


def _order_frame(sequence_ids: np.ndarray) -> pl.DataFrame:
    return pl.DataFrame(
        {"position": np.arange(sequence_ids.size, dtype=np.int64), "sequence_id": np.asarray(sequence_ids, dtype=np.int64)},
        schema={"position": pl.Int64, "sequence_id": pl.Int64},
    )


def sequence_order(name: str, features: SequenceFeatures, params: OrderParams, seed: int) -> np.ndarray:
    """Array API of the sequence-level strategies: rows of ``features`` in schedule order."""
    m = features.n_sequences
    obj = params.objective_weights()
    if name == "original":
        return np.arange(m, dtype=np.int64)
    if name == "random":
        return np.random.default_rng(seed).permutation(m)
    if name == "greedy":
        return _greedy(features, params, seed)
    if name == "greedy_fast":
        return greedy_windowed_order(features, obj, params.window, seed, params.noise)
    if name == "greedy_curriculum":
        if params.curriculum is None:
            raise StrataInputError("greedy_curriculum needs a curriculum", fix="pass --curriculum KNOTS.json (or .yaml)")
        cur = load_curriculum(params.curriculum, features.clusters.n_cols)
        return curriculum_greedy_order(features, cur, obj, params.noise, seed)
    if name == "greedy_block_shuffle":
        if params.block_size < 1:
            raise StrataInputError(f"block size {params.block_size} is impossible", fix="use --block-size >= 1")
        return block_shuffle(_greedy(features, params, seed), params.block_size, seed)
    raise StrataInputError(f"{name!r} is not a sequence-level strategy", fix=f"use one of {', '.join(SEQUENCE_LEVEL)}")


def _greedy(features: SequenceFeatures, params: OrderParams, seed: int) -> np.ndarray:
    obj = params.objective_weights()
    p = params
    return greedy_scaled_order(features, obj, p.greedy_exact_max, p.greedy_block, p.noise, seed, p.block_size)[0]


def _block_positions(n: int, block_size: int, seed: int) -> np.ndarray:
    """Positions of ``n`` items cut into blocks of ``block_size`` (the last may be shorter), the
    blocks in a seeded random order: ``greedy_block_shuffle``'s permutation."""
    blocks = np.random.default_rng(seed).permutation(-(-n // block_size))
    starts = blocks * block_size
    sizes = np.minimum(block_size, n - starts)
    return np.repeat(starts - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes) + np.arange(n)


def block_shuffle(rows: np.ndarray, block_size: int, seed: int) -> np.ndarray:
    """``rows`` in blocks of ``block_size`` consecutive items, the blocks in a seeded random order."""
    return np.asarray(rows)[_block_positions(len(rows), block_size, seed)]


def block_unshuffle(order: np.ndarray, block_size: int, seed: int) -> np.ndarray:
    """The inverse of :func:`block_shuffle`: ``block_unshuffle(block_shuffle(r, b, s), b, s) == r``."""
    order = np.asarray(order)
    rows = np.empty_like(order)
    rows[_block_positions(order.size, block_size, seed)] = order
    return rows


def greedy_seed_free(n_sequences: int, params: OrderParams) -> bool:
    """Whether ``greedy``'s order ignores its seed: no noise and the exact greedy (the blocked greedy
    deals sequences to blocks with a seeded draw)."""
    return params.noise == 0 and greedy_mode(n_sequences, params.greedy_exact_max) == "exact"


def reseed_block_shuffle(order: np.ndarray, params: OrderParams, from_seed: int, to_seed: int) -> np.ndarray | None:
    """``greedy_block_shuffle``'s order for ``to_seed`` from its order for ``from_seed`` (sequence
    ids), without re-running the greedy: the same ids as :func:`run_strategy` with ``to_seed``.
    None when the greedy order beneath depends on the seed (see :func:`greedy_seed_free`)."""
    if not greedy_seed_free(len(order), params):
        return None
    return block_shuffle(block_unshuffle(order, params.block_size, from_seed), params.block_size, to_seed)


GREEDY_BASED = ("greedy", "greedy_block_shuffle", "duplicate_separated")  # strategies whose result names a greedy_mode


def document_order(name: str, cluster: np.ndarray, length: np.ndarray, seq_len: int, params: OrderParams) -> np.ndarray:
    """Array API of the document-level strategies: a permutation of the documents' indices."""
    if params.within not in WITHIN_SORTS:
        raise StrataInputError(f"unknown within-cluster sort {params.within!r}", fix=f"use one of {', '.join(WITHIN_SORTS)}")
    if name == "stratified":
        return stratified_order(cluster, length, params.within)
    if name == "token_weighted":
        return token_weighted_order(cluster, length, params.within)
    if name == "round_robin":
        return round_robin_order(cluster, length, params.within)
    if name == "bin_packing":
        check_seq_len(seq_len)
        return bin_packing_order(cluster, length, seq_len, params.within)
    raise StrataInputError(f"{name!r} is not a document-level strategy", fix=f"use one of {', '.join(DOCUMENT_LEVEL)}")


def _sequence_strategy(name: str) -> Callable[[Inputs], OrderingResult]:
    def run(inp: Inputs) -> OrderingResult:
        f = inp.features()
        mode = greedy_mode(f.n_sequences, inp.params.greedy_exact_max) if name in GREEDY_BASED else None
        return OrderingResult(_order_frame(f.sequence_ids[sequence_order(name, f, inp.params, inp.seed)]), None, mode)

    return run


def _repack(inp: Inputs, doc_order: np.ndarray) -> pl.DataFrame:
    return pack_concat(doc_order, np.maximum(inp.length, 1), inp.seq_len).segments


def _document_strategy(name: str) -> Callable[[Inputs], OrderingResult]:
    def run(inp: Inputs) -> OrderingResult:
        local = document_order(name, inp.cluster[inp.present], inp.length[inp.present], inp.seq_len, inp.params)
        seg = _repack(inp, inp.present[local])
        return OrderingResult(_order_frame(np.unique(seg["sequence_id"].to_numpy())), seg)

    return run


def _cluster_packed(inp: Inputs) -> OrderingResult:
    """Don't Shuffle, Optimize's minimum-diversity baseline: pack each cluster's documents together, shuffle."""
    docs = inp.present[np.lexsort((inp.present, inp.cluster[inp.present]))]
    seg = _repack(inp, docs)
    ids = np.unique(seg["sequence_id"].to_numpy())
    return OrderingResult(_order_frame(ids[np.random.default_rng(inp.seed).permutation(ids.size)]), seg)


def duplicate_subsets(content_hash: np.ndarray, cluster: np.ndarray, seed: int) -> np.ndarray:
    """Don't Shuffle, Optimize Idea 3: split documents into max-multiplicity subsets, each duplicate-free.

    The k-th of m copies goes to subset floor(k * n_sub / m) (copies spread evenly, never two in
    one subset); unique documents are dealt across subsets cluster by cluster in a seeded order,
    so each subset keeps the global cluster weights ("cluster weight aware subsets").
    """
    n = content_hash.size
    _, inv, counts = np.unique(content_hash, return_inverse=True, return_counts=True)
    n_sub = int(counts.max()) if n else 1
    mult = counts[inv]
    order = np.lexsort((np.arange(n), inv))
    occ = np.empty(n, dtype=np.int64)
    occ[order] = np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts)
    subset = (occ * n_sub) // mult
    uniq = np.flatnonzero(mult == 1)
    if uniq.size:
        rnd = np.random.default_rng(seed).permutation(uniq.size)
        by = np.lexsort((rnd, cluster[uniq]))
        subset[uniq[by]] = np.arange(uniq.size) % n_sub
    return subset


def _duplicate_separated(inp: Inputs) -> OrderingResult:
    """Don't Shuffle, Optimize Idea 3: duplicate-free subsets, each packed and greedy-ordered, concatenated."""
    if inp.content_hash is None:
        raise StrataInputError("duplicate_separated needs a content_hash per document", fix="add a content_hash column to the documents")
    docs = inp.present
    subset = duplicate_subsets(inp.content_hash[docs], inp.cluster[docs], inp.seed)
    shuffle = np.random.default_rng(inp.seed).permutation(docs.size)
    doc_order = docs[shuffle[np.argsort(subset[shuffle], kind="stable")]]
    seg = _repack(inp, doc_order)
    first = seg.group_by("sequence_id").agg(pl.col("doc_id").first()).sort("sequence_id")
    sub_of_doc = np.full(inp.cluster.size, -1, dtype=np.int64)
    sub_of_doc[docs] = subset
    seq_sub = sub_of_doc[first["doc_id"].to_numpy()]
    seq_ids = first["sequence_id"].to_numpy()
    parts, modes = [], set()
    for k in np.unique(seq_sub):
        ids = seq_ids[seq_sub == k]
        f = inp.features(seg.filter(pl.col("sequence_id").is_in(ids.tolist())))
        parts.append(f.sequence_ids[_greedy(f, inp.params, inp.seed)])
        modes.add(greedy_mode(f.n_sequences, inp.params.greedy_exact_max))
    return OrderingResult(_order_frame(np.concatenate(parts)), seg, "blocked" if "blocked" in modes else "exact")


SEQUENCE_LEVEL = ("original", "random", "greedy", "greedy_fast", "greedy_curriculum", "greedy_block_shuffle")
DOCUMENT_LEVEL = ("stratified", "token_weighted", "round_robin", "bin_packing")

_DESCRIPTIONS = {
    "original": "packing order",
    "random": "seeded uniform permutation of the sequences",
    "greedy": "greedy of Don't Shuffle, Optimize / TerRIFIC curricula (objective f1|f2|f3, bins, lam, noise): exact up to greedy_exact_max sequences, blocked above",
    "greedy_fast": "greedy restricted to a sliding pool of `window` candidates (approximate, O(M*window))",
    "greedy_curriculum": "greedy with curriculum targets E_j(S) from a knots file (TerRIFIC curricula)",
    "greedy_block_shuffle": "greedy order cut into blocks of `block_size` sequences, blocks shuffled (Don't Shuffle, Optimize, 411M)",
    "stratified": "Diversity-ordered training stratified greedy on document counts (within-cluster sort `within`), repacked",
    "token_weighted": "Don't Shuffle, Optimize Idea 1: document-level greedy on token deficits, repacked",
    "round_robin": "one document per cluster in turn, repacked",
    "bin_packing": "worst-fit packing of round-robin documents into sequence-sized bins, repacked",
    "cluster_packed": "documents packed cluster by cluster, sequences shuffled (minimum diversity baseline)",
    "duplicate_separated": "Don't Shuffle, Optimize Idea 3: duplicate-free subsets, each greedy-ordered, concatenated",
    "cluster_sorted": "positive control: sequences grouped by dominant cluster, clusters in a seeded order (pipeline/ordering/control.py)",
}

STRATEGIES: dict[str, Strategy] = {
    **{n: Strategy(n, "sequence", _DESCRIPTIONS[n], _sequence_strategy(n)) for n in SEQUENCE_LEVEL},
    **{n: Strategy(n, "document", _DESCRIPTIONS[n], _document_strategy(n)) for n in DOCUMENT_LEVEL},
    "cluster_packed": Strategy("cluster_packed", "document", _DESCRIPTIONS["cluster_packed"], _cluster_packed),
    "duplicate_separated": Strategy("duplicate_separated", "document", _DESCRIPTIONS["duplicate_separated"], _duplicate_separated),
    "cluster_sorted": Strategy("cluster_sorted", "sequence", _DESCRIPTIONS["cluster_sorted"],
                               lambda inp: OrderingResult(_order_frame(cluster_sorted_order(inp.segments, inp.cluster, inp.seed)), None)),
}


SEED_FREE = ("original", "greedy", "greedy_curriculum", "stratified", "token_weighted", "round_robin", "bin_packing")


def seed_dependent(name: str, params: OrderParams) -> bool:
    """Whether the strategy's order depends on its seed (a shuffle, a random stream, or noise > 0).

    Training seed s re-runs a seed-dependent strategy with seed s, so every seed of the ablation
    sees a different draw of the shuffle / noise (not only a different model init)."""
    return name not in SEED_FREE or params.noise > 0


_WHAT_COLUMNS = {"documents": "doc_id, cluster, n_tokens (stream length incl. EOS)", "segments": ", ".join(SEGMENT_SCHEMA)}


def _column(df: pl.DataFrame, name: str, what: str) -> np.ndarray:
    if name not in df.columns:
        raise StrataInputError(f"the {what} table has no `{name}` column", fix=f"provide columns {_WHAT_COLUMNS[what]}")
    col = df[name]
    if col.null_count():
        raise StrataInputError(f"the {what} column `{name}` has missing values", fix="fill or drop those rows")
    return col.to_numpy()



def run_strategy(
    name: str, docs: pl.DataFrame, segments: pl.DataFrame, seq_len: int, params: OrderParams, seed: int
) -> OrderingResult:
    """Order the training stream with strategy ``name`` (the one call of the asset and the CLI).

    ``docs``: doc_id, cluster, n_tokens (stream length incl. EOS), optional content_hash.
    ``segments``: the base packing (pipeline.packing.pack SEGMENT_SCHEMA); document-level strategies
    ignore it and repack, returning their own segments.
    """
    if name not in STRATEGIES:
        raise StrataInputError(f"unknown ordering strategy {name!r}", fix=f"use one of {', '.join(STRATEGIES)}")
    doc_id = _column(docs, "doc_id", "documents").astype(np.int64)
    clus = _column(docs, "cluster", "documents").astype(np.int64)
    ntok = _column(docs, "n_tokens", "documents").astype(np.int64)
    if doc_id.size == 0:
        raise StrataInputError("there are no documents", fix="give at least one document")
    if doc_id.min() < 0 or np.unique(doc_id).size != doc_id.size:
        raise StrataInputError("doc_id values are negative or repeated", fix="use unique doc ids 0..N-1")
    if clus.min() < 0:
        raise StrataInputError("a cluster id is negative", fix="use cluster ids 0..K-1")
    if ntok.min() <= 0:
        raise StrataInputError("a document has n_tokens <= 0", fix="n_tokens is the stream length incl. EOS (>= 1)")
    n = int(doc_id.max()) + 1
    cluster = np.full(n, -1, dtype=np.int64)
    length = np.zeros(n, dtype=np.int64)
    cluster[doc_id], length[doc_id] = clus, ntok
    content_hash = None
    if "content_hash" in docs.columns:  # dense ranks in sorted hash order: np.unique sees the same groups, in
        content_hash = np.zeros(n, dtype=np.int64)  # the same order, as on the strings, at 8 bytes a document
        content_hash[doc_id] = docs["content_hash"].rank("dense").to_numpy().astype(np.int64)
    for c in ("sequence_id", "doc_id", "n_tokens"):
        _column(segments, c, "segments")
    seg_docs = segments["doc_id"].to_numpy()
    if seg_docs.size and (seg_docs.max() >= n or (cluster[seg_docs] < 0).any()):
        raise StrataInputError("a segment names a doc_id missing from the documents", fix="pack and order the same documents table")
    columns = {}
    for col in params.column_families():
        if col not in docs.columns:
            raise StrataInputError(
                f"the family {col!r} names no column of the documents", fix=f"use one of the documents columns {docs.columns} or a built-in family"
            )
        columns[col] = np.zeros(n, dtype=np.int64)  # dense codes in sorted category order (nulls: one category)
        columns[col][doc_id] = docs[col].cast(pl.String).fill_null("").rank("dense").to_numpy().astype(np.int64) - 1
    inp = Inputs(cluster, length, np.sort(doc_id), content_hash, segments, int(seq_len), params, int(seed), columns)
    return STRATEGIES[name].run(inp)
