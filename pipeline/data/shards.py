"""Corpus shards: discovering them and reading each one as a stream of validated record batches.

``corpus.path`` names a file, a directory (every shard file below it), a glob (``data/*.parquet``)
or a list of these, each a local path or an object-store URL (``s3://bucket/prefix/``,
``s3://bucket/data/*.jsonl.gz``, ``gs://…``: every object is a shard like a file; reading and
listing go through :mod:`pipeline.storage.remote`, the one layer that knows about URLs). Shard formats: Parquet (read by row-group batches
with pyarrow), and JSONL (``.jsonl``/``.json``/``.ndjson``), plain or compressed with gzip (``.gz``) or Zstandard (``.zst``),
decompressed by pyarrow's streams and read line by line so every error names its line. Shards are
read in sorted path order; a shard's documents keep their file order.

Validation is the same for every format: a record needs a non-empty string text; ``id`` defaults
to the line (JSONL) or row (Parquet) number, ``source`` to ``"corpus"``, ``subdomain`` to the
source. With ``on_error: fail`` the first bad record stops the run naming the shard file, its line
(or row) and the fix; with ``on_error: skip`` bad records are counted per shard.

:func:`read_shard` is a pure per-shard function (a path in, batches out) so that an engine can map
it over shards; :func:`validate_shard` writes one shard's validated documents to Parquet.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import CorpusConfig
from pipeline.errors import StrataInputError
from pipeline.storage import remote
from pipeline.storage.layout import is_data_root
from pipeline.storage.remote import fingerprint, is_url, open_input, translate

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
COMPRESSIONS = ("", ".gz", ".zst")
SHARD_SUFFIXES = (".parquet", *(s + c for s in JSONL_SUFFIXES for c in COMPRESSIONS))
BATCH_ROWS = 8192  # records per batch: peak memory of reading is this many documents' text
SHARD_COLUMNS = {"id": pl.String, "text": pl.String, "source": pl.String, "subdomain": pl.String, "line": pl.Int64}
FORMATS = "Parquet (.parquet) or JSONL (.jsonl/.json/.ndjson, optionally .gz or .zst)"
COLUMN_TYPES = {"number": pl.Float64, "string": pl.String}  # a declared corpus column's type (corpus.columns) as it is stored


def declared_columns(cfg: CorpusConfig) -> dict[str, pl.DataType]:
    """The corpus columns ``corpus.columns`` declares, by name, with their stored types: what every
    record of the corpus must hold, carried through to ``corpus.parquet`` and ``documents.parquet``."""
    return {name: COLUMN_TYPES[kind] for name, kind in sorted(cfg.columns.items())}


@dataclass
class ShardReport:
    """What reading one shard found: records read and every skipped record (line or row, reason)."""

    path: str
    n_read: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)
    surrogates_replaced: int = 0  # records whose strings held lone UTF-16 surrogates, replaced by U+FFFD
    files: list[list] = field(default_factory=list)  # a group of files: [file, records kept] of each, in order


_SURROGATE = re.compile("[\ud800-\udfff]")  # in a str from json.loads a surrogate is always lone (pairs decode to one code point)


def replace_surrogates(row: tuple) -> tuple[tuple, bool]:
    """``row`` with every lone surrogate of its strings replaced by U+FFFD (UTF-8 cannot encode one), and whether any was."""
    if not any(isinstance(v, str) and _SURROGATE.search(v) for v in row):
        return row, False
    return tuple(_SURROGATE.sub("\ufffd", v) if isinstance(v, str) else v for v in row), True


def is_shard(path: Path | str) -> bool:
    return _name(path).endswith(SHARD_SUFFIXES)


def _name(path: Path | str) -> str:
    return path.rsplit("/", 1)[-1] if isinstance(path, str) else path.name


def _is_url(path: object) -> bool:
    return is_url(path)


def _entries(spec: str | Sequence[str]) -> list[str]:
    if isinstance(spec, str):
        return [spec] if spec else []
    return [str(s) for s in spec]


def _walk(base: Path, entry: str) -> Iterator[Path]:
    """Every file below the directory ``base`` (symlinks followed), sorted, never inside a data root
    (:func:`pipeline.storage.layout.is_data_root`) or a hidden folder; a symlink back to a folder
    it lies in (a cycle, which ``**`` would follow forever) is a StrataInputError naming it. Entries
    that are neither a folder nor a file (a dangling symlink: a disk not mounted) come too, so that
    one with a shard's name is refused (:func:`_check_files`), never silently dropped."""
    def visit(d: Path, ancestors: frozenset) -> Iterator[Path]:
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as exc:
            raise StrataInputError(f"cannot list a corpus folder ({exc.strerror})", path=d, fix="check its permissions") from None
        for e in entries:
            p = Path(e.path)
            try:
                is_dir = e.is_dir()
            except OSError:  # a symlink that cannot be followed (a loop, no permission): not a file either
                is_dir = False
            if not is_dir:
                yield p
                continue
            if e.name.startswith(".") or is_data_root(p):
                continue
            st = p.stat()
            key = (st.st_dev, st.st_ino)
            if key in ancestors:
                raise StrataInputError(f"symbolic link cycle: {p} leads back to {p.resolve()}, a folder it lies in", path=p,
                                       fix=f"remove the link, or set corpus.path to files or a pattern that does not cross it ({entry!r})")
            yield from visit(p, ancestors | {key})

    st = base.stat()
    yield from visit(base, frozenset({(st.st_dev, st.st_ino)}))


def _check_files(files: list[Path]) -> list[Path]:
    """``files`` when each is a readable regular file (symlinks followed), else a StrataInputError
    naming the first that is not: a dangling symlink (an unmounted disk) would drop its documents,
    and prune its shard's artifacts, without a word."""
    for p in files:
        if p.is_file():
            continue
        if p.is_symlink():
            target = os.readlink(p)
            raise StrataInputError(f"the corpus shard is a symbolic link to {target}, which cannot be read (missing, or a disk "
                                   "not mounted)", path=p, fix="mount or restore its target, or remove the link to leave the shard out")
        raise StrataInputError("the corpus shard is not a regular file", path=p,
                               fix="replace it by the shard file, or move it out of corpus.path")
    return files


def _in_data_root(path: Path) -> Path | None:
    """The data root ``path`` lies in, if any (checked on every folder above it)."""
    for parent in path.resolve().parents:
        if is_data_root(parent):
            return parent
    return None


def _glob_base(entry: str) -> tuple[Path, str]:
    """The folder a pattern starts from (its parts before the first wildcard) and the rest."""
    parts = Path(entry).expanduser().parts
    for i, part in enumerate(parts):
        if any(ch in part for ch in "*?["):
            return Path(*parts[:i]) if i else Path("."), "/".join(parts[i:])
    return Path(entry).expanduser(), ""


def _discover_remote(entry: str) -> list[str]:
    """Object URLs named by a URL, a prefix or a glob of one, sorted: every object below a prefix
    (or matching the pattern, ``**`` any number of folders) whose name is a shard's, never one under
    a hidden folder or under a prefix holding a Strata marker (an export's ``.strata-export``, a
    data root's ``.strata-root`` or ``strata.duckdb``), as for local folders."""
    remote.check_url(entry)
    scheme = entry[: len(entry) - len(remote.strip(entry))]
    parts = remote.strip(entry).split("/")
    wild = next((i for i, p in enumerate(parts) if any(ch in p for ch in "*?[")), None)
    if wild is not None and wild == 0:
        raise StrataInputError("a pattern in the bucket name", path=entry, fix="name the bucket, e.g. s3://bucket/data/*.jsonl")
    base = scheme + "/".join(parts[:wild] if wild is not None else parts).rstrip("/")
    objects = remote.list_objects(base)
    if wild is None and len(objects) == 1 and objects[0].url == entry:
        if not is_shard(entry):
            raise StrataInputError("unknown corpus format", path=entry, fix=f"use {FORMATS}")
        return [entry]
    rel = {o.url[len(base) + 1:]: o.url for o in objects if o.url.startswith(base + "/")}
    marked = {r.rsplit("/", 1)[0] if "/" in r else "" for r in rel if _name(r) in (*remote.MARKERS, "strata.duckdb")}
    if "" in marked:
        raise StrataInputError("the corpus prefix holds a Strata export or data root (its marker object)", path=base,
                               fix="point corpus.path at the corpus itself")

    dotted = sorted(r for r in rel if is_shard(r) and any(p in (".", "..") for p in r.split("/")))
    if dotted:  # read literally by the store, normalized away by paths and tools: refused, never skipped
        raise StrataInputError(f"{len(dotted)} corpus object(s) under the prefix have a '.' or '..' component in their key "
                               f"(e.g. {dotted[0]!r}), which Strata does not read: the key names another object once "
                               "normalized, and skipping it would drop its documents", path=base,
                               fix="copy each to a key without '.' or '..' components (and delete the old one), or move it out of "
                                   "corpus.path")

    def kept(r: str) -> bool:
        folders = r.split("/")[:-1]
        return (is_shard(r) and not any(p.startswith(".") for p in r.split("/"))
                and not any("/".join(folders[:i]) in marked for i in range(1, len(folders) + 1)))

    if wild is not None:
        rx = re.compile(_translate("/".join(parts[wild:])))
        files = [u for r, u in rel.items() if kept(r) and rx.fullmatch(r)]
        if not files:
            raise StrataInputError(f"no corpus objects match the pattern {entry!r}", path=base,
                                   fix=f"point corpus.path at {FORMATS} objects")
    else:
        files = [u for r, u in rel.items() if kept(r)]
        if not files:
            raise StrataInputError("no corpus shard objects under the URL" if objects else "no objects under the URL", path=entry,
                                   fix=f"upload {FORMATS} objects there, or correct the URL (a prefix ends with /)")
    return sorted(files)


def discover_shards(spec: str | Sequence[str]) -> list[Path | str]:
    """Shard files named by ``corpus.path`` (file, directory, glob or list), sorted, without repeats;
    object-store URLs (:func:`_discover_remote`) come as URL strings, after the local files.

    Nothing inside a Strata data root is ever a corpus shard, wherever the data root lies (its
    validated shards and reports would be read back as corpus): folders and patterns skip it, and a
    file named inside one is refused. Directories and patterns are walked with symlinks followed
    and cycles refused."""
    found: list[Path] = []
    urls: list[str] = []
    for entry in _entries(spec):
        if _is_url(entry):
            urls += _discover_remote(entry)
            continue
        path = Path(entry).expanduser()
        if any(ch in entry for ch in "*?["):
            base, pattern = _glob_base(entry)
            if _in_data_root(base / "x") is not None:
                raise StrataInputError("the corpus pattern lies inside a Strata data root", path=base,
                                       fix="point corpus.path at the corpus itself, outside the data root")
            if not base.is_dir():
                files = []
            else:
                rx = re.compile(_translate(pattern))
                files = _check_files([p for p in _walk(base, entry) if is_shard(p) and not p.name.startswith(".")
                                      and rx.fullmatch(p.relative_to(base).as_posix())])
            if not files:
                raise StrataInputError(f"no corpus shards match the pattern {entry!r}", path=path.parent,
                                       fix=f"point corpus.path at {FORMATS} files")
        elif path.is_dir():
            if (root := (path if _in_data_root(path / "x") == path.resolve() else _in_data_root(path))) is not None:
                raise StrataInputError(f"the corpus folder is (or lies inside) the Strata data root {root}", path=path,
                                       fix="point corpus.path at the corpus itself, outside the data root")
            files = _check_files([p for p in _walk(path, entry) if is_shard(p) and not p.name.startswith(".")])
            if not files:
                raise StrataInputError("the corpus directory holds no shard files", path=path, fix=f"put {FORMATS} files in it")
        elif path.is_file():
            if not is_shard(path):
                raise StrataInputError("unknown corpus format", path=path, fix=f"use {FORMATS}")
            if (root := _in_data_root(path)) is not None:
                raise StrataInputError(f"the corpus file lies inside the Strata data root {root} (Strata's own files are never corpus)",
                                       path=path, fix="point corpus.path at the corpus itself, outside the data root")
            files = [path]
        else:
            raise StrataInputError("corpus file not found", path=path,
                                   fix=f"set corpus.path to an existing file, directory or glob of {FORMATS} shards")
        found += files
    seen: set[Path] = set()
    out = []
    for p in found:
        r = p.resolve()
        if r not in seen:
            seen.add(r)
            out.append(r)
    return [*sorted(out), *sorted(dict.fromkeys(urls))]


def _translate(pattern: str) -> str:
    """A regular expression for a glob pattern over '/'-separated relative paths: ``**`` any number
    of folders, ``*`` and ``?`` within one name, ``[...]`` a character class."""
    out, i = [], 0
    parts = pattern.split("/")
    for n, part in enumerate(parts):
        last = n == len(parts) - 1
        if part == "**":
            out.append("(?:.*/)?" if not last else ".*")
            continue
        rx, i = "", 0
        while i < len(part):
            c = part[i]
            if c == "*":
                rx += "[^/]*"
            elif c == "?":
                rx += "[^/]"
            elif c == "[" and (j := part.find("]", i + 1)) > i + 1:
                body = part[i + 1 : j]
                body = body.replace("\\", "\\\\")
                rx += "[" + ("^" + body[1:] if body[0] in "!^" else body) + "]"
                i = j
            else:
                rx += re.escape(c)
            i += 1
        out.append(rx + ("" if last else "/"))
    return "".join(out)


def _options(cfg: CorpusConfig) -> str:
    """The reading options a shard's data version covers; ``columns`` only when some are declared
    (so a corpus without them keeps the fingerprints it had before the key existed)."""
    return json.dumps({k: v for k, v in cfg.model_dump().items() if k in ("text_field", "id_field", "source_field", "on_error", "columns")},
                      sort_keys=True)


def shard_fingerprint(path: Path | str, cfg: CorpusConfig) -> str:
    """Data version of one shard: SHA-256 of its bytes and of the reading options (32 hex digits).
    Remembered in this process while the file's size and modification time stay the same. An
    object's comes from its metadata instead (:func:`pipeline.storage.remote.fingerprint`: ETag and
    size, and last-modified when the ETag is not an MD5), confirmed on content when it is read."""
    opts = _options(cfg)
    if _is_url(path):
        return fingerprint(str(path), opts)
    st = Path(path).stat()
    return _file_fingerprint(str(Path(path).resolve()), st.st_size, st.st_mtime_ns, opts)


@lru_cache(maxsize=4096)
def _file_fingerprint(path: str, size: int, mtime_ns: int, opts: str, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256(opts.encode())
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()[:32]


# --------------------------------------------------------------------------- validation


def check_record(rec: object, cfg: CorpusConfig, where: Path | str, line: int) -> tuple:
    """``(id, text, source, subdomain, *declared columns)`` of one JSON record (the columns of
    :func:`declared_columns`, in its order), or a StrataInputError naming ``where``/``line``."""
    if not isinstance(rec, dict):
        raise StrataInputError("record is not a JSON object", path=where, line=line, fix="write one JSON object per line")
    if cfg.text_field not in rec:
        raise StrataInputError(
            f"missing text field {cfg.text_field!r} (keys: {sorted(rec)[:8]})",
            path=where, line=line, fix="add the field, or set corpus.text_field to the field holding the text",
        )
    text = rec[cfg.text_field]
    if not isinstance(text, str):
        raise StrataInputError(
            f"text field {cfg.text_field!r} is {type(text).__name__}, not a string",
            path=where, line=line, fix="store the document text as a JSON string",
        )
    if not text.strip():
        raise StrataInputError("document text is empty or whitespace", path=where, line=line,
                               fix="remove the record or set corpus.on_error: skip")
    doc_id = rec.get(cfg.id_field, line)
    source = rec.get(cfg.source_field, "corpus")
    subdomain = rec.get("subdomain", source)
    if not cfg.columns:
        return str(doc_id), text, str(source), str(subdomain)
    return (str(doc_id), text, str(source), str(subdomain), *(_column_value(rec, name, cfg.columns[name], where, line)
                                                             for name in sorted(cfg.columns)))


def _column_value(rec: dict, name: str, kind: str, where: Path | str, line: int) -> float | str:
    """The value of the declared column ``name`` (``corpus.columns``) in one record, checked against its type."""
    value = rec.get(name)
    if value is None:
        what = "missing" if name not in rec else "null"
        raise StrataInputError(f"the field {name!r} that corpus.columns declares is {what} (keys: {sorted(rec)[:8]})", path=where,
                               line=line, fix=f"give every record a {kind} {name!r}, remove {name} from corpus.columns, or set "
                                              "corpus.on_error: skip")
    if kind == "number":
        try:
            number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
        except OverflowError:  # an integer beyond a double's range
            number = math.inf
        if not math.isfinite(number):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise StrataInputError(f"the field {name!r} (corpus.columns: number) is {shown}, not a finite number", path=where,
                                   line=line, fix=f"write {name} as a JSON number, declare it {{{name}: string}}, or set "
                                                  "corpus.on_error: skip")
        return number
    if not isinstance(value, str):
        raise StrataInputError(f"the field {name!r} (corpus.columns: string) is {type(value).__name__}, not a string", path=where,
                               line=line, fix=f"write {name} as a JSON string, declare it {{{name}: number}}, or set corpus.on_error: skip")
    return value


def _frame(rows: list[tuple], lines: list[int], extra: dict[str, pl.DataType] | None = None) -> pl.DataFrame:
    extra = extra or {}
    df = pl.DataFrame(rows, schema=[*list(SHARD_COLUMNS)[:4], *extra], orient="row")
    return df.with_columns(line=pl.Series(lines, dtype=pl.Int64)).cast({**SHARD_COLUMNS, **extra}).select(*SHARD_COLUMNS, *extra)


def _batches(items: Iterable[tuple[int, Any]], parse: Callable[[Any, int], Any], cfg: CorpusConfig, where: str | Path,
             report: ShardReport, batch_rows: int) -> Iterator[pl.DataFrame]:
    """Validated batches of up to ``batch_rows`` records from ``(line, item)`` pairs; ``parse(item,
    line)`` gives the record. A bad record stops the run, or with ``on_error: skip`` is counted in ``report``."""
    rows: list[tuple] = []
    lines: list[int] = []
    extra = declared_columns(cfg)
    for line_no, item in items:
        report.n_read += 1
        try:
            row, replaced = replace_surrogates(check_record(parse(item, line_no), cfg, where, line_no))
            report.surrogates_replaced += replaced
            rows.append(row)
            lines.append(line_no)
        except StrataInputError as err:
            if cfg.on_error == "fail":
                raise
            report.skipped.append((line_no, err.problem))
        if len(rows) >= batch_rows:
            yield _frame(rows, lines, extra)
            rows, lines = [], []
    if rows:
        yield _frame(rows, lines, extra)


@contextlib.contextmanager
def _opened(path: Path | str, cfg: CorpusConfig, expect: str | None, sequential: bool):
    """What pyarrow reads: the local path itself, or the object open through a bounded buffer
    (checked against the data version ``expect`` the partition was fingerprinted with)."""
    if not _is_url(path):
        yield path
        return

    with open_input(str(path), expect=expect, opts=_options(cfg), sequential=sequential) as fh:
        yield fh


def _storage_error(exc: BaseException, path: Path | str) -> StrataInputError | None:
    if not _is_url(path):
        return None

    return translate(exc, str(path), "read a corpus object")


def _read_jsonl(path: Path | str, cfg: CorpusConfig, report: ShardReport, batch_rows: int,
                expect: str | None = None) -> Iterator[pl.DataFrame]:
    def parse(data: bytes, line_no: int) -> Any:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StrataInputError(f"invalid UTF-8 at byte {exc.start}", path=path, line=line_no,
                                   fix="re-encode the file as UTF-8") from None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise StrataInputError(
                f"malformed JSON ({exc.msg} at column {exc.colno})", path=path, line=line_no,
                fix="make each line one complete JSON object, or set corpus.on_error: skip",
            ) from None
        except RecursionError:
            raise StrataInputError("JSON nested too deeply to read", path=path, line=line_no,
                                   fix="flatten the record (a document is an object with a text string), "
                                       "or set corpus.on_error: skip") from None
        except ValueError as exc:  # e.g. an integer of more than 4,300 digits
            raise StrataInputError(f"unreadable JSON value ({str(exc).split(':')[0]})", path=path, line=line_no,
                                   fix="write huge numbers (ids) as strings, or set corpus.on_error: skip") from None

    try:
        codec = "gzip" if _name(path).endswith(".gz") else "zstd" if _name(path).endswith(".zst") else None
        with _opened(path, cfg, expect, sequential=True) as src, \
                pa.input_stream(str(src) if not _is_url(path) else src, compression=codec if _is_url(path) else "detect") as raw:
            numbered = enumerate(io.BufferedReader(raw, 1 << 20), start=1)  # type: ignore[arg-type]
            yield from _batches(((n, data) for n, data in numbered if data.strip()), parse, cfg, path, report, batch_rows)
    except (OSError, EOFError, pa.ArrowInvalid) as exc:
        if (err := _storage_error(exc, path)) is not None:
            raise err from None
        raise StrataInputError(f"cannot read the corpus file ({exc})", path=path,
                               fix="check the path and permissions, and that .gz/.zst files are complete") from exc


def _read_parquet(path: Path | str, cfg: CorpusConfig, report: ShardReport, batch_rows: int,
                  expect: str | None = None) -> Iterator[pl.DataFrame]:
    """Row-group batches; validation is vectorized and an error names the row (1-based)."""
    with _opened(path, cfg, expect, sequential=False) as src:
        yield from _parquet_batches(src, path, cfg, report, batch_rows)


def _parquet_batches(src, path: Path | str, cfg: CorpusConfig, report: ShardReport, batch_rows: int) -> Iterator[pl.DataFrame]:
    try:
        pf = pq.ParquetFile(src, pre_buffer=False)  # pre-buffering would read every selected column chunk of the file up front
    except StrataInputError:
        raise
    except Exception as exc:  # pyarrow raises several types for unreadable files
        if (err := _storage_error(exc, path)) is not None:
            raise err from None
        raise StrataInputError(f"cannot read Parquet ({exc})", path=path, fix="check the file is a complete Parquet file") from exc
    names = pf.schema_arrow.names
    if cfg.text_field not in names:
        raise StrataInputError(f"missing text column {cfg.text_field!r} (columns: {names[:8]})", path=path, line=1,
                               fix="add the column, or set corpus.text_field to the column holding the text")
    kind = pf.schema_arrow.field(cfg.text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        raise StrataInputError(f"text column {cfg.text_field!r} is {kind}, not a string", path=path, line=1,
                               fix="store the document text as a string column")
    extra = declared_columns(cfg)
    _check_declared(pf.schema_arrow, cfg, path)
    cols = [c for c in dict.fromkeys([cfg.text_field, cfg.id_field, cfg.source_field, "subdomain", *extra]) if c in names]
    row = 0
    try:
        batches = pf.iter_batches(batch_size=batch_rows, columns=cols, use_threads=True)
        for batch in batches:
            batch, bad_utf8 = _valid_utf8(batch)
            if bad_utf8 is not None and cfg.on_error == "fail":
                raise StrataInputError(f"invalid UTF-8 in the string column {bad_utf8[1]!r}", path=path,
                                       line=row + int(np.flatnonzero(bad_utf8[0])[0]) + 1,
                                       fix="re-encode the strings as UTF-8, or set corpus.on_error: skip (the line is the 1-based row)")
            df = pl.from_arrow(batch)
            assert isinstance(df, pl.DataFrame)
            n = df.height
            line = pl.int_range(row + 1, row + n + 1, dtype=pl.Int64, eager=True)
            text = df[cfg.text_field].cast(pl.String)
            bad = (text.is_null() | (text.str.strip_chars().str.len_bytes() == 0)).to_numpy()
            if bad_utf8 is not None:  # on_error: skip: those rows are skipped for what they are
                report.skipped += [(int(i) + row + 1, "invalid UTF-8 in a string column") for i in np.flatnonzero(bad_utf8[0])]
                bad = bad & ~bad_utf8[0]
            report.n_read += n
            if bad.any():
                first = int(np.flatnonzero(bad)[0])
                if cfg.on_error == "fail":
                    what = "null" if text[first] is None else "empty or whitespace"
                    raise StrataInputError(f"document text is {what}", path=path, line=row + first + 1,
                                           fix="remove the row or set corpus.on_error: skip (the line is the 1-based row)")
                report.skipped += [(int(i) + row + 1, "document text is empty, null or whitespace") for i in np.flatnonzero(bad)]
            if bad_utf8 is not None:
                bad = bad | bad_utf8[0]
            values, bad = _declared_values(df, extra, cfg, path, row, bad, report)
            doc_id = df[cfg.id_field].cast(pl.String) if cfg.id_field in df.columns else line.cast(pl.String)
            doc_id = doc_id.fill_null(line.cast(pl.String))
            source = (df[cfg.source_field].cast(pl.String) if cfg.source_field in df.columns
                      else pl.Series([None] * n, dtype=pl.String)).fill_null("corpus")
            sub = (df["subdomain"].cast(pl.String) if "subdomain" in df.columns
                   else pl.Series([None] * n, dtype=pl.String)).fill_null(source)
            out = pl.DataFrame({"id": doc_id, "text": text, "source": source, "subdomain": sub, "line": line, **values})
            row += n
            if not bad.all():  # a batch of skipped rows only yields nothing (an empty batch is no row group)
                yield out.filter(pl.Series(~bad)) if bad.any() else out
    except StrataInputError:
        raise
    except Exception as exc:
        if (err := _storage_error(exc, path)) is not None:
            raise err from None
        raise StrataInputError(f"cannot read Parquet after row {row} ({exc})", path=path,
                               fix="check the file is a complete Parquet file") from exc


def _check_declared(schema: pa.Schema, cfg: CorpusConfig, path: Path | str) -> None:
    """Every column ``corpus.columns`` declares is in the Parquet shard, of its type (a number: an
    integer or floating column; a string: a string column), else a StrataInputError naming it."""
    for name, kind in sorted(cfg.columns.items()):
        if name not in schema.names:
            raise StrataInputError(f"missing column {name!r} that corpus.columns declares (columns: {schema.names[:8]})", path=path,
                                   line=1, fix=f"add the column to every shard, or remove {name} from corpus.columns")
        t = schema.field(name).type
        ok = ((pa.types.is_integer(t) or pa.types.is_floating(t)) if kind == "number"
              else (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)))
        if not ok:
            raise StrataInputError(f"the column {name!r} (corpus.columns: {kind}) is {t}", path=path, line=1,
                                   fix=f"store {name} as a {'numeric' if kind == 'number' else 'string'} column, or declare it "
                                       f"{{{name}: {'string' if kind == 'number' else 'number'}}}")


def _declared_values(df: pl.DataFrame, extra: dict[str, pl.DataType], cfg: CorpusConfig, path: Path | str, row: int, bad: np.ndarray,
                     report: ShardReport) -> tuple[dict[str, pl.Series], np.ndarray]:
    """The declared columns of a Parquet batch (their stored types) and ``bad`` with the rows that
    lack a value (null, or a number that is NaN or infinite) added: the first stops the run under
    ``on_error: fail``, else they are skipped and counted."""
    values = {}
    for name, dtype in extra.items():
        col = df[name].cast(dtype)
        missing = col.is_null() | (~col.is_finite()).fill_null(True) if dtype == pl.Float64 else col.is_null()
        miss = missing.to_numpy() & ~bad
        if miss.any():
            first = int(np.flatnonzero(miss)[0])
            what = "null" if col[first] is None else f"{col[first]}, not a finite number"
            if cfg.on_error == "fail":
                raise StrataInputError(f"the column {name!r} that corpus.columns declares is {what}", path=path, line=row + first + 1,
                                       fix=f"give every row a value of {name}, remove {name} from corpus.columns, or set "
                                           "corpus.on_error: skip (the line is the 1-based row)")
            report.skipped += [(int(i) + row + 1, f"the declared column {name!r} has no value") for i in np.flatnonzero(miss)]
            bad = bad | miss
        values[name] = col
    return values, bad


def _valid_utf8(batch):
    """``(batch, None)`` when every string column is valid UTF-8 (the Arrow readers panic on one that
    is not); else the batch with the invalid values nulled and ``(bad rows mask, first bad column)``."""
    import pyarrow.compute as pc

    bad, first = None, None
    columns = list(batch.columns)
    for i, col in enumerate(columns):
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            continue
        try:
            col.validate(full=True)
            continue
        except pa.ArrowInvalid:
            pass
        raw = col.view(pa.large_binary() if pa.types.is_large_string(col.type) else pa.binary())
        mask = np.zeros(len(raw), bool)
        for j, v in enumerate(raw.to_pylist()):
            if v is not None:
                try:
                    v.decode("utf-8")
                except UnicodeDecodeError:
                    mask[j] = True
        columns[i] = pc.if_else(pa.array(mask), pa.scalar(None, raw.type), raw).view(col.type)
        bad = mask if bad is None else bad | mask
        first = first or batch.schema.names[i]
    if bad is None:
        return batch, None
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema), (bad, first)


def read_shard(path: Path | str, cfg: CorpusConfig, report: ShardReport | None = None, batch_rows: int = BATCH_ROWS,
               expect: str | None = None) -> Iterator[pl.DataFrame]:
    """Validated record batches of one shard: ``id, text, source, subdomain, line`` (see module
    docstring). ``path`` is a file or an object URL; an object is streamed through a bounded
    buffer and, with ``expect`` (its fingerprint when its partition was listed), read only while
    it is still that version."""
    report = report if report is not None else ShardReport(str(path))
    if not _is_url(path):
        path = Path(path)
    if _name(path).endswith(".parquet"):
        return _read_parquet(path, cfg, report, batch_rows, expect)
    if _name(path).endswith(SHARD_SUFFIXES):
        return _read_jsonl(path, cfg, report, batch_rows, expect)
    raise StrataInputError("unknown corpus format", path=path, fix=f"use {FORMATS}")


def read_records(records, cfg: CorpusConfig, where: str, report: ShardReport, batch_rows: int = BATCH_ROWS) -> Iterator[pl.DataFrame]:
    """Validated batches from an iterable of dict records (a data file ``datasets`` streams)."""
    return _batches(enumerate(records, start=1), lambda record, _: record, cfg, where, report, batch_rows)



# --------------------------------------------------------------------------- small files grouped

GROUP_CAP = 2  # a group never passes this many times ``group_bytes`` (a file at least group_bytes stays alone)


def shard_size(path: Path | str) -> int:
    """Bytes of a shard file (an object's size from its listing)."""
    if _is_url(path):
        return remote.object_info(str(path)).size
    return Path(path).stat().st_size


def starts_group(path: Path | str, size: int, group_bytes: int) -> bool:
    """Whether a file smaller than ``group_bytes`` begins a new group: true with probability about
    ``size / group_bytes`` (its size rounded up to a power of two), drawn from a hash of its name
    alone. So a group holds about ``group_bytes`` (half to all of it on average) and where the
    groups begin depends on each file's own name and rough size, never on the files around it:
    adding, removing or editing a file changes its own group (two, when it now begins one), not
    every group after it."""
    weight = 1 << max(int(size) - 1, 0).bit_length()
    draw = int.from_bytes(hashlib.sha256(_name(path).encode()).digest()[:8], "big")
    return draw * group_bytes < weight << 64


def group_files(files: Sequence[Path | str], sizes: Sequence[int], group_bytes: int) -> list[list[Path | str]]:
    """``files`` (in their order) cut into groups: a file of ``group_bytes`` or more alone, the
    smaller ones packed in order into groups that begin where :func:`starts_group` says (or where
    adding the next file would pass ``GROUP_CAP`` times ``group_bytes``). ``group_bytes`` 0: every
    file alone."""
    groups: list[list[Path | str]] = []
    total, open_ = 0, False  # bytes of the last group; whether small files may join it
    for path, size in zip(files, sizes):
        small = 0 < group_bytes and size < group_bytes
        if small and open_ and total + size <= GROUP_CAP * group_bytes and not starts_group(path, size, group_bytes):
            groups[-1].append(path)
            total += size
        else:
            groups.append([path])
            total, open_ = size, small
    return groups
