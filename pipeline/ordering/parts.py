"""The pieces of a partitioned ordering: how many parts, the stratified deal, the parts' files, the stream.

A corpus too large for one process's ordering is dealt into P parts (:func:`n_parts`, from
``order_part_bytes``). The deal (:class:`Deal`) goes through the sequences once and gives each to
the part whose column totals lag the most where this sequence has tokens, among the parts not
``SLACK`` = one sequence ahead of their share of the sequences dealt (so the parts' sequence
counts stay within one of their shares, and end exactly at :func:`part_sizes`): the part minimizing
``sum_g x_sg (X_pg - w_p T_g)``,
the increase of ``sum_p ||X_p - w_p T||^2`` (X_p: the part's totals over every column of the
objective, the characteristic families of ``pipeline.ordering.characteristics``; T: the totals
dealt so far; w_p: the part's share of the sequences). So every part holds the global composition
of every family the objective names, clusters, length bins, documents columns and the stationary
families' classes, to within one or two sequences' worth of tokens per group (a greedy vector
balancing: ``tests/test_partitioned.py`` holds it to two).

Each part is then ordered by the strategy as if it were the whole corpus, and the parts make the
global stream in one of two layouts (:data:`LAYOUTS`):

- ``stretches`` (the greedy's): part p is the stream's p-th stretch of whole batches, its order
  as it is (:func:`stream_of`). Every part holds the corpus's composition, so the stream's
  cumulative error at a part's edge is the deal's, a sequence or two per group, and inside part p it
  is that plus part p's own greedy's: every prefix and window is one greedy's, whatever P is.
- ``batches`` (a curriculum's, whose every part holds the whole curriculum at its share of the
  tokens): batch b of the stream is part (b mod P)'s batch (b div P) (:func:`interleave`). Every
  prefix holds about equal stretches of every part, each on target, but the parts' greedies, alike
  in composition, make alike choices: the prefixes shorter than about K / batch rounds of P batches
  add P alike errors (docs/scale.md, "Stretches or batch by batch", has both measured).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numba import njit

from pipeline.ordering.features import Csr, SequenceFeatures
from pipeline.storage.atomic import atomic_path

# a part's worker at its peak per sequence, features, instance and imports included: 1,299 MiB for a part
# of 2,500,000 sequences (K = 1,000, L = 2,048; benchmarks/results/partitioned_order_10m.json), 545 bytes
# a sequence; a part holds order_part_bytes / this
PART_BYTES_PER_SEQUENCE = 545


def n_parts(n_sequences: int, order_part_bytes: int, batch: int) -> int:
    """P: the fewest parts whose orderings each stay under ``order_part_bytes`` (0: one part), at
    most one a full batch (a part holds whole batches)."""
    if order_part_bytes <= 0:
        return 1
    p = -(-int(n_sequences) * PART_BYTES_PER_SEQUENCE // int(order_part_bytes))
    return int(max(1, min(p, n_sequences // max(1, batch))))


LAYOUTS = ("stretches", "batches")  # how the parts' orders make the stream (the module docstring)


def part_sizes(n_sequences: int, parts: int, batch: int, layout: str = "stretches") -> np.ndarray:
    """Sequences of each part, whole batches but for the stream's last, incomplete one.
    ``stretches``: the full batches split as evenly as possible (the first parts one more), the
    incomplete batch to the last part. ``batches``: part p holds the stream's batches b = p, p + P,
    ... (batch b is part (b mod P)'s batch (b div P)), the incomplete batch to the part whose turn it is."""
    full, rest = divmod(int(n_sequences), int(batch))
    p = np.arange(parts)
    if layout == "stretches":
        q, r = divmod(full, parts)
        sizes = (q + (p < r)) * batch
        sizes[-1] += rest
        return sizes.astype(np.int64)
    sizes = (full - p + parts - 1) // parts * batch
    sizes[full % parts] += rest
    return sizes.astype(np.int64)


def stream_of(orders: list[np.ndarray], batch: int, layout: str = "stretches") -> np.ndarray:
    """The stream of the parts' orders (sized by :func:`part_sizes` with ``layout``)."""
    if layout == "stretches":
        return np.concatenate([np.asarray(o, dtype=np.int64) for o in orders]) if orders else np.zeros(0, dtype=np.int64)
    return interleave(orders, batch)


def interleave(orders: list[np.ndarray], batch: int) -> np.ndarray:
    """The ``batches`` layout's stream of the parts' orders: batch b = part (b mod P)'s batch (b div P)
    while every part has one; a part whose order is shorter (a schedule's, which repeats and omits
    sequences) leaves its turns to the others: round r holds every part's batch r there is, in part order."""
    sizes = np.array([o.size for o in orders], dtype=np.int64)
    out = np.empty(int(sizes.sum()), dtype=np.int64)
    starts = round_starts(sizes, batch, 0, -(-int(sizes.max(initial=0)) // batch))
    for p, order in enumerate(orders):
        i = np.arange(order.size)
        out[starts[i // batch, p] + i % batch] = order
    return out


def round_starts(sizes: np.ndarray, batch: int, r0: int, r1: int) -> np.ndarray:
    """((r1 - r0) x P) where part p's batch r starts in the ``batches`` layout's stream: after every
    part's sequences in rounds before r and the parts before p's in round r."""
    r = np.arange(r0, r1, dtype=np.int64)[:, None]
    before = np.minimum(sizes[None, :], r * batch).sum(axis=1, keepdims=True)
    this = np.clip(sizes[None, :] - r * batch, 0, batch)
    return before + np.cumsum(this, axis=1) - this


def _npy_reader(path: Path) -> tuple[np.dtype, int, int]:
    """(dtype, length, data offset) of a 1-D ``.npy`` file, read from its header."""
    with open(path, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(fh)
        return dtype, int(shape[0]), fh.tell()


def write_stream(orders: list[Path], batch: int, out: Path, layout: str = "stretches", rounds: int = 1 << 12) -> Path:
    """:func:`stream_of` the parts' order files (``.npy``) into the
    ``.npy`` file ``out`` (atomically), ``rounds`` batches of a part (``stretches``) or of every part
    (``batches``) at a time: neither the stream nor a part's order is ever held whole."""
    readers = [_npy_reader(p) for p in orders]
    total = sum(n for _, n, _ in readers)
    step = rounds * batch
    with atomic_path(Path(out)) as tmp, open(tmp, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<i8", "fortran_order": False, "shape": (total,)})
        if layout == "stretches":
            for path, (dtype, n, offset) in zip(orders, readers):
                for a in range(0, n, step):
                    got = np.fromfile(path, dtype=dtype, count=min(step, n - a), offset=offset + a * dtype.itemsize)
                    fh.write(got.astype("<i8", copy=False).tobytes())
            return Path(out)
        sizes = np.array([n for _, n, _ in readers], dtype=np.int64)
        for r0 in range(0, -(-int(sizes.max(initial=0)) // batch), rounds):
            starts = round_starts(sizes, batch, r0, r0 + rounds + 1)  # the row past the last: where the next chunk starts
            lo = int(starts[0, 0])
            buf = np.empty(int(starts[-1, 0]) - lo, dtype=np.int64)
            for p, (path, (dtype, n, offset)) in enumerate(zip(orders, readers)):
                a, b = r0 * batch, min(n, r0 * batch + step)
                if a >= b:
                    continue
                got = np.fromfile(path, dtype=dtype, count=b - a, offset=offset + a * dtype.itemsize)
                i = np.arange(a, b)
                buf[starts[i // batch - r0, p] + i % batch - lo] = got
            fh.write(buf.tobytes())
    return Path(out)


SLACK = 1.0  # a part this many sequences ahead of its share of those dealt takes no more until the others catch up


class Deal:
    """The deal's running state, O(P x G) numbers: each part's column totals ``X`` and tokens ``S``,
    the totals dealt ``T``, each part's sequences and quota. ``reserved``: each part's sequences
    given to it beforehand (a frozen prefix's, :meth:`rows`' ``forced``), counted in ``X`` and ``T``
    as they come and left out of its quota and of the one-sequence slack, which paces the dealt ones
    alone. The parts a prefix fills (no quota left) lead into the part it ends in (``lead``): that
    part is scored on their totals and its own against their shares and its own together, so it
    receives what the prefix lacks."""

    def __init__(self, sizes: np.ndarray, n_cols: int, reserved: np.ndarray | None = None):
        sizes = np.asarray(sizes, dtype=np.int64)
        self.reserved = np.zeros_like(sizes) if reserved is None else np.asarray(reserved, dtype=np.int64)
        self.quota = sizes - self.reserved
        self.share = self.quota / float(max(1, self.quota.sum()))
        self.weight = sizes / float(sizes.sum())
        self.first_open = int(np.argmax(self.quota > 0)) if np.any(self.quota > 0) else 0
        self.lead = np.arange(sizes.size)
        self.lead[: self.first_open] = self.first_open
        self.group_weight = self.weight.copy()
        self.group_weight[self.first_open] = self.weight[: self.first_open + 1].sum()
        self.X = np.zeros((self.quota.size, n_cols))
        self.G = np.zeros((self.quota.size, n_cols))  # X summed into each row's lead part (the score's totals)
        self.S = np.zeros(self.quota.size)
        self.T = np.zeros(n_cols)
        self.counts = np.zeros(self.quota.size, dtype=np.int64)

    def rows(self, x: Csr, lengths: np.ndarray, forced: np.ndarray | None = None) -> np.ndarray:
        """The part of each row of ``x`` (the rows' objective columns, in this deal's column order;
        ``lengths``: their tokens); a row whose ``forced`` part is >= 0 goes there."""
        out = np.empty(x.n_rows, dtype=np.int64)
        forced = np.full(x.n_rows, -1, dtype=np.int64) if forced is None else np.asarray(forced, dtype=np.int64)
        _deal(x.indptr, x.indices, np.asarray(x.data, np.float64), np.asarray(lengths, np.float64), forced, self.quota, self.share,
              self.group_weight, self.lead, self.counts, self.X, self.G, self.S, self.T, SLACK, out)
        return out

    def lead_in(self) -> tuple[np.ndarray, float]:
        """The column totals and tokens of the parts a prefix fills (those before :attr:`first_open`)."""
        return self.X[: self.first_open].sum(axis=0), float(self.S[: self.first_open].sum())

    def counts_before_open(self) -> int:
        """The sequences of the parts a prefix fills: their sizes, all reserved."""
        return int(self.reserved[: self.first_open].sum())


@njit(cache=True)
def _deal(indptr, indices, data, lengths, forced, quota, share, weight, lead, counts, X, G, S, T, slack, out):
    """Each sequence to the part minimizing sum_g x_sg (G_pg - w_p T_g) (G_p: the totals led into
    part p, w_p their share of the stream) among those with room left and fewer than ``slack``
    sequences ahead of their share of the sequences dealt (ties: the lowest part); a ``forced`` one
    to its part. One part always qualifies: the one furthest behind is behind by >= 0 and has room."""
    dealt = counts.sum()
    for r in range(indptr.size - 1):
        for k in range(indptr[r], indptr[r + 1]):
            T[indices[k]] += data[k]
        at = forced[r]
        if at < 0:
            best = np.inf
            for p in range(quota.size):
                if counts[p] >= quota[p] or counts[p] - share[p] * dealt >= slack:
                    continue
                score = 0.0
                for k in range(indptr[r], indptr[r + 1]):
                    score += data[k] * (G[p, indices[k]] - weight[p] * T[indices[k]])
                if at < 0 or score < best:
                    best, at = score, p
            counts[at] += 1
            dealt += 1
        out[r] = at
        S[at] += lengths[r]
        for k in range(indptr[r], indptr[r + 1]):
            X[at, indices[k]] += data[k]
            G[lead[at], indices[k]] += data[k]


def _csr_arrays(name: str, x: Csr) -> dict[str, np.ndarray]:
    return {f"{name}.indptr": x.indptr, f"{name}.indices": x.indices, f"{name}.data": x.data, f"{name}.n_cols": np.int64(x.n_cols)}


def save_piece(f: SequenceFeatures, path: Path) -> Path:
    """One chunk's sequences of one part, as a ``.npz`` (atomically): ids, lengths, spans and matrices."""
    arrays = {"sequence_ids": f.sequence_ids, "lengths": f.lengths, "spans": f.spans, **_csr_arrays("clusters", f.clusters),
              **_csr_arrays("bins", f.bins)}
    for name, x in f.columns.items():
        arrays.update(_csr_arrays(f"column.{name}", x))
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
    return path


def _piece_size(path: Path, csr_names: list[str]) -> tuple[int, dict[str, int]]:
    """A piece's rows and each matrix's entries, from its row pointers."""
    with np.load(path, allow_pickle=False) as z:
        return int(z["sequence_ids"].size), {n: int(z[f"{n}.indptr"][-1]) for n in csr_names}


def load_part(paths: list[Path], bin_edges: np.ndarray, joint: np.ndarray) -> SequenceFeatures:
    """A part's features from its pieces (in chunk order: its sequence ids ascend), with the
    corpus's length-bin edges and (cluster, bin) tokens, as ``SequenceFeatures.take_rows`` keeps them.
    The pieces are read twice, their sizes and then their arrays into the part's: the part's arrays
    are allocated once, never beside a list of every piece's."""
    with np.load(paths[0], allow_pickle=False) as z:
        dtypes = {k: z[k].dtype for k in z.files}
    columns = sorted({k[len("column."):].rsplit(".", 1)[0] for k in dtypes if k.startswith("column.")})
    names = ["clusters", "bins", *(f"column.{c}" for c in columns)]
    sizes = [_piece_size(path, names) for path in paths]
    n = sum(rows for rows, _ in sizes)
    flat = {k: np.empty(n, dtype=dtypes[k]) for k in ("sequence_ids", "lengths", "spans")}
    csr = {m: (np.zeros(n + 1, dtype=np.int64), np.empty(sum(e[m] for _, e in sizes), dtype=dtypes[f"{m}.indices"]),
               np.empty(sum(e[m] for _, e in sizes), dtype=dtypes[f"{m}.data"])) for m in names}
    at, ends = 0, dict.fromkeys(names, 0)
    for path, (rows, entries) in zip(paths, sizes):
        with np.load(path, allow_pickle=False) as z:
            for k, out in flat.items():
                out[at : at + rows] = z[k]
            for m, (indptr, indices, data) in csr.items():
                indptr[at + 1 : at + rows + 1] = z[f"{m}.indptr"][1:] + ends[m]
                indices[ends[m] : ends[m] + entries[m]] = z[f"{m}.indices"]
                data[ends[m] : ends[m] + entries[m]] = z[f"{m}.data"]
                ends[m] += entries[m]
        at += rows
    with np.load(paths[0], allow_pickle=False) as z:
        widths = {m: int(z[f"{m}.n_cols"]) for m in names}
    mat = {m: Csr(*csr[m], widths[m]) for m in names}
    return SequenceFeatures(flat["sequence_ids"], mat["clusters"], mat["bins"], flat["lengths"], bin_edges, joint, flat["spans"],
                            {c: mat[f"column.{c}"] for c in columns})
