"""Reading a corpus into one validated table: ``id, text, source, subdomain``.

Inputs: JSONL / JSONL.gz (streamed line by line so every error names its line), Parquet, a
Hugging Face dataset (online users only), or the built-in corpus. Every problem names the file,
the line and the fix; with ``on_error="skip"`` bad records are skipped and counted instead.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.config import CorpusConfig
from pipeline.errors import StrataInputError

CORPUS_SCHEMA = {"id": pl.String, "text": pl.String, "source": pl.String, "subdomain": pl.String}


@dataclass
class CorpusReport:
    """What reading found: kept documents and every skipped record with its reason."""

    path: str
    n_read: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line, reason)
    lines: list[int] = field(default_factory=list)  # file line (or row) of each kept record


def _check_record(rec: object, cfg: CorpusConfig, where: Path | str, line: int) -> tuple[str, str, str, str]:
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
        raise StrataInputError("document text is empty or whitespace", path=where, line=line, fix="remove the record or set corpus.on_error: skip")
    doc_id = rec.get(cfg.id_field, line)
    source = rec.get(cfg.source_field, "corpus")
    subdomain = rec.get("subdomain", source)
    return str(doc_id), text, str(source), str(subdomain)


def _read_jsonl(path: Path, cfg: CorpusConfig, report: CorpusReport) -> list[tuple[str, str, str, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows: list[tuple[str, str, str, str]] = []
    try:
        with opener(path, "rb") as fh:
            for line_no, raw in enumerate(fh, start=1):
                if not raw.strip():
                    continue
                report.n_read += 1
                try:
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise StrataInputError(
                            f"invalid UTF-8 at byte {exc.start}", path=path, line=line_no, fix="re-encode the file as UTF-8"
                        ) from None
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise StrataInputError(
                            f"malformed JSON ({exc.msg} at column {exc.colno})", path=path, line=line_no,
                            fix="make each line one complete JSON object, or set corpus.on_error: skip",
                        ) from None
                    rows.append(_check_record(rec, cfg, path, line_no))
                    report.lines.append(line_no)
                except StrataInputError as err:
                    if cfg.on_error == "fail":
                        raise
                    report.skipped.append((line_no, err.problem))
    except (OSError, EOFError) as exc:
        raise StrataInputError(f"cannot read the corpus file ({exc})", path=path, fix="check the path and permissions, and that .gz files are complete") from exc
    return rows


def _read_parquet(path: Path, cfg: CorpusConfig, report: CorpusReport) -> list[tuple[str, str, str, str]]:
    try:
        df = pl.read_parquet(path)
    except Exception as exc:  # polars raises several types for unreadable files
        raise StrataInputError(f"cannot read Parquet ({exc})", path=path, fix="check the file is a complete Parquet file") from exc
    rows = []
    for i, rec in enumerate(df.iter_rows(named=True), start=1):
        report.n_read += 1
        try:
            rows.append(_check_record(rec, cfg, path, i))
            report.lines.append(i)
        except StrataInputError as err:
            if cfg.on_error == "fail":
                raise StrataInputError(err.problem, path=path, line=None, fix=f"row {i}: {err.fix}") from None
            report.skipped.append((i, err.problem))
    return rows


def _read_hf(cfg: CorpusConfig, report: CorpusReport) -> list[tuple[str, str, str, str]]:
    import datasets

    ds = datasets.load_dataset(cfg.hf_dataset, split=cfg.hf_split)
    rows = []
    for i, rec in enumerate(ds, start=1):
        report.n_read += 1
        try:
            rows.append(_check_record(rec, cfg, cfg.hf_dataset, i))
            report.lines.append(i)
        except StrataInputError as err:
            if cfg.on_error == "fail":
                raise
            report.skipped.append((i, err.problem))
    return rows


def read_corpus(cfg: CorpusConfig, seed: int = 0) -> tuple[pl.DataFrame, CorpusReport]:
    """Read and validate the configured corpus; see module docstring."""
    if cfg.path:
        path = Path(cfg.path).expanduser()
        report = CorpusReport(str(path))
        if not path.is_file():
            raise StrataInputError("corpus file not found", path=path, fix="set corpus.path to an existing .jsonl, .jsonl.gz or .parquet file")
        if path.suffix == ".parquet":
            rows = _read_parquet(path, cfg, report)
        elif path.name.endswith((".jsonl", ".jsonl.gz", ".json", ".ndjson")):
            rows = _read_jsonl(path, cfg, report)
        else:
            raise StrataInputError("unknown corpus format", path=path, fix="use .jsonl, .jsonl.gz or .parquet")
    elif cfg.hf_dataset:
        report = CorpusReport(f"hf:{cfg.hf_dataset}")
        rows = _read_hf(cfg, report)
    else:
        from pipeline.data.builtin_corpus import builtin_documents

        report = CorpusReport("builtin")
        rows = builtin_documents(cfg.builtin_max_docs)
        report.n_read = len(rows)
        report.lines = list(range(1, len(rows) + 1))
    df = pl.DataFrame(rows, schema=CORPUS_SCHEMA, orient="row")
    dup = df["id"].is_duplicated().to_numpy()
    if dup.any():
        lines = np.asarray(report.lines)
        if cfg.on_error == "fail":
            first = df["id"][int(np.flatnonzero(dup)[0])]
            where = lines[df["id"].to_numpy() == first].tolist()[:5]
            raise StrataInputError(
                f"duplicate document id {first!r} (records {where})", path=report.path,
                fix="give every document a unique id, set corpus.id_field to a unique field, or corpus.on_error: skip",
            )
        later = df["id"].is_duplicated().to_numpy() & ~df["id"].is_first_distinct().to_numpy()
        report.skipped += [(int(line), f"duplicate document id {i!r}") for line, i in zip(lines[later], df["id"].filter(pl.Series(later)))]
        df = df.filter(pl.Series(~later))
    if df.height == 0:
        raise StrataInputError("the corpus has no usable documents", path=report.path, fix="point corpus.path at a non-empty corpus")
    if cfg.max_docs and df.height > cfg.max_docs:
        rng = np.random.default_rng(seed)
        keep = np.sort(rng.choice(df.height, cfg.max_docs, replace=False))
        df = df[keep]
    return df, report


def content_hashes(texts: pl.Series) -> pl.Series:
    """SHA-256 (hex) of each document's UTF-8 text: the identity used for caching and dedup."""
    return pl.Series("content_hash", [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts])


def heldout_mask(hashes: pl.Series, fraction: float, seed: int) -> np.ndarray:
    """Seeded held-out split keyed on content hash: stable when documents are added or removed."""
    salt = f"{seed}:".encode()
    u = np.array([int.from_bytes(hashlib.sha256(salt + h.encode()).digest()[:8], "big") for h in hashes], dtype=np.uint64)
    return (u / np.float64(2**64)) < fraction


def corpus_fingerprint(cfg: CorpusConfig) -> str:
    """Data version of the raw corpus: SHA-256 of the file's bytes (or of the built-in
    documents, or the dataset name) plus the reading options, so editing, appending or deleting a
    document, or changing a field mapping, changes it."""
    h = hashlib.sha256(json.dumps(cfg.model_dump(), sort_keys=True).encode())
    if cfg.path:
        path = Path(cfg.path).expanduser()
        if not path.is_file():
            raise StrataInputError("corpus file not found", path=path, fix="set corpus.path to an existing .jsonl, .jsonl.gz or .parquet file")
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    elif not cfg.hf_dataset:
        from pipeline.data.builtin_corpus import builtin_documents

        for doc in builtin_documents(cfg.builtin_max_docs):
            h.update("\x1f".join(doc).encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]
