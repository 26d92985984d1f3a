"""Per-corpus-shard stages (tokens, embeddings, cluster assignment) as work units, on either engine, in bounded memory.

The per-shard stages read a validated corpus shard (``corpus/shards/<fingerprint>-<split>.parquet``,
written by the ``corpus_shards`` partition) and compute its training rows (``heldout`` false) on
their own: :class:`ShardDocs` names them. Each stage's artifact is named by the validated file and
the producer's fingerprint, e.g. ``tokens/shards/<validated>-<tokenizer>.bin``, so it depends on
nothing but that shard and the producer: a rerun, or the Dagster partition of another shard,
never touches it. The whole-corpus assets gather these artifacts in ``corpus.parquet`` order
(``shard_row`` says which row of its shard each document is).

A shard to compute is cut into work units of ``cfg.shard_docs`` consecutive rows — the same units
on both engines, so every embedding batch holds the same documents and the bytes are identical —
and :func:`pipeline.distributed.engine.map_shards` runs the pure unit function on each. A unit's
inputs are read only when it is submitted (:attr:`Shard.load`), its result is written to
``work/<stage>/`` as soon as it arrives, and once all units of a shard are in, ``assemble`` writes
the shard's artifacts and the unit files are removed. Memory: the units in flight. A run killed
midway leaves complete unit and shard files; a rerun resumes from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import polars as pl
from tqdm import tqdm

from pipeline.distributed.engine import Shard, map_shards
from pipeline.storage.atomic import atomic_path


@dataclass(frozen=True)
class ShardDocs:
    """The training rows of one validated corpus shard: what the per-shard stages compute."""

    unit: str  # the raw shard (file path, ``builtin`` or ``hf:<name>``)
    path: Path  # its validated file (pipeline.data.corpus.validated_path)
    n_docs: int  # training rows (``heldout`` false)

    @property
    def name(self) -> str:
        """The validated file's stem: the shard's content and split options, naming every artifact."""
        return self.path.stem

    @classmethod
    def of(cls, unit: str, path: Path) -> "ShardDocs":
        return cls(unit, Path(path), int(_train_rows(str(path), *_stamp(path)).size))


def _stamp(path: Path) -> tuple[int, int]:
    st = Path(path).stat()
    return st.st_mtime_ns, st.st_size


@lru_cache(maxsize=4)
def _train_rows(path: str, mtime_ns: int, size: int) -> np.ndarray:
    """File rows of a validated shard's training documents (8 bytes each)."""
    held = pl.read_parquet(path, columns=["heldout"])["heldout"].to_numpy()
    return np.flatnonzero(~held).astype(np.int64)


@lru_cache(maxsize=4)
def _row_starts(path: str, mtime_ns: int, size: int) -> np.ndarray:
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    return np.concatenate([[0], np.cumsum([meta.row_group(i).num_rows for i in range(meta.num_row_groups)])]).astype(np.int64)


def _read_rows(path: Path, rows: np.ndarray, columns: Sequence[str]) -> pl.DataFrame:
    """File rows ``rows`` (sorted) of a Parquet file, reading only the row groups they lie in."""
    import pyarrow.parquet as pq

    starts = _row_starts(str(path), *_stamp(path))
    if rows.size == 0:
        return pl.DataFrame(schema={c: pl.String for c in columns})
    first = int(np.searchsorted(starts, rows[0], side="right")) - 1
    last = int(np.searchsorted(starts, rows[-1], side="right"))
    df = pl.from_arrow(pq.ParquetFile(path).read_row_groups(list(range(first, last)), columns=list(columns)))
    assert isinstance(df, pl.DataFrame)
    return df[rows - int(starts[first])]


def read_shard_docs(shard: ShardDocs, start: int, stop: int, columns: Sequence[str] = ("text",)) -> pl.DataFrame:
    """Training rows ``start:stop`` of a validated shard."""
    return _read_rows(shard.path, _train_rows(str(shard.path), *_stamp(shard.path))[start:stop], columns)


@lru_cache(maxsize=2)
def _backend(tokenizer_json: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json)


def tokenize_unit(tokenizer_json: str, eos_id: int, dtype: str, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(flat ids with EOS after each document, n_tokens, n_chars, n_bytes)`` of ``texts``: the ids
    :func:`pipeline.data.tokens.tokenize_documents` gives, from the tokenizer's serialized form
    (the Rust batch encoder runs on every core)."""
    dt = np.dtype(dtype)
    backend = _backend(tokenizer_json)
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # no character offsets: ~20% faster
    encs = encode(texts, add_special_tokens=False)
    n_tokens = np.fromiter((len(e.ids) for e in encs), dtype=np.int64, count=len(encs))
    flat = np.empty(int(n_tokens.sum()) + len(encs), dtype=dt)
    ends = np.cumsum(n_tokens + 1) - 1
    body = np.ones(flat.size, bool)
    body[ends] = False
    flat[body] = np.fromiter((i for e in encs for i in e.ids), dtype=dt, count=int(n_tokens.sum()))
    flat[ends] = eos_id
    s = pl.Series(texts, dtype=pl.String)
    return flat, n_tokens, s.str.len_chars().cast(pl.Int64).to_numpy(), s.str.len_bytes().cast(pl.Int64).to_numpy()


def embed_unit(method: str, model: str, max_tokens: int, batch_size: int, progress: bool, texts: list[str]) -> np.ndarray:
    """Unit-norm embeddings of one unit's texts (:func:`pipeline.represent.embeddings.embed`, no
    checkpoints: a unit is the unit of resumption, so its batches never depend on an interruption)."""
    from pipeline.represent.embeddings import embed

    return embed(texts, method, model, max_tokens, batch_size, work_dir=None, progress=progress)


def embed_unit_from_ids(model: str, max_tokens: int, ids: np.ndarray, n_tokens: np.ndarray) -> np.ndarray:
    """``shallow`` embeddings of one unit from its token-store ids (the pipeline's tokenizer is the
    model's): equal to :func:`embed_unit` on the texts, without tokenizing again."""
    from pipeline.represent.embeddings import shallow_from_ids

    return shallow_from_ids(model, max_tokens, ids, n_tokens)


def read_docs(corpus_path: Path, start: int, stop: int, columns: Sequence[str] = ("text",)) -> pl.DataFrame:
    """Rows ``start:stop`` (doc ids) of ``corpus.parquet``, reading only the row groups they lie in."""
    return _read_rows(Path(corpus_path), np.arange(start, stop, dtype=np.int64), columns)


def _save(shard: Shard, result: Any) -> None:
    arrays = result if isinstance(result, tuple) else (result,)
    with atomic_path(shard.outputs[0]) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, *arrays)


def load_unit(path: Path) -> tuple[np.ndarray, ...]:
    """A unit's result arrays, as the unit function returned them."""
    with np.load(path, allow_pickle=False) as z:
        return tuple(z[f"arr_{i}"] for i in range(len(z.files)))


def map_corpus_shards(
    shards: Sequence[ShardDocs],
    fn: Callable[..., Any],
    unit_args: Callable[[ShardDocs, int, int], tuple],
    assemble: Callable[[ShardDocs, list[Path]], None],
    done: Callable[[ShardDocs], bool],
    *,
    stage: str,
    key: str,
    work_dir: Path,
    cfg,
    actors: bool = False,
) -> dict[str, int]:
    """Compute the artifacts of every shard for which ``done(shard)`` is false.

    ``unit_args(shard, start, stop)`` gives ``fn``'s arguments for the shard's training rows
    ``start:stop``; ``assemble(shard, unit_files)`` writes a shard's artifacts from its units'
    results (files holding ``fn``'s return value, read with :func:`load_unit`). Returns ``shards``,
    ``shards_computed``, ``shards_reused``, ``units`` (of the shards computed) and ``units_resumed``
    (found complete from an earlier run)."""
    n = cfg.shard_docs
    todo = list({s.name: s for s in shards if s.n_docs and not done(s)}.values())
    units: dict[str, list[Shard]] = {
        s.name: [Shard(f"{stage}[{s.unit}:{a}]", (), (work_dir / f"{stage}-{s.name}-{key}-{a}.npz",),
                       load=lambda s=s, a=a, b=min(a + n, s.n_docs): unit_args(s, a, b))
                 for a in range(0, s.n_docs, n)]
        for s in todo
    }
    by_name = {s.name: s for s in todo}
    owner = {u.outputs[0]: d for d, us in units.items() for u in us}
    work_dir.mkdir(parents=True, exist_ok=True)

    def finish(name: str) -> None:
        files = [u.outputs[0] for u in units.pop(name)]
        assemble(by_name[name], files)
        for f in files:
            f.unlink(missing_ok=True)

    resumed = sum(u.done() for us in units.values() for u in us)
    for name in [d for d, us in units.items() if all(u.done() for u in us)]:  # complete from an interrupted run
        finish(name)
    flat = [u for us in units.values() for u in us]
    bar = tqdm(total=len(flat), initial=sum(u.done() for u in flat), desc=f"{stage}[{cfg.engine}]", unit="unit", disable=len(flat) < 2)

    def save(unit: Shard, result: Any) -> None:
        _save(unit, result)
        bar.update(1)
        name = owner[unit.outputs[0]]
        if all(u.done() for u in units[name]):
            finish(name)

    map_shards(fn, flat, save, engine=cfg.engine, ray_cfg=cfg.ray, actors=actors)
    bar.close()
    return {"shards": len(shards), "shards_computed": len(todo), "shards_reused": len(shards) - len(todo), "units": len(owner),
            "units_resumed": resumed}


def prune(shard_dir: Path, keep: set[str]) -> int:
    """Remove a stage's shard artifacts not named in ``keep`` (shards no longer in the corpus); their count."""
    gone = 0
    for p in shard_dir.iterdir() if shard_dir.is_dir() else ():
        if p.is_file() and p.name not in keep:
            p.unlink()
            gone += 1
    return gone


def manifest_shards(manifest: pl.DataFrame, corpus_shard_dir: Path) -> list[tuple[dict, ShardDocs]]:
    """Each row of ``corpus/shards.parquet`` with its validated shard (gathers read these)."""
    return [(row, ShardDocs.of(row["path"], corpus_shard_dir / row["validated"])) for row in manifest.to_dicts()]


def kept_rows(corpus_path: Path, row: dict, shard: ShardDocs) -> np.ndarray | None:
    """The shard rows (``shard_row``) of a manifest row's documents in ``corpus.parquet``, in order;
    None when they are all of its validated shard's training rows (nothing dropped: the common case)."""
    import pyarrow.parquet as pq

    groups = list(range(int(row["row_group_start"]), int(row["row_group_end"])))
    rows = (pq.ParquetFile(corpus_path).read_row_groups(groups, columns=["shard_row"]).column(0).to_numpy() if groups
            else np.zeros(0, np.int64))
    return None if rows.size == shard.n_docs else rows.astype(np.int64)  # sorted, unique: equal size = all


def gather_rows(parts: Sequence[tuple[Path, np.ndarray | None]], out: Path, block: int = 1 << 16) -> int:
    """Write the chosen rows (None: all) of each per-shard ``.npy`` into one ``.npy`` through a
    memory map, ``block`` rows at a time; the row count."""
    from pipeline.storage.atomic import write_rows

    mms = [(np.load(p, mmap_mode="r"), rows) for p, rows in parts]
    n = sum(mm.shape[0] if rows is None else rows.size for mm, rows in mms)

    def blocks():
        for mm, rows in mms:
            m = mm.shape[0] if rows is None else rows.size
            for a in range(0, m, block):
                yield np.asarray(mm[a : a + block] if rows is None else mm[rows[a : a + block]])

    write_rows(blocks(), n, out, dtype=mms[0][0].dtype)
    return n
