"""Paloma-style evaluation data: the directory layout, written (the held-out split) and read (the
held-out batch, the mixture target, decontamination, the evaluations).

Layout (Paloma, Magnusson et al. 2023): ``<root>/<source>/<split>/*.jsonl.gz``, one JSON object
per line with at least ``text`` and ``id`` (Paloma adds ``source``, ``subdomain``, ``added``,
``metadata``). The source is the directory name; the subdomain is the ``subdomain`` field
(the source itself when absent).

The metric (bits per byte per subdomain and source) is ``evals/paloma.py``'s.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.errors import StrataInputError

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _safe_name(name: str) -> str:
    safe = _SAFE.sub("_", name).strip("._")
    if not safe:
        raise StrataInputError(f"source name {name!r} gives no usable directory name", fix="use a non-empty source label")
    return safe


WRITE_ROWS = 8192  # documents a write: a file's JSON lines are never held whole


LINE_COLUMNS = ("text", "id", "source", "subdomain")  # each JSON line's keys, in this order


class _Appender:
    """A write-only file object that opens ``path`` for each write: a writer with a stream per
    source holds no file descriptor between its writes, however many sources there are."""

    def __init__(self, path: Path):
        self.path = path
        path.write_bytes(b"")

    def write(self, data: bytes) -> int:
        with open(self.path, "ab") as fh:
            return fh.write(data)

    def flush(self) -> None:
        pass


class PalomaWriter:
    """Documents streamed into Paloma's layout as they come: ``<out_dir>/<source>/<split>/<source>_<shard>.jsonl.gz``,
    ``docs_per_shard`` documents a file, in the order :meth:`add` receives them within each source.

    Each source keeps one gzip stream open (a zlib state, ~256 KB; no file descriptor between
    writes) until its file is full or :meth:`close`. Deflate's output does not depend on how its
    input is split, and gzip headers carry no timestamp, so the files are byte for byte those of
    :func:`write_paloma_layout` on all the documents at once, whatever the batches. Files are
    written under a ``.part`` name, synced and renamed by :meth:`close`; leaving the ``with`` block on an
    exception removes them. Not thread-safe: one caller (or one ``pipeline.threads.behind`` thread).
    """

    def __init__(self, out_dir: str | Path, split: str = "val", docs_per_shard: int = 100_000):
        if docs_per_shard < 1:
            raise StrataInputError(f"docs_per_shard={docs_per_shard} is impossible", fix="use at least 1 document a file")
        self.out_dir, self.split, self.docs_per_shard = Path(out_dir), split, int(docs_per_shard)
        self.streams: dict[str, list] = {}  # source -> [gzip stream, its .part path, final path, documents in it, shard]
        self.sources: dict[str, str] = {}  # directory name -> source
        self.parts: list[tuple[Path, Path]] = []  # (.part, final) of every file, in order opened
        self.files: list[Path] = []  # the files :meth:`close` has named
        self.n_docs = 0

    def __enter__(self) -> "PalomaWriter":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            try:
                self.close()
                return
            except BaseException:
                self._discard()
                raise
        self._discard()

    def _discard(self) -> None:
        """Remove every file not named yet (after an error)."""
        for stream in self.streams.values():
            stream[0].close()
        self.streams = {}
        for part, _ in self.parts:
            part.unlink(missing_ok=True)

    def _stream(self, source: str) -> list:
        """``source``'s open stream, a new file when it has none or its file is full."""
        stream = self.streams.get(source)
        if stream is not None and stream[3] < self.docs_per_shard:
            return stream
        if stream is not None:
            stream[0].close()
        name = _safe_name(source)
        if self.sources.setdefault(name, source) != source:
            raise StrataInputError(f"sources {self.sources[name]!r} and {source!r} both map to the directory {name!r}",
                                   fix="give sources names that differ in letters, digits, '.', '_' or '-'")
        shard = 0 if stream is None else stream[4] + 1
        path = self.out_dir / name / self.split / f"{name}_{shard:08d}.jsonl.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".part")
        self.parts.append((part, path))
        stream = [gzip.GzipFile(filename="", mode="wb", fileobj=_Appender(part), mtime=0), part, path, 0, shard]
        self.streams[source] = stream
        return stream

    def add(self, docs: pl.DataFrame) -> None:
        """Append ``docs`` (``text``, ``id``, ``source``; ``subdomain`` optional, default: the
        source) to their sources' files, in row order."""
        missing = [c for c in ("text", "id", "source") if c not in docs.columns]
        if missing:
            raise StrataInputError(f"held-out documents lack columns {missing}", fix="pass a frame with text, id, source[, subdomain]")
        if "subdomain" not in docs.columns:
            docs = docs.with_columns(pl.col("source").alias("subdomain"))
        docs = docs.select(pl.col(c).cast(pl.String) for c in LINE_COLUMNS)
        if docs["source"].null_count():
            raise StrataInputError("a held-out document has no source", fix="give every document a source label")
        self.n_docs += docs.height
        for (source,), rows in docs.group_by("source", maintain_order=True):
            at = 0
            while at < rows.height:
                stream = self._stream(str(source))
                n = min(rows.height - at, self.docs_per_shard - stream[3])
                for chunk in rows.slice(at, n).iter_slices(WRITE_ROWS):  # a file's JSON lines are never held whole
                    stream[0].write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in chunk.iter_rows(named=True)).encode("utf-8"))
                stream[3] += n
                at += n

    def close(self) -> list[Path]:
        """Finish every file and give it its name; returns every file written, sorted."""
        for stream in self.streams.values():
            stream[0].close()
        self.streams = {}
        for part, path in self.parts:
            with open(part, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(part, path)
        self.files = sorted({*self.files, *(path for _, path in self.parts)})
        self.parts = []
        return self.files


def write_paloma_layout(docs: pl.DataFrame, out_dir: str | Path, split: str = "val",
                        docs_per_shard: int = 100_000) -> list[Path]:
    """Write documents as ``<out_dir>/<source>/<split>/<source>_<shard>.jsonl.gz`` (Paloma's layout).

    ``docs`` needs ``text``, ``id``, ``source`` (``subdomain`` optional, default: the source).
    Rows keep their order within a source; gzip headers carry no timestamp, so equal inputs give
    equal bytes (:class:`PalomaWriter`, which streams the same files batch by batch). Returns the
    written files.
    """
    if docs.height == 0:
        raise StrataInputError("no held-out documents to write", fix="hold out at least one document")
    with PalomaWriter(out_dir, split, docs_per_shard) as writer:
        writer.add(docs)
    return writer.files


def read_paloma_docs(root: str | Path, split: str = "val", docs_per_subdomain: int | None = None) -> pl.DataFrame:
    """Documents (text, id, source, subdomain) of every ``<source>/<split>/*.jsonl[.gz]`` under ``root``.

    Sources and files are read in sorted order; ``docs_per_subdomain`` keeps the first N
    documents of each subdomain (a cheap, deterministic limit for CPU runs).
    """
    root = Path(root)
    if not root.is_dir():
        raise StrataInputError("Paloma-style directory not found", fix="pass a directory laid out as <source>/<split>/*.jsonl.gz",
                               path=root)
    files = sorted(p for p in root.glob(f"*/{split}/*") if p.name.endswith((".jsonl", ".jsonl.gz")))
    if not files:
        raise StrataInputError(f"no <source>/{split}/*.jsonl[.gz] files", fix="check the directory and the split name", path=root)
    rows: list[dict[str, Any]] = []
    for path in files:
        source = path.parent.parent.name
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8", newline="") as fh:
            for i, line in enumerate(fh.read().split("\n"), start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise StrataInputError(f"malformed JSON ({exc.msg})", fix="repair the file", path=path, line=i) from exc
                if not isinstance(obj.get("text"), str):
                    raise StrataInputError("missing text field", fix="every line needs a string 'text'", path=path, line=i)
                rows.append({"text": obj["text"], "id": str(obj.get("id", f"{path.name}:{i}")), "source": source,
                             "subdomain": str(obj.get("subdomain") or source)})
    df = pl.DataFrame(rows, schema={"text": pl.String, "id": pl.String, "source": pl.String, "subdomain": pl.String})
    if docs_per_subdomain is not None:
        df = df.filter(pl.int_range(pl.len()).over("source", "subdomain") < docs_per_subdomain)
    return df


