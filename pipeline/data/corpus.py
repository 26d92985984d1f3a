"""The corpus stage: every shard read, validated and split, then one table of training documents.

Inputs: Parquet / JSONL / JSONL.gz / JSONL.zst shards (a file, a directory, a glob or a list; see
:mod:`pipeline.data.shards`), a Hugging Face dataset (one shard per data file of its split:
:mod:`pipeline.data.hf_hub`), or the built-in corpus. Every problem names the shard file, the
line (or row) and the fix; with ``on_error="skip"`` bad records are skipped and counted per shard.

:func:`build_corpus` streams: each shard is validated by :func:`validate_unit` into its own
Parquet file under ``corpus/shards/`` (named by the shard's content fingerprint, so an unchanged
shard is never read again), then the global steps (ids unique across shards, the ``max_docs``
sample, dense ``doc_id``) stream those files into ``corpus.parquet``, one row group per batch and
never across shards: an index of the training documents (ids, sources, content hashes, where each
lies in its validated shard) without their texts, which are written once, in the validated
shards. Memory: one batch of documents plus about 10 bytes a document.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import CorpusConfig
from pipeline.data.builtin_corpus import builtin_documents
from pipeline.data.hf_hub import data_files, file_records
from pipeline.data.shard_docs import prune
from pipeline.data.shards import (
    BATCH_ROWS,
    SHARD_COLUMNS,
    ShardReport,
    declared_columns,
    discover_shards,
    group_files,
    is_shard,
    read_records,
    read_shard,
    shard_fingerprint,
    shard_size,
)
from pipeline.distributed.engine import map_shards
from pipeline.distributed.shards import Shard
from pipeline.errors import StrataInputError
from pipeline.storage.atomic import atomic_writer, write_json
from pipeline.storage.remote import is_url
from pipeline.threads import ahead, behind, cores, parallel_map, prefetch

if TYPE_CHECKING:  # imported where used: importing this module stays light
    import duckdb
    import pyarrow as pa

# zstd level of the validated shards and corpus.parquet: level 3 (zstd's own default) writes the
# texts smaller than Arrow's default level 1 for little more CPU.
ZSTD_LEVEL = 3


@dataclass
class CorpusReport:
    """What reading found: records read, skipped records ``(line, reason)`` and per-shard counts."""

    path: str
    n_read: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line or row, reason), all shards
    skipped_by_shard: dict[str, int] = field(default_factory=dict)
    lines: list[int] = field(default_factory=list)  # file line (or row) of each kept record


# the end of a unit that is a group of small shard files: the group's first file, then this (no
# shard's name ends so, :func:`pipeline.data.shards.is_shard`)
GROUP_MARK = "+group"


MANY_FILES = 1000  # shard files past which a corpus without corpus.group_bytes is warned of a partition each
_WARNED_MANY: set[str] = set()


def corpus_units(cfg: CorpusConfig) -> list[str]:
    """The corpus's units of reading: shard file paths and object URLs (those of ``corpus.path``,
    or the data files of ``corpus.hf_dataset``'s split), or ``builtin``. With ``corpus.group_bytes``
    the small files of ``corpus.path`` come in groups (:func:`corpus_groups`): a group of two or
    more files is the unit ``<its first file>+group``."""
    if _has_path(cfg):
        if cfg.group_bytes:
            return list(corpus_groups(cfg))
        files = [str(p) for p in discover_shards(cfg.path)]
        if len(files) > MANY_FILES and str(cfg.path) not in _WARNED_MANY:
            _WARNED_MANY.add(str(cfg.path))  # once a process: status and the runner list the corpus often
            logging.getLogger(__name__).warning(
                "%s: %d shard files, each a corpus_shard partition (a Dagster run each); set corpus.group_bytes "
                "(e.g. 268435456) to read the small ones in groups (docs/scale.md)", cfg.path, len(files))
        return files
    if cfg.hf_dataset:
        return data_files(cfg.hf_dataset, cfg.hf_split)
    return ["builtin"]


def corpus_groups(cfg: CorpusConfig) -> dict[str, list[str]]:
    """``{unit: its shard files}`` of ``corpus.path`` grouped by ``corpus.group_bytes``
    (:func:`pipeline.data.shards.group_files`), in corpus order; a file alone is its own unit."""
    files = discover_shards(cfg.path)
    groups = group_files(files, parallel_map(shard_size, files), cfg.group_bytes) if cfg.group_bytes else [[f] for f in files]
    return {(str(g[0]) + GROUP_MARK if len(g) > 1 else str(g[0])): [str(f) for f in g] for g in groups}


def unit_files(unit: str, cfg: CorpusConfig) -> list[str]:
    """The shard files a unit reads: a group's files (the corpus listed again), else the unit itself."""
    if not unit.endswith(GROUP_MARK):
        return [unit]
    files = corpus_groups(cfg).get(unit)
    if files is None:
        raise StrataInputError("the group of small shard files is not in the corpus any more (a file was added, removed or "
                               "resized, or corpus.group_bytes changed)", path=unit.removesuffix(GROUP_MARK),
                               fix="run `strata status` (it syncs the shard partitions) and run again")
    return files


def _has_path(cfg: CorpusConfig) -> bool:
    return bool(cfg.path) and cfg.path != []


def read_unit(unit: str, cfg: CorpusConfig, report: ShardReport, batch_rows: int = BATCH_ROWS,
              fingerprint: str | None = None) -> Iterator[pl.DataFrame]:
    """Validated batches (``id, text, source, subdomain, line`` and the declared ``corpus.columns``) of
    one unit of :func:`corpus_units` (an object URL read only while it is the version ``fingerprint`` names, when given)."""
    if unit == "builtin":
        if cfg.columns:
            raise StrataInputError(f"corpus.columns declares {sorted(cfg.columns)}, but the built-in corpus has no such fields",
                                   fix="set corpus.path (or corpus.hf_dataset) to your corpus, or remove corpus.columns")
        rows = builtin_documents(cfg.builtin_max_docs)
        report.n_read = len(rows)
        return iter([pl.DataFrame(rows, schema=list(SHARD_COLUMNS)[:4], orient="row")
                     .with_columns(line=pl.int_range(1, len(rows) + 1, dtype=pl.Int64))])
    if cfg.hf_dataset and not _has_path(cfg) and not is_shard(unit):  # a data file of another format (CSV, Arrow …)

        return read_records(file_records(cfg.hf_dataset, unit), cfg, unit, report, batch_rows)
    if unit.endswith(GROUP_MARK):
        return _read_group(unit_files(unit, cfg), cfg, report, batch_rows)
    return read_shard(_shard_path(unit), cfg, report, batch_rows, expect=fingerprint)


def _read_group(files: list[str], cfg: CorpusConfig, report: ShardReport, batch_rows: int) -> Iterator[pl.DataFrame]:
    """Validated batches of a group's files read one after the other, cut into batches of
    ``batch_rows`` records as one file's would be. Each record keeps its file's line (or row); a
    bad record stops the run naming its file and line, or, skipped, is counted as ``<file>: <reason>``;
    ``report.files`` gets each file's ``[path, records kept]``, in order, which says which file a
    row of the validated shard came from."""
    held: list[pl.DataFrame] = []
    n_held = 0
    for f in files:
        sub = ShardReport(f)
        kept = 0
        for batch in read_shard(_shard_path(f), cfg, sub, batch_rows):
            kept += batch.height
            held.append(batch)
            n_held += batch.height
            while n_held >= batch_rows:
                joined = pl.concat(held)
                yield joined.head(batch_rows)
                rest = joined.slice(batch_rows)
                held, n_held = ([rest] if rest.height else []), rest.height
        report.n_read += sub.n_read
        report.skipped += [(line, f"{f.rsplit('/', 1)[-1]}: {reason}") for line, reason in sub.skipped]
        report.surrogates_replaced += sub.surrogates_replaced
        report.files.append([f, kept])
    if n_held:
        yield pl.concat(held)


def _shard_path(unit: str) -> Path | str:
    """A shard unit as :mod:`pipeline.data.shards` takes it: a Path, or an object URL as it is."""
    return unit if is_url(unit) else Path(unit)


def duplicate_ids(ids: list[pl.Series]) -> tuple[list[np.ndarray], tuple[int, str, list[tuple[int, int]]] | None]:
    """Later occurrences of repeated document ids across units (in unit order, then row order).

    Returns a boolean mask per unit (true = a repeat of an earlier id) and the first repeated id as
    ``(unit of its second occurrence, id, [(unit, row), ...])``, or None. Ids are compared through
    a 64-bit hash and confirmed on the strings, so memory is 8 bytes a document.
    """
    sizes = [s.len() for s in ids]
    hashed = np.concatenate(parallel_map(lambda s: s.hash(seed=0).to_numpy(), ids)) if ids else np.zeros(0, np.uint64)
    masks = [np.zeros(n, bool) for n in sizes]
    if hashed.size < 2:
        return masks, None
    cand = repeated_values(hashed)
    if not cand.size:
        return masks, None
    starts = np.cumsum([0, *sizes])
    pos = np.flatnonzero(np.isin(hashed, cand))  # global positions, ascending
    unit = np.searchsorted(starts, pos, side="right") - 1
    strings = [ids[u][int(p - starts[u])] for u, p in zip(unit, pos)]
    seen: dict[str, list[tuple[int, int]]] = {}
    first = None
    for u, p, s in zip(unit, pos, strings):
        row = int(p - starts[u])
        if s in seen:
            masks[u][row] = True
            if first is None:
                first = (int(u), s, seen[s])
        seen.setdefault(s, []).append((int(u), row))
    if first is not None:
        first = (first[0], first[1], seen[first[1]])
    return masks, first


def repeated_values(values: np.ndarray) -> np.ndarray:
    """The distinct values of ``values`` (uint64, e.g. hashes) occurring more than once, ascending:
    the range of values cut in one part a core, each part sorted on a thread of its own (NumPy's
    sort releases the GIL, so the parts sort side by side, where ``np.unique`` with counts runs on
    one core)."""
    parts = cores()
    bounds = [np.uint64((1 << 64) * k // parts) for k in range(parts)]

    def repeats(k: int) -> np.ndarray:
        inside = values >= bounds[k]
        if k + 1 < parts:
            inside &= values < bounds[k + 1]
        part = np.sort(values[inside])
        return np.unique(part[1:][part[1:] == part[:-1]])

    return np.concatenate(parallel_map(repeats, list(range(parts))))


def max_docs_sample(n: int, max_docs: int, seed: int) -> np.ndarray:
    """Sorted positions of the seeded ``max_docs`` sample among ``n`` valid documents."""
    return np.sort(np.random.default_rng(seed).choice(n, max_docs, replace=False))


def _duplicate_error(first, units: list[str], lines: list[pl.Series], infos: list[dict] | None = None) -> StrataInputError:
    unit, doc, where = first
    files = [_row_files(info) for info in infos] if infos else [None] * len(units)
    if len(units) == 1 and files[0] is None:
        records = str([int(lines[u][r]) for u, r in where[:5]])
    else:
        records = "[" + ", ".join(f"{_row_file(units[u], files[u], r)} line {int(lines[u][r])}" for u, r in where[:5]) + "]"
    return StrataInputError(
        f"duplicate document id {doc!r} (records {records})", path=_row_file(units[unit], files[unit], where[1][1], full=True),
        fix="give every document a unique id, set corpus.id_field to a unique field, or corpus.on_error: skip",
    )


def _row_files(info: dict) -> tuple[np.ndarray, list[str]] | None:
    """Where each file of a group's validated shard begins (rows) and the files, from its report; None for one file."""
    if "files" not in info:
        return None
    return np.cumsum([0, *(int(n) for _, n in info["files"])]), [f for f, _ in info["files"]]


def _row_file(unit: str, files: tuple[np.ndarray, list[str]] | None, row: int, full: bool = False) -> str:
    """The file (its name, or its path with ``full``) that row ``row`` of a unit's validated shard came from."""
    path = unit if files is None else files[1][int(np.searchsorted(files[0], row, side="right")) - 1]
    return path if full else Path(path).name


def content_hashes(texts: pl.Series) -> pl.Series:
    """SHA-256 (hex) of each document's UTF-8 text: the identity used for dedup and the held-out split.
    hashlib (OpenSSL) rather than DuckDB's ``sha256``, which costs more CPU on texts this long."""
    sha = hashlib.sha256
    return pl.Series("content_hash", [sha(t.encode("utf-8")).hexdigest() for t in texts.to_list()], dtype=pl.String)


def heldout_mask(hashes: pl.Series, fraction: float, seed: int) -> np.ndarray:
    """Seeded held-out split keyed on content hash: stable when documents are added or removed."""
    return (heldout_keys(hashes, seed) / np.float64(2**64)) < fraction


def heldout_keys(hashes: pl.Series, seed: int) -> np.ndarray:
    """Each document's split key: the first 8 bytes, big-endian, of SHA-256 of ``f"{seed}:{hash}"``.
    Computed by DuckDB, outside the GIL and without a Python call a document: on these short strings
    the calls cost more than the hashing."""
    with _duckdb(os.getpid()).cursor() as con:
        con.register("hashes", pa.table({"h": hashes.to_arrow()}))
        keys = con.sql("select ('0x' || left(sha256($salt || h), 16))::UBIGINT as k from hashes", params={"salt": f"{seed}:"})
        return keys.to_arrow_table()["k"].to_numpy()


@lru_cache(maxsize=1)
def _duckdb(pid: int) -> duckdb.DuckDBPyConnection:
    """This process's DuckDB connection, for cursors (a connection is far dearer to open than a
    cursor); keyed by process id so a forked child opens its own. One thread a query: the
    callers overlap it with reading and writing instead."""
    con = duckdb.connect(config={"threads": 1})
    atexit.register(_close_duckdb, con)  # closed before exit: a connection left to interpreter shutdown is reported as leaked
    return con


def _close_duckdb(con: duckdb.DuckDBPyConnection) -> None:
    con.close()
    _duckdb.cache_clear()


def corpus_fingerprint(cfg: CorpusConfig) -> str:
    """Data version of the raw corpus: SHA-256 over every shard's bytes (an object's version, or
    the built-in documents) plus the reading options, so editing, appending or deleting a document or a
    shard, or changing a field mapping, changes it."""
    h = hashlib.sha256(json.dumps(cfg.model_dump(), sort_keys=True).encode())
    for unit, fp in unit_fingerprints(cfg).items():
        h.update(f"{unit}\0{fp}\0".encode())
    return h.hexdigest()[:16]


def unit_fingerprints(cfg: CorpusConfig) -> dict[str, str]:
    """Content fingerprint of each unit of :func:`corpus_units`, the files read and hashed on a
    thread a core (reads and SHA-256 release the GIL)."""
    if _has_path(cfg) and cfg.group_bytes:  # every file hashed on a thread a core, then each group's from its files'
        groups = corpus_groups(cfg)
        files = [f for fs in groups.values() for f in fs]
        fps = dict(zip(files, parallel_map(lambda f: shard_fingerprint(_shard_path(f), cfg), files)))
        return {unit: fps[fs[0]] if fs == [unit] else _group_fingerprint(fs, fps) for unit, fs in groups.items()}
    units = corpus_units(cfg)
    return dict(zip(units, parallel_map(lambda unit: unit_fingerprint(unit, cfg), units)))


def _group_fingerprint(files: list[str], fps: dict[str, str]) -> str:
    """A group's data version: its files' paths and fingerprints."""
    h = hashlib.sha256(b"group")
    for f in files:
        h.update(f"{f}\0{fps[f]}\0".encode())
    return h.hexdigest()[:32]


def unit_fingerprint(unit: str, cfg: CorpusConfig) -> str:
    """Content fingerprint of one unit (a file's bytes, an object's version, the built-in documents)."""
    if unit == "builtin":
        return _builtin_fingerprint(cfg.builtin_max_docs)
    if unit.endswith(GROUP_MARK):
        files = unit_files(unit, cfg)
        return _group_fingerprint(files, {f: shard_fingerprint(_shard_path(f), cfg) for f in files})
    return shard_fingerprint(_shard_path(unit), cfg)


@lru_cache(maxsize=4)
def _builtin_fingerprint(max_docs: int) -> str:
    h = hashlib.sha256(f"builtin:{max_docs}".encode())
    for doc in builtin_documents(max_docs):
        h.update("\x1f".join(doc).encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:32]


def shard_key(unit: str) -> str:
    """The Dagster partition key of a unit of :func:`corpus_units`: its file name and a digest of
    its full path (two directories may hold files of one name), e.g. ``part-00001.parquet@3fa2c1d0``;
    ``builtin`` otherwise."""
    if unit == "builtin":
        return unit
    name = re.sub(r"[^A-Za-z0-9._-]", "_", unit.rstrip("/").rsplit("/", 1)[-1])
    return f"{name}@{hashlib.sha256(unit.encode()).hexdigest()[:8]}"


def shard_versions(cfg: CorpusConfig) -> dict[str, tuple[str, str]]:
    """``{partition key: (unit, content fingerprint)}`` of every shard of the corpus."""
    return {shard_key(u): (u, fp) for u, fp in unit_fingerprints(cfg).items()}


def shard_version(cfg: CorpusConfig, key: str) -> tuple[str, str] | None:
    """``(unit, content fingerprint)`` of the shard with partition key ``key`` (reading only that
    shard), or None when the corpus has no such shard."""
    if _has_path(cfg) and cfg.group_bytes:  # the corpus listed once
        for unit, files in corpus_groups(cfg).items():
            if shard_key(unit) == key:
                return unit, _group_fingerprint(files, {f: shard_fingerprint(_shard_path(f), cfg) for f in files})
        return None
    for unit in corpus_units(cfg):
        if shard_key(unit) == key:
            return unit, unit_fingerprint(unit, cfg)
    return None


def validated_path(shard_dir: Path, fingerprint: str, heldout_fraction: float, seed: int, batch_rows: int = BATCH_ROWS) -> Path:
    """Where a shard's validated records live: named by its content and the split options."""
    tag = hashlib.sha256(f"{heldout_fraction}:{seed}:{batch_rows}".encode()).hexdigest()[:8]
    return shard_dir / f"{fingerprint}-{tag}.parquet"


def validate_shard(unit: str, fingerprint: str, cfg: CorpusConfig, heldout_fraction: float, seed: int, shard_dir: Path,
                   batch_rows: int = BATCH_ROWS, engine: str = "local", ray_cfg=None) -> tuple[Path, dict, bool]:
    """Validate one shard into ``shard_dir`` unless its validated file exists (as a Ray task with
    ``engine="ray"``): (path, report, reused)."""
    out = validated_path(shard_dir, fingerprint, heldout_fraction, seed, batch_rows)
    if out.is_file() and out.with_suffix(".json").is_file():
        return out, json.loads(out.with_suffix(".json").read_text()), True
    out.unlink(missing_ok=True)
    shard = Shard(f"corpus[{unit}]", (unit, cfg, heldout_fraction, seed, out, batch_rows, fingerprint), (out, out.with_suffix(".json")))
    map_shards(validate_unit, [shard], _saved, engine="ray" if engine == "ray" else "local", ray_cfg=ray_cfg)
    return out, json.loads(out.with_suffix(".json").read_text()), False


# --------------------------------------------------------------------------- streaming build

SHARD_FILE_COLUMNS = ["id", "text", "source", "subdomain", "line", "content_hash", "heldout"]
MANIFEST_SCHEMA = {
    "shard": pl.Int32, "path": pl.String, "fingerprint": pl.String, "n_read": pl.Int64, "n_skipped": pl.Int64,
    "n_heldout": pl.Int64, "n_docs": pl.Int64, "doc_start": pl.Int64, "row_group_start": pl.Int32,
    "row_group_end": pl.Int32, "n_chars": pl.Int64, "docs_digest": pl.String, "validated": pl.String,
}


@dataclass
class CorpusBuild:
    """What :func:`build_corpus` wrote: the shard manifest, the number of held-out documents and the report."""

    manifest: pl.DataFrame  # MANIFEST_SCHEMA, one row per shard
    n_heldout: int  # held-out documents (given to ``build_corpus``'s ``heldout``)
    stats: pl.DataFrame  # source, split, n_docs, n_chars
    report: CorpusReport
    reused: int  # shards whose validated file was reused
    validated: int  # shards read and validated now


def validate_unit(unit: str, cfg: CorpusConfig, heldout_fraction: float, seed: int, out: Path, batch_rows: int = BATCH_ROWS,
                  fingerprint: str | None = None) -> dict:
    """Read and validate one shard into ``out`` (Parquet: ``SHARD_FILE_COLUMNS``) and ``out``.json
    (its report); pure per-shard work. Returns the report ``{n_read, skipped: [[line, reason]]}``.

    Two cores: a background thread reads, validates and hashes the next batch while this one
    compresses and writes the previous one (both mostly outside the GIL); at most three batches
    are in memory."""
    sr = ShardReport(unit)
    with atomic_writer(out) as sink:
        writer = None
        try:
            tables = map(partial(_shard_table, heldout_fraction=heldout_fraction, seed=seed, extra=list(declared_columns(cfg))),
                         read_unit(unit, cfg, sr, batch_rows, fingerprint))
            for table in prefetch(tables):
                if writer is None:
                    writer = pq.ParquetWriter(sink, table.schema, compression="zstd", compression_level=ZSTD_LEVEL, write_statistics=False)
                writer.write_table(table, row_group_size=len(table))
            if writer is None:
                empty = pl.DataFrame(schema={**SHARD_COLUMNS, "content_hash": pl.String, "heldout": pl.Boolean,
                                             **declared_columns(cfg)}).select(*SHARD_FILE_COLUMNS, *declared_columns(cfg))
                empty.write_parquet(sink, statistics=False)
        finally:
            if writer is not None:
                writer.close()
    info = {"unit": unit, "n_read": sr.n_read, "skipped": [[int(line), reason] for line, reason in sr.skipped]}
    if sr.files:  # a group of files: which file each run of rows came from
        info["files"] = sr.files
    if sr.surrogates_replaced:  # lone UTF-16 surrogates (half an emoji) replaced by U+FFFD: counted, logged
        info["surrogates_replaced"] = sr.surrogates_replaced
        logging.getLogger(__name__).warning("%s: %d record(s) held lone UTF-16 surrogates, replaced by U+FFFD", unit,
                                            sr.surrogates_replaced)
    write_json(info, out.with_suffix(".json"))
    return info


def _shard_table(batch: pl.DataFrame, heldout_fraction: float, seed: int, extra: list[str] = ()) -> pa.Table:
    """One validated batch with its content hashes and held-out flags (and the declared corpus
    columns ``extra`` after them), as the Arrow table written."""
    hashes = content_hashes(batch["text"])
    batch = batch.with_columns(hashes, heldout=pl.Series(heldout_mask(hashes, heldout_fraction, seed)))
    return batch.select(*SHARD_FILE_COLUMNS, *extra).to_arrow()


def _saved(shard, result) -> None:
    """Nothing to write: :func:`validate_unit` wrote the shard's files itself, where it ran (on Ray,
    a worker writing under the data root every node shares), so only its return value travels."""


READ_COLUMNS = ["id", "text", "source", "subdomain", "content_hash", "heldout"]  # what build_corpus reads of a validated shard
# held-out rows a call of build_corpus's ``heldout`` (at least; the last call fewer): the writer's
# per-call work (a group-by per source, JSON lines) paid once per this many documents, not per batch
HOLD_ROWS = 4096


@dataclass
class PreparedBatch:
    """One batch of a validated shard, split for :func:`build_corpus`: its held-out documents (id,
    text, source, subdomain), its training rows (id, source, subdomain, content_hash and shard_row
    counted from the batch's first training row), per (source, held-out) document and character
    counts, the training rows before the global steps dropped any (what shard_row counts), the
    training characters and the training rows' content hashes as the shard digest takes them."""

    shard: int
    heldout: pl.DataFrame
    train: pl.DataFrame
    stat: pl.DataFrame
    train_rows: int
    train_chars: int
    hashes: bytes


def _prepare_batch(u: int, row: int, batch, valid: list[np.ndarray], extra: list[str] = ()) -> PreparedBatch:
    """:class:`PreparedBatch` of the batch at ``row`` of shard ``u``, keeping the rows ``valid[u]``
    keeps (repeated ids and documents ``max_docs`` left out are dropped). Independent of every other
    batch: the numbering that depends on the batches before it is :func:`build_corpus`'s."""
    df = pl.from_arrow(batch)
    assert isinstance(df, pl.DataFrame)
    df = df.with_columns(shard_row=(~pl.col("heldout")).cast(pl.Int64).cum_sum() - 1)
    train_rows = int((~df["heldout"]).sum())
    keep = valid[u][row : row + df.height]
    if not keep.all():  # repeated ids or documents max_docs left out
        df = df.filter(pl.Series(keep))
    # the columns each side needs, then its rows: the training rows' texts are never copied
    ho = df.select("id", "text", "source", "subdomain").filter(df["heldout"])
    train = df.select("id", "source", "subdomain", "content_hash", "shard_row", *extra).filter(~df["heldout"])
    stat = df.group_by("source", "heldout").agg(n_docs=pl.len(), n_chars=pl.col("text").str.len_chars().cast(pl.Int64).sum())
    chars = int(stat.filter(~pl.col("heldout"))["n_chars"].sum())
    hashes = train["content_hash"].str.join("\n").item().encode() + b"\n" if train.height else b""
    return PreparedBatch(u, ho, train, stat, train_rows, chars, hashes)


def build_corpus(cfg: CorpusConfig, seed: int, heldout_fraction: float, shard_dir: Path, corpus_path: Path,
                 batch_rows: int = BATCH_ROWS, log=None, engine: str = "local", ray_cfg=None,
                 heldout: Callable[[pl.DataFrame], object] | None = None) -> CorpusBuild:
    """Validate every shard (reusing unchanged ones; on Ray workers with ``engine="ray"``) and
    stream the training documents into ``corpus_path`` (``doc_id, id, source, subdomain,
    content_hash, shard, shard_row``; no copy of the texts, which stay in the validated shards:
    :func:`pipeline.data.shard_docs.corpus_texts`). ``shard_row`` is the document's index among its validated
    shard's training rows (``heldout`` false), the rows the per-shard stages compute; the manifest's
    ``validated`` names that file. They differ from ``corpus.parquet``'s rows only where the global
    steps (ids unique across shards, ``max_docs``) dropped documents.

    ``heldout`` is called with the held-out documents (id, text, source, subdomain), in corpus
    order, in frames of :data:`HOLD_ROWS` or more (the last fewer), on a thread of its own while
    the next batches are read (e.g. ``pipeline.data.paloma.PalomaWriter.add``): they are written as they
    come, never held together."""
    fps = unit_fingerprints(cfg)
    units = list(fps)
    files, infos, reused = _validate_units(cfg, fps, seed, heldout_fraction, shard_dir, batch_rows, log, engine, ray_cfg)
    report = CorpusReport(units[0] if len(units) == 1 else str(cfg.path))
    for unit, info in zip(units, infos):
        report.n_read += info["n_read"]
        report.skipped += [(int(a), str(b)) for a, b in info["skipped"]]
        report.skipped_by_shard[unit] = len(info["skipped"])
    valid = _training_rows(cfg, seed, units, files, report, infos)
    stream = _write_corpus(corpus_path, files, valid, batch_rows, heldout, declared_columns(cfg))
    rows = [{"shard": u, "path": units[u], "fingerprint": fps[units[u]], "n_read": infos[u]["n_read"],
             "n_skipped": report.skipped_by_shard[units[u]], **counts, "validated": f.name}
            for u, (f, counts) in enumerate(zip(files, stream.shards))]
    n_heldout = sum(counts["n_heldout"] for counts in stream.shards)
    if stream.doc_id == 0:
        raise StrataInputError("the corpus has no training documents left after the held-out split", path=report.path,
                               fix="add documents or lower heldout_fraction")
    stat = (pl.concat(stream.stats).with_columns(split=pl.when(pl.col("heldout")).then(pl.lit("heldout")).otherwise(pl.lit("train")))
            .group_by("source", "split").agg(pl.col("n_docs").sum().cast(pl.Int64), pl.col("n_chars").sum().cast(pl.Int64))
            .sort("source", "split"))
    return CorpusBuild(pl.DataFrame(rows, schema=MANIFEST_SCHEMA), n_heldout, stat, report, reused, len(units) - reused)


def _validate_units(cfg: CorpusConfig, fps: dict[str, str], seed: int, heldout_fraction: float, shard_dir: Path, batch_rows: int,
                    log, engine: str, ray_cfg) -> tuple[list[Path], list[dict], int]:
    """Validate every shard of ``fps`` into its file under ``shard_dir`` (one whose file and record
    already exist is reused: its fingerprint names it), then delete the files of shards no longer
    in the corpus. Returns (validated files, their records, shards reused), in shard order."""
    files, reused = [], 0
    shard_dir.mkdir(parents=True, exist_ok=True)
    todo = []
    for unit in fps:
        out = validated_path(shard_dir, fps[unit], heldout_fraction, seed, batch_rows)
        files.append(out)
        if out.is_file() and out.with_suffix(".json").is_file():
            reused += 1
        else:
            out.unlink(missing_ok=True)
            todo.append(Shard(f"corpus[{unit}]", (unit, cfg, heldout_fraction, seed, out, batch_rows, fps[unit]),
                              (out, out.with_suffix(".json"))))
    map_shards(validate_unit, todo, _saved, engine="ray" if engine == "ray" else "local", ray_cfg=ray_cfg,
               progress=(lambda s: log(f"validated {s.name}")) if log else None)
    infos = [json.loads(f.with_suffix(".json").read_text()) for f in files]
    prune(shard_dir, {p.name for f in files for p in (f, f.with_suffix(".json"))})
    return files, infos, reused


def _training_rows(cfg: CorpusConfig, seed: int, units: list[str], files: list[Path], report: CorpusReport,
                   infos: list[dict] | None = None) -> list[np.ndarray]:
    """The global steps over the validated shards: per shard, which rows stay in the corpus. A
    document id seen before (in any shard) fails the build under ``on_error="fail"``, else is
    skipped and counted in ``report``; above ``max_docs`` a seeded sample of the rest stays."""
    ids = parallel_map(lambda f: pl.read_parquet(f, columns=["id"])["id"], files)  # a file a core
    masks, first = duplicate_ids(ids)
    if first is not None and cfg.on_error == "fail":
        lines = [pl.read_parquet(f, columns=["line"])["line"] if any(u == i for i, _ in first[2]) else pl.Series([], dtype=pl.Int64)
                 for u, f in enumerate(files)]
        raise _duplicate_error(first, units, lines, infos)
    for u, m in enumerate(masks):
        if m.any():
            lines = pl.read_parquet(files[u], columns=["line"])["line"].filter(pl.Series(m))
            rows = _row_files(infos[u]) if infos else None
            name = [f"{_row_file(units[u], rows, r)}: " if rows else "" for r in np.flatnonzero(m)]
            report.skipped += [(int(line), f"{at}duplicate document id {doc!r}")
                               for line, doc, at in zip(lines, ids[u].filter(pl.Series(m)), name)]
            report.skipped_by_shard[units[u]] += int(m.sum())
    del ids
    valid = [~m for m in masks]
    total = int(sum(int(v.sum()) for v in valid))
    if total == 0:
        raise StrataInputError("the corpus has no usable documents", path=report.path, fix="point corpus.path at a non-empty corpus")
    if cfg.max_docs and total > cfg.max_docs:
        chosen = np.zeros(total, bool)
        chosen[max_docs_sample(total, cfg.max_docs, seed)] = True
        at = 0
        for v in valid:
            idx = np.flatnonzero(v)
            v[idx[~chosen[at : at + idx.size]]] = False
            at += idx.size
    return valid


def _corpus_schema(extra: dict[str, pl.DataType] | None = None) -> pa.Schema:
    """The Arrow schema of ``corpus.parquet``: an index of the training documents, without their
    texts, and the corpus columns ``extra`` declared (``corpus.columns``) after it."""
    kinds = {pl.Float64: pa.float64(), pl.String: pa.string()}
    return pa.schema([("doc_id", pa.int64()), ("id", pa.string()), ("source", pa.string()),
                      ("subdomain", pa.string()), ("content_hash", pa.string()), ("shard", pa.int32()),
                      ("shard_row", pa.int64()), *((name, kinds[dtype]) for name, dtype in (extra or {}).items())])


def corpus_columns(corpus_path: Path) -> list[str]:
    """The declared corpus columns (``corpus.columns``) ``corpus.parquet`` holds: those after its own."""
    return [c for c in pl.read_parquet_schema(corpus_path) if c not in _corpus_schema().names]


def _shard_batches(files: list[Path], batch_rows: int, extra: list[str] = ()) -> Iterator[tuple[int, int, pa.RecordBatch]]:
    """(shard, first row in the shard, batch) of every validated shard's batches, in order."""
    for u, f in enumerate(files):
        row = 0
        for batch in pq.ParquetFile(f, pre_buffer=False).iter_batches(batch_size=batch_rows, columns=[*READ_COLUMNS, *extra]):
            yield u, row, batch
            row += batch.num_rows


@dataclass
class _CorpusStream:
    """The corpus as it is streamed out: the next doc_id and row group, every batch's (source,
    held-out) counts, the held-out rows gathered until they fill a frame of :data:`HOLD_ROWS` for
    ``hold``, and each shard's counts for the manifest as it is finished."""

    write: Callable[[pl.DataFrame], object]
    hold: Callable[[pl.DataFrame], object]
    extra: list[str] = field(default_factory=list)  # the declared corpus columns, after corpus.parquet's own
    doc_id: int = 0
    rg: int = 0
    stats: list[pl.DataFrame] = field(default_factory=list)
    held: list[pl.DataFrame] = field(default_factory=list)
    shards: list[dict] = field(default_factory=list)

    def shard(self, u: int, pending: PreparedBatch | None, ready: Iterator[PreparedBatch]) -> PreparedBatch | None:
        """Hand on shard ``u``'s prepared batches (``pending``, then those ``ready`` gives while they
        are shard ``u``'s): training rows numbered and written, one row group a batch, held-out rows
        held. Returns the next shard's first batch."""
        digest = hashlib.sha256()
        start, rg_start, n_chars, n_held, train_row = self.doc_id, self.rg, 0, 0, 0
        while pending is not None and pending.shard == u:
            b, pending = pending, next(ready, None)
            if b.heldout.height:
                self.held.append(b.heldout)
                n_held += b.heldout.height
                if sum(h.height for h in self.held) >= HOLD_ROWS:
                    self.hold(pl.concat(self.held))
                    self.held = []
            self.stats.append(b.stat)
            shard_row = train_row
            train_row += b.train_rows
            if not b.train.height:
                continue
            n_chars += b.train_chars
            digest.update(b.hashes)
            out = b.train.select(
                pl.int_range(self.doc_id, self.doc_id + b.train.height, dtype=pl.Int64).alias("doc_id"), "id", "source",
                "subdomain", "content_hash", pl.lit(u, dtype=pl.Int32).alias("shard"),
                (pl.col("shard_row") + shard_row).alias("shard_row"), *self.extra,
            )
            self.write(out)
            self.doc_id += b.train.height
            self.rg += 1
        self.shards.append({"n_heldout": n_held, "n_docs": self.doc_id - start, "doc_start": start, "row_group_start": rg_start,
                            "row_group_end": self.rg, "n_chars": n_chars, "docs_digest": digest.hexdigest()[:32]})
        return pending


def _write_corpus(corpus_path: Path, files: list[Path], valid: list[np.ndarray], batch_rows: int,
                  heldout: Callable[[pl.DataFrame], object] | None, extra: dict[str, pl.DataType] | None = None) -> _CorpusStream:
    """Stream the rows ``valid`` keeps of every validated shard into ``corpus_path`` (atomically),
    handing the held-out documents to ``heldout``; returns the finished stream's counts.

    Every shard's batches are read (decompressed) on a thread ahead of the workers, each batch's
    frames (:class:`PreparedBatch`) made on a thread a core, and :meth:`_CorpusStream.shard`
    numbers, hashes and hands them on in order."""
    schema = _corpus_schema(extra)
    names = list(extra or {})
    workers = cores()
    read = prefetch(_shard_batches(files, batch_rows, names), depth=4)
    prepared = ahead(lambda item: _prepare_batch(*item, valid, names), read, depth=2 * workers, workers=workers)
    with atomic_writer(corpus_path) as sink, contextlib.closing(read), contextlib.closing(prepared) as ready:
        with (pq.ParquetWriter(sink, schema, compression="zstd", compression_level=ZSTD_LEVEL, write_statistics=False) as writer,
              # each row group compressed and written on a thread of its own, in order, while the next batch is worked on
              behind(lambda out: writer.write_table(out.to_arrow().cast(schema), row_group_size=out.height)) as write,
              behind(heldout or (lambda docs: None)) as hold):  # the held-out documents too, on a third
            stream = _CorpusStream(write, hold, names)
            pending = next(ready, None)
            for u in range(len(files)):
                pending = stream.shard(u, pending, ready)
            if stream.held:
                hold(pl.concat(stream.held))
    return stream
