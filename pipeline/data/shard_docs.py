"""The training rows of each validated corpus shard, read in bounded memory, and the per-shard artifacts.

The per-shard stages (tokens, embeddings, cluster assignment) read a validated corpus shard
(``corpus/shards/<fingerprint>-<split>.parquet``, written by the ``corpus_shards`` partition) and
compute its training rows (``heldout`` false) on their own: :class:`ShardDocs` names them. Each
stage's artifact is named by the validated file and the producer's fingerprint, e.g.
``tokens/shards/<validated>-<tokenizer>.bin``, so it depends on nothing but that shard and the
producer: a rerun, or the Dagster partition of another shard, never touches it. The whole-corpus
assets gather these artifacts in ``corpus.parquet`` order (``shard_row`` says which row of its shard
each document is): :func:`manifest_shards`, :func:`kept_rows`. ``corpus.parquet`` holds no copy of
the texts: :func:`corpus_texts` reads them from the validated shards in ``doc_id`` order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from pipeline.storage.atomic import forget_sha256, is_sidecar, recorded_sha256, sidecar_of
from pipeline.threads import ahead, cores


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
    meta = pq.ParquetFile(path).metadata
    return np.concatenate([[0], np.cumsum([meta.row_group(i).num_rows for i in range(meta.num_row_groups)])]).astype(np.int64)


def _read_rows(path: Path, rows: np.ndarray, columns: Sequence[str]) -> pl.DataFrame:
    """File rows ``rows`` (sorted) of a Parquet file, reading only the row groups they lie in."""
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


def read_docs(corpus_path: Path, start: int, stop: int, columns: Sequence[str]) -> pl.DataFrame:
    """Rows ``start:stop`` (doc ids) of ``corpus.parquet``, reading only the row groups they lie in."""
    return _read_rows(Path(corpus_path), np.arange(start, stop, dtype=np.int64), columns)


def prune(shard_dir: Path, keep: set[str]) -> int:
    """Remove a stage's shard artifacts not named in ``keep`` (shards no longer in the corpus), each
    with its digest record; their count. Only files Strata wrote are removed: those with a recorded
    SHA-256 (:func:`pipeline.storage.atomic.recorded_sha256`). A file without one (put there by
    hand), hidden files and folders are left alone, and a record whose file is gone goes too."""
    gone = 0
    for p in sorted(shard_dir.iterdir()) if shard_dir.is_dir() else ():
        if is_sidecar(p) and sidecar_of(p).name not in keep and not sidecar_of(p).exists():
            p.unlink(missing_ok=True)  # the record of a file removed earlier
        elif (p.is_file() and not p.is_symlink() and not p.name.startswith(".") and p.name not in keep
              and recorded_sha256(p) is not None):
            p.unlink()
            forget_sha256(p)
            gone += 1
    return gone


def manifest_shards(manifest: pl.DataFrame, corpus_shard_dir: Path) -> list[tuple[dict, ShardDocs]]:
    """Each row of ``corpus/shards.parquet`` with its validated shard (gathers read these)."""
    return [(row, ShardDocs.of(row["path"], corpus_shard_dir / row["validated"])) for row in manifest.to_dicts()]


def corpus_texts(corpus_path: Path, manifest: pl.DataFrame, corpus_shard_dir: Path, batch_rows: int = 8192) -> Iterator[pl.Series]:
    """The text of every document of ``corpus.parquet`` in ``doc_id`` order, in batches of at most
    ``batch_rows``, read from the validated shards the manifest (``corpus/shards.parquet``) names
    (only the documents ``corpus`` kept, where it dropped some)."""
    for row, shard in manifest_shards(manifest, Path(corpus_shard_dir)):
        if not int(row["n_docs"]):
            continue
        rows = kept_rows(corpus_path, row, shard)
        if rows is None:
            for a in range(0, shard.n_docs, batch_rows):
                yield read_shard_docs(shard, a, min(a + batch_rows, shard.n_docs))["text"]
            continue
        train = _train_rows(str(shard.path), *_stamp(shard.path))
        for a in range(0, rows.size, batch_rows):
            yield _read_rows(shard.path, train[rows[a : a + batch_rows]], ["text"])["text"]


def chosen_texts(corpus_path: Path, manifest: pl.DataFrame, corpus_shard_dir: Path,
                 choose: Callable[[int], np.ndarray | None], read_rows: int = 65_536) -> Iterator[str]:
    """The texts of the documents ``choose`` picks, in ``doc_id`` order: ``choose`` is called once a
    shard of the manifest, in corpus order, with its number of documents in ``corpus.parquet`` and
    returns the sorted positions among them to read (None: every one). Only the Parquet row groups
    holding a chosen document are read (the ``text`` column), blocks of at most ``read_rows`` file
    rows a task on a thread a core, up to two tasks a core ahead of the consumer (decompressing and
    taking release the GIL); only the chosen texts become Python strings."""
    def tasks() -> Iterator[tuple[Path, list[int], np.ndarray]]:
        for row in manifest.to_dicts():
            n = int(row["n_docs"])
            if not n:
                continue
            shard = ShardDocs.of(row["path"], Path(corpus_shard_dir) / row["validated"])
            picked = choose(n)
            rows = kept_rows(corpus_path, row, shard)
            file_rows = _train_rows(str(shard.path), *_stamp(shard.path))
            file_rows = file_rows if rows is None else file_rows[rows]
            file_rows = file_rows if picked is None else file_rows[np.asarray(picked, dtype=np.int64)]
            if not file_rows.size:
                continue
            starts = _row_starts(str(shard.path), *_stamp(shard.path))
            group = np.searchsorted(starts, file_rows, side="right") - 1
            block = starts[group] // max(read_rows, 1)  # consecutive row groups, about read_rows file rows a task
            cuts = np.flatnonzero(np.diff(block)) + 1
            for rows_, groups in zip(np.split(file_rows, cuts), np.split(group, cuts)):
                wanted, at = np.unique(groups, return_inverse=True)
                before = np.concatenate([[0], np.cumsum(starts[wanted + 1] - starts[wanted])[:-1]])  # rows of earlier wanted groups
                yield shard.path, wanted.tolist(), before[at] + rows_ - starts[groups]

    workers = cores()
    for texts in ahead(_take_texts, tasks(), depth=2 * workers, workers=workers):
        yield from texts


def _take_texts(task: tuple[Path, list[int], np.ndarray]) -> list[str]:
    path, groups, local = task
    return pq.ParquetFile(path).read_row_groups(groups, columns=["text"], use_threads=False).column(0).take(local).to_pylist()


def kept_rows(corpus_path: Path, row: dict, shard: ShardDocs) -> np.ndarray | None:
    """The shard rows (``shard_row``) of a manifest row's documents in ``corpus.parquet``, in order;
    None when they are all of its validated shard's training rows (nothing dropped: the common case)."""
    groups = list(range(int(row["row_group_start"]), int(row["row_group_end"])))
    rows = (pq.ParquetFile(corpus_path).read_row_groups(groups, columns=["shard_row"]).column(0).to_numpy() if groups
            else np.zeros(0, np.int64))
    return None if rows.size == shard.n_docs else rows.astype(np.int64)  # sorted, unique: equal size = all
