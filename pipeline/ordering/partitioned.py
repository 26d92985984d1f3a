"""Partitioned ordering: a corpus too large for one process's greedy, ordered part by part.

The driver reads the base packing's segments and the per-document arrays (as the one-process
ordering does), then builds the sequences' features a chunk of ``DEAL_CHUNK`` sequences at a time
(the corpus's length-bin edges and column widths, so every chunk is binned as the whole packing)
and deals each chunk into the P parts (``pipeline.ordering.parts``), writing each part's share of
the chunk as a file under the work folder. It never holds the features of more than one chunk,
nor any part's greedy: what it keeps across chunks is the deal's P x G totals and the corpus's
(cluster, length bin) token table (K x B).

Each part is ordered by the strategy's ``part_order`` (today's greedy, on the part's features as
if they were the corpus) in a worker process of its own (``engine: local``) or as a Ray task
(``engine: ray``): the worker reads its files and writes its order (sequence ids) as a file, whose
path is all that comes back. A worker that dies is run again from the same files, so the same
bytes come out. The driver joins the parts' orders into the stream in the strategy's
``part_layout`` (``pipeline.ordering.parts``: part after part for the greedy).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from pipeline.distributed.engine import map_tasks
from pipeline.distributed.shards import Shard
from pipeline.errors import StrataInputError
from pipeline.ordering import strategies
from pipeline.ordering.characteristics import Characteristics
from pipeline.ordering.features import Csr, length_bin_edges, packed_sequence_features
from pipeline.ordering.greedy import LeadIn, Objective
from pipeline.ordering.parts import Deal, load_part, part_sizes, save_piece, stream_of, write_stream
from pipeline.ordering.segment_files import SegmentFiles
from pipeline.segments import grouped, stable_argsort
from pipeline.storage.atomic import atomic_path, write_npy

DEAL_CHUNK = 1 << 18  # sequences whose features the deal holds at once


def order_part(strategy: str, params: Any, seed: int, pieces: list[str], meta: str, out: str, frozen: str | None = None) -> str:
    """A worker's task: part's features from its ``pieces`` (and the corpus's bin edges and
    (cluster, bin) tokens in ``meta``), ordered by the strategy's ``part_order``; its sequence ids
    in order written to ``out``, whose path is returned. ``frozen``: the ``.npz`` of the frozen
    prefix's sequences the part starts with (``ids``, stream order; :func:`_frozen_slices`); the rest
    follow in the strategy's ``order_after``, continuing from them and from the parts before it
    that the prefix fills (its ``lead_in``)."""
    with np.load(meta, allow_pickle=False) as z:
        edges, joint = z["bin_edges"], z["joint"]
    f = load_part([Path(p) for p in pieces], edges, joint)
    spec = strategies.spec(strategy)
    if frozen is None:
        rows = spec.part_order(f, params, seed)
        if isinstance(rows, tuple):  # a schedule's order and its plan (greedy_blend)
            rows, plan = rows
            with atomic_path(plan_path(out)) as tmp, open(tmp, "wb") as fh:
                np.savez(fh, sequence_ids=f.sequence_ids, **plan)
        rows = np.asarray(rows, dtype=np.int64)
    else:
        with np.load(frozen, allow_pickle=False) as z:
            head = np.searchsorted(f.sequence_ids, z["ids"])
            more = {"lead_in": LeadIn({k[len("lead_in."):]: z[k] for k in z.files if k.startswith("lead_in.")},
                                      float(z["lead_in_tokens"]), int(z["lead_in_sequences"]))} if "lead_in_tokens" in z.files else {}
        after = spec.order_after(f, head, params, seed, **more) if head.size < f.n_sequences else head[:0]
        rows = np.concatenate([head, np.asarray(after, dtype=np.int64)])
    write_npy(f.sequence_ids[rows], out)
    return out


def plan_path(out: str | Path) -> Path:
    """Where a part's worker writes its plan beside its order ``out`` (a schedule's: ``part_order``'s second value)."""
    return Path(out).with_suffix(".plan.npz")


def load_plans(outs: list[Path]) -> list[dict[str, np.ndarray]] | None:
    """The parts' plans (each its rows' ``sequence_ids`` and the plan's arrays), None when the parts wrote none."""
    if not all(plan_path(o).is_file() for o in outs):
        return None
    plans = []
    for o in outs:
        with np.load(plan_path(o), allow_pickle=False) as z:
            plans.append({k: z[k] for k in z.files})
    return plans


class Corpus:
    """What the deal reads: the base packing's segments grouped by ascending sequence id, the
    per-document cluster, stream length and column codes, and the objective's settings."""

    def __init__(self, seq: np.ndarray, doc: np.ndarray, tokens: np.ndarray, cluster: np.ndarray, length: np.ndarray,
                 columns: Mapping[str, np.ndarray], params: Any):
        if not grouped(seq):
            by = stable_argsort(seq)
            seq, doc, tokens = seq[by], doc[by], tokens[by]
        self.seq, self.doc, self.tokens = seq, doc, tokens
        self.cluster, self.length, self.columns, self.params = cluster, length, dict(columns), params
        self.starts = np.append(np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]]), seq.size)
        first = np.zeros(int(doc.max()) + 1 if doc.size else 0, dtype=bool)
        first[doc] = True  # the documents the segments hold: the one-process features' bins and widths
        held = np.flatnonzero(first)
        self.bin_edges = length_bin_edges(length[held], params.length_bins, params.length_bin_weighting)
        self.n_clusters = int(cluster[held].max()) + 1
        self.widths = {name: int(codes[held].max()) + 1 for name, codes in self.columns.items()}

    @property
    def n_sequences(self) -> int:
        return self.starts.size - 1

    def ranges(self, chunk: int):
        """Stretches ``[a, b)`` of at most ``chunk`` sequences, in id order."""
        for a in range(0, self.n_sequences, chunk):
            yield a, min(a + chunk, self.n_sequences)

    def chunk(self, a: int, b: int):
        """The features of sequences ``[a, b)`` (rows in ascending id), binned and sized as the whole packing's."""
        lo, hi = self.starts[a], self.starts[b]
        return stretch_features(self, self.seq[lo:hi], self.doc[lo:hi], self.tokens[lo:hi])


def stretch_features(corpus: Any, seq: np.ndarray, doc: np.ndarray, tokens: np.ndarray):
    """The features of the whole sequences whose segments these are (grouped by sequence), from
    ``corpus``' per-document ``cluster``, ``length`` and ``columns``, binned with its ``bin_edges``
    and sized as its ``n_clusters`` and ``widths``; and their (cluster, bin) tokens."""
    f = packed_sequence_features(seq, doc, tokens, corpus.cluster, corpus.length, corpus.params.length_bins, corpus.columns,
                                 corpus.params.length_bin_weighting, bin_edges=corpus.bin_edges)
    joint = np.zeros((corpus.n_clusters, corpus.bin_edges.size + 1))
    joint[: f.cluster_bin_tokens.shape[0]] += f.cluster_bin_tokens
    cols = {k: replace(v, n_cols=corpus.widths[k]) for k, v in f.columns.items()}
    return replace(f, clusters=replace(f.clusters, n_cols=corpus.n_clusters), columns=cols), joint


def _offsets(chars: Characteristics, objective: Objective) -> dict[str, tuple[int, int]]:
    """Each family's first column and width in the deal's columns, the same for every chunk: a
    token family's width is the corpus's, a sequence family's its ``classes`` (a chunk's quantile
    classes may merge)."""
    out, at = {}, 0
    for fam in [f for f in objective.families if f.level == "tokens"] + [f for f in objective.families if f.level == "sequences"]:
        a, b = chars.family_columns[fam.name]
        width = fam.classes if fam.level == "sequences" else b - a
        out[fam.name] = (at, width)
        at += width
    return out


def _deal_matrix(chars: Characteristics, offsets: dict[str, tuple[int, int]]) -> Csr:
    """The chunk's objective matrix with its columns moved to the deal's (:func:`_offsets`)."""
    remap = np.zeros(chars.n_cols, dtype=np.int64)
    for name, (a, b) in chars.family_columns.items():
        remap[a:b] = offsets[name][0] + np.arange(b - a)
    x = chars.x
    return Csr(x.indptr, remap[x.indices], x.data, sum(w for _, w in offsets.values()))


def _frozen_parts(prefix: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The frozen prefix's sequence ids sorted, each one's part (the stretch its stream position
    falls in) and each part's count of them."""
    part = np.searchsorted(np.cumsum(sizes), np.arange(prefix.size), side="right")
    by = np.argsort(prefix, kind="stable")
    return prefix[by], part[by], np.bincount(part, minlength=sizes.size)


def deal(corpus: Corpus | SegmentFiles, sizes: np.ndarray, work: Path, prefix: np.ndarray | None = None,
         objective: Objective | None = None) -> tuple[list[list[str]], str]:
    """Deal the sequences into ``len(sizes)`` parts of those sizes, chunk by chunk, balancing the
    columns of ``objective`` (default: the params' own); each part's
    share of a chunk is written to ``work``. Return each part's files and the file of the corpus's
    bin edges and (cluster, bin) tokens. A frozen ``prefix`` (sequence ids in stream order, the
    stream's first stretches) goes to the parts whose stretches hold it, counted in the deal's totals
    from the start, and the part it ends in is dealt what the parts it fills lack (:class:`Deal`);
    the meta file then holds what that part continues from (:func:`_lead_in`)."""
    objective = objective or corpus.params.objective_weights()
    state, offsets, pieces = None, None, [[] for _ in sizes]
    frozen_ids, frozen_part, reserved = _frozen_parts(np.zeros(0, np.int64) if prefix is None else prefix, sizes)
    joint, found = np.zeros((corpus.n_clusters, corpus.bin_edges.size + 1)), 0
    for c, (a, b) in enumerate(corpus.ranges(DEAL_CHUNK)):
        f, chunk_joint = corpus.chunk(a, b)
        joint += chunk_joint
        chars = objective.matrix(f)
        offsets = offsets or _offsets(chars, objective)
        x = _deal_matrix(chars, offsets)
        state = state or Deal(sizes, x.n_cols, reserved)
        at = np.minimum(np.searchsorted(frozen_ids, f.sequence_ids), max(0, frozen_ids.size - 1))
        forced = np.where(frozen_ids[at] == f.sequence_ids, frozen_part[at], -1) if frozen_ids.size else None
        part = state.rows(x, f.lengths, forced)
        found += 0 if forced is None else int(np.count_nonzero(forced >= 0))
        for p in range(sizes.size):
            rows = np.flatnonzero(part == p)
            if rows.size:
                pieces[p].append(str(save_piece(f.take_rows(rows), work / f"part{p:05d}.{c:06d}.npz")))
    if found != frozen_ids.size:
        raise StrataInputError(f"{frozen_ids.size - found} frozen sequences are missing from the packing",
                               fix="re-materialize sequences (it keeps the frozen sequences)")
    meta = work / "corpus.npz"
    with atomic_path(meta) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, bin_edges=corpus.bin_edges, joint=joint, **_lead_in(state, offsets, objective))
    return pieces, str(meta)


def _lead_in(state: Deal | None, offsets: dict[str, tuple[int, int]] | None, objective: Objective) -> dict[str, np.ndarray]:
    """The parts a prefix fills, as the part that continues them reads them (``greedy.LeadIn``):
    per token family their column totals (``lead_in.<family>``), their tokens and sequences, and that
    part (``lead_in_part``); nothing when no part is filled."""
    if state is None or state.first_open == 0:
        return {}
    X, S = state.lead_in()
    out = {f"lead_in.{fam.name}": X[a : a + w] for fam in objective.families if fam.level == "tokens" for a, w in [offsets[fam.name]]}
    return {**out, "lead_in_tokens": np.float64(S), "lead_in_sequences": np.int64(state.counts_before_open()),
            "lead_in_part": np.int64(state.first_open)}


def _frozen_slices(prefix: np.ndarray | None, sizes: np.ndarray, meta: str, work: Path) -> list[str | None]:
    """Each part's stretch of the frozen prefix as a ``.npz`` under ``work`` (``ids``; the part that
    continues the parts the prefix fills also their lead-in, :func:`_lead_in`); None: a part the
    prefix does not reach."""
    out: list[str | None] = [None] * sizes.size
    if prefix is None:
        return out
    with np.load(meta, allow_pickle=False) as z:
        lead = {k: z[k] for k in z.files if k.startswith("lead_in")}
    lead_part = int(lead.pop("lead_in_part")) if lead else -1
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    for p, a in enumerate(starts):
        if a < prefix.size or p == lead_part:
            path = work / f"frozen{p:05d}.npz"
            with atomic_path(path) as tmp, open(tmp, "wb") as fh:
                np.savez(fh, ids=prefix[a : a + sizes[p]], **(lead if p == lead_part else {}))
            out[p] = str(path)
    return out


def order_parts(strategy: str, corpus: Corpus | SegmentFiles, parts: int, seed: int, work: Path, *, engine: str = "local",
                ray_cfg: Any = None, prefix: np.ndarray | None = None) -> tuple[list[Path], np.ndarray]:
    """The deal, then each part ordered by a worker (a process of its own, or a Ray task); each
    part's order (sequence ids) as a file under ``work``, and the parts' sizes. A frozen ``prefix``
    (sequence ids) starts the stream: its stretches start the parts they fall in (the layout must
    be ``stretches``), whose strategy's ``order_after`` continues them."""
    params, spec = corpus.params, strategies.spec(strategy)
    sizes = part_sizes(corpus.n_sequences, parts, params.batch_size, spec.part_layout)
    if prefix is not None and (spec.part_layout != "stretches" or spec.order_after is None or spec.derived is not None):
        raise StrataInputError(f"{strategy!r} does not continue a frozen prefix part by part",
                               fix="freeze 'greedy' when the packing needs parts, or set order_part_bytes: 0 (one part)")
    pieces, meta = deal(corpus, sizes, work, prefix, spec.part_objective(params) if spec.part_objective is not None else None)
    frozen = _frozen_slices(prefix, sizes, meta, work)
    outs = [work / f"order{p:05d}.npy" for p in range(parts)]
    shards = [Shard(f"{strategy} part {p}", (strategy, params, seed, pieces[p], meta, str(outs[p]), frozen[p]), (outs[p],))
              for p in range(parts)]
    retries = ray_cfg.max_retries if ray_cfg is not None else 3
    map_tasks(order_part, shards, engine=engine, ray_cfg=ray_cfg, workers=min(parts, len(os.sched_getaffinity(0))), retries=retries)
    for p, out in enumerate(outs):
        n = np.load(out, mmap_mode="r").size
        if n != sizes[p] and not spec.realizes_mixture:  # a schedule repeats and omits sequences
            raise RuntimeError(f"part {p} of {strategy!r} came back with {n} sequences, not {sizes[p]}")
    return outs, sizes


def _work(strategy: str, seed: int, work_dir: Path | None) -> Path:
    base = Path(work_dir) if work_dir is not None else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{strategy}-{seed}-", dir=base))


def partitioned_ids(strategy: str, corpus: Corpus, parts: int, seed: int, *, engine: str = "local", ray_cfg: Any = None,
                    work_dir: Path | None = None, prefix: np.ndarray | None = None) -> np.ndarray:
    """The strategy's order (sequence ids) of ``corpus`` in ``parts`` parts: :func:`partitioned_order`'s ids."""
    return partitioned_order(strategy, corpus, parts, seed, engine=engine, ray_cfg=ray_cfg, work_dir=work_dir, prefix=prefix)[0]


def partitioned_order(strategy: str, corpus: Corpus, parts: int, seed: int, *, engine: str = "local", ray_cfg: Any = None,
                      work_dir: Path | None = None,
                      prefix: np.ndarray | None = None) -> tuple[np.ndarray, list[dict[str, np.ndarray]] | None]:
    """The strategy's order (sequence ids) of ``corpus`` in ``parts`` parts: the deal, each part
    ordered by a worker (a process of its own, or a Ray task), the parts joined in the strategy's
    ``part_layout`` and, for a strategy derived from another's order (``greedy_block_shuffle``), its
    function of it; and the parts' plans (:func:`load_plans`: a schedule's, else None)."""
    spec, params = strategies.spec(strategy), corpus.params
    work = _work(strategy, seed, work_dir)
    try:
        outs, _ = order_parts(strategy, corpus, parts, seed, work, engine=engine, ray_cfg=ray_cfg, prefix=prefix)
        orders = [np.load(out, allow_pickle=False) for out in outs]
        plans = load_plans(outs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ids = stream_of(orders, params.batch_size, spec.part_layout)
    return (np.asarray(spec.derived[1](ids, params, seed)) if spec.derived is not None else ids), plans


def partitioned_stream(strategy: str, corpus: Corpus | SegmentFiles, parts: int, seed: int, out: Path, *, engine: str = "local",
                       ray_cfg: Any = None, work_dir: Path | None = None, prefix: np.ndarray | None = None) -> Path:
    """:func:`partitioned_ids` written to the ``.npy`` file ``out`` (int64 sequence ids in stream
    order) as the parts' orders are joined, a few batches at a time: no process holds
    the stream, the corpus's features or its segments (a :class:`SegmentFiles` corpus)."""
    if strategies.spec(strategy).derived is not None:
        raise StrataInputError(f"{strategy!r} is a function of a whole order; its stream is not written part by part",
                               fix="stream 'greedy' or 'greedy_curriculum'")
    work = _work(strategy, seed, work_dir)
    try:
        outs, _ = order_parts(strategy, corpus, parts, seed, work, engine=engine, ray_cfg=ray_cfg, prefix=prefix)
        return write_stream(outs, corpus.params.batch_size, Path(out), strategies.spec(strategy).part_layout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
