"""A frozen prefix: the first P sequences of a strategy's stream kept byte-identical while the corpus grows.

With ``freeze_prefix: P`` a materialized ordering records its first P positions under the data
root (``frozen/<strategy>.parquet`` and ``frozen/<strategy>.json``, :func:`capture`): per position,
the segments of its sequence with each document named by its corpus ``id``, ``content_hash`` and
shard file (doc ids may be renumbered by a rerun, these may not), and the SHA-256 of the prefix's
token rows. A rerun packs with :func:`pack_frozen`: every frozen sequence keeps its segments (and
its sequence id whenever the new packing has that many sequences, always after an append); the
tokens no frozen sequence holds (new shards' documents, the unconsumed remainder, parts of
documents cut at a frozen sequence's edge) are packed into new sequences with the same packing
variant and seed. The frozen sequences' tokens are checked against the recorded digest, so a
changed tokenizer or an edited document inside the prefix stops the run with the fix.

Freezing applies to sequence-level strategies (they permute the base packing, whose frozen
sequences are kept); document-level and training-time strategies repack on their own and refuse
``freeze_prefix`` (``pipeline/config.py``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.packing.pack import PACKED_SEGMENT_SCHEMA, Packing, SequenceStore, pack
from pipeline.storage.atomic import write_json, write_parquet

RECORD_SCHEMA = {
    "position": pl.Int64, "sequence_id": pl.Int64, "seq_token_start": pl.Int32, "id": pl.String,
    "content_hash": pl.String, "shard": pl.String, "doc_token_start": pl.Int64, "n_tokens": pl.Int32, "eos_added": pl.Boolean,
}
UNFREEZE = "set freeze_prefix: 0 (unfreeze: the stream is re-packed and re-ordered), or remove frozen/<strategy>.* for one strategy"


@dataclass
class FrozenPrefix:
    """One strategy's frozen prefix: ``sequences`` = P positions, their segments (``RECORD_SCHEMA``),
    and the meta (seq_len, packing, tokens_sha256 of the P x L token rows, the version chain)."""

    strategy: str
    sequences: int
    segments: pl.DataFrame
    meta: dict = field(default_factory=dict)

    @property
    def sequence_ids(self) -> np.ndarray:
        """The sequence id at each frozen position (the current packing's ids)."""
        first = self.segments.group_by("position").agg(pl.col("sequence_id").first()).sort("position")
        return first["sequence_id"].to_numpy()


def record_paths(layout, strategy: str) -> tuple[Path, Path]:
    return layout.inside("frozen", f"{strategy}.parquet"), layout.inside("frozen", f"{strategy}.json")


def load(layout, strategy: str) -> FrozenPrefix | None:
    seg_path, meta_path = record_paths(layout, strategy)
    if not (seg_path.exists() and meta_path.exists()):
        return None
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    return FrozenPrefix(strategy, int(meta["frozen_sequences"]), pl.read_parquet(seg_path), meta)


def load_all(layout) -> list[FrozenPrefix]:
    folder = layout.root / "frozen"
    names = sorted(p.name.removesuffix(".json") for p in folder.glob("*.json")) if folder.is_dir() else []
    return [r for r in (load(layout, n) for n in names) if r is not None]


def save(layout, rec: FrozenPrefix) -> list[Path]:
    seg_path, meta_path = record_paths(layout, rec.strategy)
    return [write_parquet(rec.segments.select(list(RECORD_SCHEMA)).cast(RECORD_SCHEMA), seg_path),
            write_json({**rec.meta, "strategy": rec.strategy, "frozen_sequences": rec.sequences}, meta_path)]


def unfreeze(layout, connect=None) -> None:
    """``freeze_prefix: 0``: forget every frozen prefix (the records and, given a warehouse
    connection (``pipeline.stage.Connect``), the rows of ``ordering_frozen_prefix``)."""
    folder = layout.root / "frozen"
    if not folder.is_dir():
        return
    shutil.rmtree(folder)
    if connect is not None:
        with connect() as con:
            if con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'ordering_frozen_prefix'").fetchone()[0]:
                con.execute("DELETE FROM ordering_frozen_prefix")


def doc_keys(layout) -> pl.DataFrame:
    """doc_id -> (id, content_hash, shard file name) of the current corpus."""
    manifest = pl.read_parquet(layout.shards, columns=["shard", "path"]).with_columns(
        pl.col("path").map_elements(lambda p: Path(p).name, return_dtype=pl.String).alias("shard_name"))
    docs = pl.read_parquet(layout.corpus, columns=["doc_id", "id", "content_hash", "shard"])
    return docs.join(manifest.select("shard", "shard_name"), on="shard", how="left").select(
        "doc_id", "id", "content_hash", pl.col("shard_name").fill_null("").alias("shard"))


def prefix_digest(store: SequenceStore, ids: np.ndarray, dtype: np.dtype) -> str:
    """SHA-256 of the token rows of ``ids`` in that order (the bytes every export writes first)."""
    h = hashlib.sha256()
    for a in range(0, ids.size, 1024):
        h.update(store.masked_batch(ids[a : a + 1024])[0].astype(dtype).tobytes())
    return h.hexdigest()


def capture(layout, strategy: str, order: np.ndarray, segments: pl.DataFrame, n_frozen: int, store: SequenceStore,
            dtype: np.dtype, seq_len: int, packing: str, previous: FrozenPrefix | None) -> FrozenPrefix:
    """The record of ``order``'s first ``n_frozen`` positions (fewer when the stream is shorter);
    ``previous``'s positions must be its prefix (they are, once the ordering continued it)."""
    p = int(min(n_frozen, order.size))
    ids = np.asarray(order[:p], dtype=np.int64)
    pos = pl.DataFrame({"sequence_id": ids, "position": np.arange(p, dtype=np.int64)})
    seg = segments.join(pos, on="sequence_id").join(doc_keys(layout), on="doc_id", how="left")
    if "eos_added" not in seg.columns:
        seg = seg.with_columns(eos_added=pl.lit(False))
    seg = seg.sort("position", "seq_token_start").select(list(RECORD_SCHEMA)).cast(RECORD_SCHEMA)
    meta = dict(previous.meta) if previous is not None else {"chain": []}
    if previous is not None:
        keep = min(p, previous.sequences)
        cols = ["position", "seq_token_start", "id", "content_hash", "doc_token_start", "n_tokens"]
        if not seg.filter(pl.col("position") < keep).select(cols).equals(previous.segments.filter(pl.col("position") < keep).select(cols)):
            raise StrataInputError(f"orderings[{strategy}] does not start with its frozen prefix", path=record_paths(layout, strategy)[0],
                                   fix=f"re-materialize orderings[{strategy}] (it continues the frozen prefix), or {UNFREEZE}")
    meta.update(seq_len=int(seq_len), packing=packing, tokens_sha256=prefix_digest(store, ids, dtype))
    return FrozenPrefix(strategy, p, seg, meta)


def _current(rec: FrozenPrefix, keys: pl.DataFrame) -> pl.DataFrame:
    """The record's segments with current doc ids; a frozen document edited or removed stops the run."""
    seg = rec.segments.join(keys.select("id", "content_hash", "doc_id"), on=["id", "content_hash"], how="left")
    gone = seg.filter(pl.col("doc_id").is_null())
    if gone.height:
        row = gone.row(0, named=True)
        same_id = keys.filter(pl.col("id") == row["id"]).height > 0
        raise StrataInputError(
            f"shard {row['shard']}: document {row['id']!r} is {'edited' if same_id else 'deleted'} but lies in the frozen prefix of "
            f"orderings[{rec.strategy}] (position {row['position']} of {rec.sequences}; {gone['id'].n_unique()} such document(s))",
            fix=f"restore that document (edit or delete only documents of the suffix), or {UNFREEZE}")
    return seg


def _uncovered(frozen: pl.DataFrame, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(doc, start, length) of every token interval no frozen segment holds, by doc and start."""
    seg = frozen.sort("doc_id", "doc_token_start")
    d, s, n = (seg[c].to_numpy().astype(np.int64) for c in ("doc_id", "doc_token_start", "n_tokens"))
    ends = s + n
    first = np.r_[True, d[1:] != d[:-1]] if d.size else np.zeros(0, bool)
    last = np.r_[d[1:] != d[:-1], True] if d.size else np.zeros(0, bool)
    free = np.setdiff1d(np.arange(lengths.size, dtype=np.int64), d)
    gap_doc = np.concatenate([d, d[last], free])  # before each segment, after each doc's last one, whole free docs
    gap_a = np.concatenate([np.where(first, 0, np.r_[0, ends[:-1]]), ends[last], np.zeros(free.size, np.int64)])
    gap_b = np.concatenate([s, lengths[d[last]], lengths[free]])
    keep = gap_b > gap_a
    o = np.lexsort((gap_a[keep], gap_doc[keep]))
    return gap_doc[keep][o], gap_a[keep][o], (gap_b - gap_a)[keep][o]


def _ids(frozen_ids: np.ndarray, n_new: int) -> tuple[np.ndarray, np.ndarray]:
    """(new id of each frozen id, id of each new sequence): frozen ids are kept when they fit in
    the new count, new sequences fill the free ids in order; else frozen ones take 0..F-1."""
    total = frozen_ids.size + n_new
    if frozen_ids.size == 0 or frozen_ids.max() < total:
        return frozen_ids, np.setdiff1d(np.arange(total, dtype=np.int64), frozen_ids)
    return np.arange(frozen_ids.size, dtype=np.int64), np.arange(frozen_ids.size, total, dtype=np.int64)


def frozen_docs(records: list[FrozenPrefix], keys: pl.DataFrame) -> np.ndarray:
    """The doc ids with tokens in a frozen prefix (sorted, unique)."""
    ids = [_current(r, keys)["doc_id"].to_numpy() for r in records]
    return np.unique(np.concatenate(ids)).astype(np.int64) if ids else np.zeros(0, np.int64)


def pack_frozen(records: list[FrozenPrefix], keys: pl.DataFrame, stream_lengths: np.ndarray, variant: str, atom: float | None,
                seq_len: int, packing: str, seed: int, leave_out: np.ndarray | None = None) -> tuple[Packing, list[FrozenPrefix]]:
    """The packing that keeps every record's sequences and packs the rest (see the module docstring),
    but the documents ``leave_out`` marks (boolean per doc id; none of them in a frozen prefix: the
    clean stage's removals); and the records with their sequences' ids in it."""
    lengths = np.asarray(stream_lengths, dtype=np.int64)
    for rec in records:
        if rec.meta.get("seq_len") != seq_len or rec.meta.get("packing") != packing:
            raise StrataInputError(
                f"orderings[{rec.strategy}] froze sequences of seq_len {rec.meta.get('seq_len')} packed with "
                f"{rec.meta.get('packing')!r}; this run packs seq_len {seq_len} with {packing!r}",
                fix=f"restore seq_len and packing, or {UNFREEZE}")
    current = [_current(r, keys) for r in records]
    frozen = pl.concat([c.select("sequence_id", "seq_token_start", "doc_id", "doc_token_start", "n_tokens", "eos_added")
                        for c in current]).unique(maintain_order=True) if current else pl.DataFrame(schema=PACKED_SEGMENT_SCHEMA)
    frozen = frozen.cast({k: v for k, v in PACKED_SEGMENT_SCHEMA.items()})
    over = frozen.filter(pl.col("doc_token_start") + pl.col("n_tokens") > pl.Series(lengths)[frozen["doc_id"]])
    if over.height or frozen.select("doc_id", "doc_token_start").is_duplicated().any():
        raise StrataInputError("the documents of the frozen prefix no longer have the tokens it holds (the tokenizer changed?)",
                               fix=f"set tokenizer: to the fixed tokenizer the prefix was packed with, or {UNFREEZE}")
    v_doc, v_start, v_len = _uncovered(frozen, lengths)
    if leave_out is not None:
        if leave_out[frozen["doc_id"].to_numpy()].any():
            raise ValueError("a document to leave out lies in a frozen prefix")
        keep = ~leave_out[v_doc]
        v_doc, v_start, v_len = v_doc[keep], v_start[keep], v_len[keep]
    rank = np.empty(lengths.size, np.int64)
    rank[np.random.default_rng(seed).permutation(lengths.size)] = np.arange(lengths.size)
    o = np.lexsort((v_start, rank[v_doc]))
    v_doc, v_start, v_len = v_doc[o], v_start[o], v_len[o]
    new = pack(variant, np.arange(v_len.size), v_len, seq_len, atom_multiple=atom, seed=seed) if v_len.size else None
    old_ids = np.unique(frozen["sequence_id"].to_numpy())
    n_new = new.n_sequences if new is not None else 0
    kept_ids, new_ids = _ids(old_ids, n_new)
    remap = dict(zip(old_ids.tolist(), kept_ids.tolist()))
    frozen = frozen.with_columns(pl.col("sequence_id").replace_strict(remap, return_dtype=pl.Int64))
    parts = [frozen]
    if new is not None:
        s = new.segments
        v = s["doc_id"].to_numpy()
        parts.append(s.with_columns(sequence_id=pl.Series(new_ids[s["sequence_id"].to_numpy()]), doc_id=pl.Series(v_doc[v]),
                                    doc_token_start=pl.Series(v_start[v] + s["doc_token_start"].to_numpy())))
    segments = pl.concat([p.select(list(PACKED_SEGMENT_SCHEMA)).cast(PACKED_SEGMENT_SCHEMA) for p in parts])
    segments = segments.sort("sequence_id", "seq_token_start")
    n_seq = int(old_ids.size + n_new)
    kept = int(segments["n_tokens"].cast(pl.Int64).sum() or 0)  # Int32 sums wrap past 2^31 tokens
    eos = int(segments["eos_added"].sum() or 0)
    total = int(lengths.sum()) - (int(lengths[leave_out].sum()) if leave_out is not None else 0)  # what was to be packed
    packed = Packing(segments, n_seq, seq_len, total, n_seq * seq_len, total - kept, variant,
                     None if atom is None else int(round(atom * seq_len)), eos, n_seq * seq_len - kept - eos)
    updated = [FrozenPrefix(r.strategy, r.sequences, r.segments.with_columns(
        pl.col("sequence_id").replace_strict(remap, return_dtype=pl.Int64)), r.meta) for r in records]
    return packed, updated


def verify(records: list[FrozenPrefix], store: SequenceStore, dtype: np.dtype) -> None:
    """Each record's prefix rows hash to the digest recorded when it was frozen."""
    for rec in records:
        if prefix_digest(store, rec.sequence_ids, dtype) != rec.meta.get("tokens_sha256"):
            raise StrataInputError(f"the tokens of orderings[{rec.strategy}]'s frozen prefix changed (the tokenizer or a document's text?)",
                                   fix=f"set tokenizer: to the fixed tokenizer the prefix was packed with, or {UNFREEZE}")


def frozen_count(value: int | str) -> int:
    """Sequences ``freeze_prefix`` freezes: the number itself; ``consumed:STEPSxGLOBAL_BATCH`` = their
    product; ``consumed:<run dir or its stream.parquet>`` = the sequences that run consumed."""
    if isinstance(value, int):
        return value
    what = value.removeprefix("consumed:")
    steps, sep, batch = what.replace("×", "x").partition("x")
    if sep and steps.strip().isdigit() and batch.strip().isdigit():
        return int(steps) * int(batch)
    path = Path(what).expanduser()
    path = path / "stream.parquet" if path.is_dir() else path
    if not path.is_file():
        raise StrataInputError(f"freeze_prefix {value!r}: no training stream at {path}", path=path,
                               fix="name a training run's folder (runs/<strategy>/seed<k>) or its stream.parquet, "
                                   "or use consumed:STEPSxGLOBAL_BATCH")
    try:
        return pl.read_parquet(path, columns=["position"]).height
    except Exception as exc:  # not Parquet, or no position column
        raise StrataInputError(f"freeze_prefix {value!r}: {path} is not a training run's stream.parquet ({type(exc).__name__})",
                               path=path, fix="name a training run's folder (runs/<strategy>/seed<k>) or its stream.parquet, "
                                              "or use consumed:STEPSxGLOBAL_BATCH") from None


def chain_entry(layout, n_sequences: int, n_frozen: int) -> dict:
    """One link of the version chain: the stream's length, its frozen prefix and the corpus it holds."""
    manifest = pl.read_parquet(layout.shards, columns=["path", "docs_digest", "n_docs"])
    digest = hashlib.sha256("\n".join(manifest["docs_digest"].fill_null("").to_list()).encode()).hexdigest()[:16]
    return {"sequences": int(n_sequences), "frozen_sequences": int(n_frozen), "documents": int(manifest["n_docs"].sum()),
            "shards": [Path(p).name for p in manifest["path"].to_list()], "corpus": digest}


def extend_chain(rec: FrozenPrefix, entry: dict) -> list[dict]:
    """The chain with ``entry`` appended when the stream changed since its last link."""
    chain = list(rec.meta.get("chain", []))
    if not chain or {k: v for k, v in chain[-1].items() if k != "version"} != entry:
        chain.append({"version": len(chain), **entry})
    rec.meta["chain"] = chain
    return chain

