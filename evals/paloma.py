"""Paloma-style evaluation data: the directory layout and the per-source bits-per-byte average.

Layout (Paloma, Magnusson et al. 2023): ``<root>/<source>/<split>/*.jsonl.gz``, one JSON object
per line with at least ``text`` and ``id`` (Paloma adds ``source``, ``subdomain``, ``added``,
``metadata``). The source is the directory name; the subdomain is the ``subdomain`` field
(the source itself when absent).

Metric (Paloma): bits per byte of a subdomain = sum over its documents of -log2 p(text) divided
by the sum of their UTF-8 bytes; a source's value is the plain mean over its subdomains; the
suite's value is the plain mean over sources.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.errors import StrataInputError
from pipeline.storage.atomic import atomic_path
from pipeline.threads import parallel_map

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _safe_name(name: str) -> str:
    safe = _SAFE.sub("_", name).strip("._")
    if not safe:
        raise StrataInputError(f"source name {name!r} gives no usable directory name", fix="use a non-empty source label")
    return safe


WRITE_ROWS = 8192  # documents a write: a file's JSON lines are never held whole


def write_paloma_layout(docs: pl.DataFrame, out_dir: str | Path, split: str = "val",
                        docs_per_shard: int = 100_000) -> list[Path]:
    """Write documents as ``<out_dir>/<source>/<split>/<source>_<shard>.jsonl.gz`` (Paloma's layout).

    ``docs`` needs ``text``, ``id``, ``source`` (``subdomain`` optional, default: the source).
    Rows keep their order within a source; gzip headers carry no timestamp, so equal inputs give
    equal bytes. Returns the written files.
    """
    missing = [c for c in ("text", "id", "source") if c not in docs.columns]
    if missing:
        raise StrataInputError(f"held-out documents lack columns {missing}", fix="pass a frame with text, id, source[, subdomain]")
    if docs.height == 0:
        raise StrataInputError("no held-out documents to write", fix="hold out at least one document")
    if "subdomain" not in docs.columns:
        docs = docs.with_columns(pl.col("source").alias("subdomain"))
    docs = docs.select(pl.col("text").cast(pl.String), pl.col("id").cast(pl.String),
                       pl.col("source").cast(pl.String), pl.col("subdomain").cast(pl.String))
    out_dir = Path(out_dir)
    counts = dict(docs.group_by("source").len().iter_rows())
    files = [(source, shard, start) for source in sorted(counts) for shard, start in enumerate(range(0, counts[source], docs_per_shard))]

    def write(file: tuple[str, int, int]) -> Path:  # files on a thread a core: gzip's compression releases the GIL
        source, shard, start = file
        name = _safe_name(source)
        path = out_dir / name / split / f"{name}_{shard:08d}.jsonl.gz"
        part = docs.filter(pl.col("source") == source).slice(start, docs_per_shard)
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                for chunk in part.iter_slices(WRITE_ROWS):  # deflate's stream does not depend on how it is fed
                    gz.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in chunk.iter_rows(named=True)).encode("utf-8"))
        return path

    return parallel_map(write, files)


def read_paloma_docs(root: str | Path, split: str = "val", docs_per_subdomain: int | None = None) -> pl.DataFrame:
    """Documents (text, id, source, subdomain) of every ``<source>/<split>/*.jsonl[.gz]`` under ``root``.

    Sources and files are read in sorted order; ``docs_per_subdomain`` keeps the first N
    documents of each subdomain (a cheap, deterministic limit for CPU runs).
    """
    root = Path(root)
    if not root.is_dir():
        raise StrataInputError("Paloma-style directory not found", fix="pass a directory laid out as <source>/<split>/*.jsonl.gz", path=root)
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


def aggregate_bpb(per_doc: pl.DataFrame, suite: str) -> list[dict[str, Any]]:
    """Tidy rows of Paloma's bits per byte from per-document log-likelihoods.

    ``per_doc``: source, subdomain, loglikelihood (natural log, summed over the document), n_bytes.
    Rows: ``task="<source>/<subdomain>"`` (byte-weighted within the subdomain), ``task=<source>``
    (mean over its subdomains) and ``task="mean"`` (mean over sources), metric ``bits_per_byte``.
    """
    if per_doc.height == 0:
        raise StrataInputError("no documents were scored", fix="check the Paloma-style directory")
    sub = (per_doc.group_by("source", "subdomain")
           .agg((-pl.col("loglikelihood").sum() / (pl.col("n_bytes").sum() * math.log(2))).alias("bpb"), pl.len().alias("n"))
           .sort("source", "subdomain"))
    src = sub.group_by("source").agg(pl.col("bpb").mean(), pl.col("n").sum()).sort("source")
    rows = [{"suite": suite, "task": f"{r['source']}/{r['subdomain']}", "metric": "bits_per_byte",
             "value": float(r["bpb"]), "n": int(r["n"])} for r in sub.iter_rows(named=True)]
    rows += [{"suite": suite, "task": r["source"], "metric": "bits_per_byte", "value": float(r["bpb"]), "n": int(r["n"])}
             for r in src.iter_rows(named=True)]
    rows.append({"suite": suite, "task": "mean", "metric": "bits_per_byte", "value": float(src["bpb"].mean()),
                 "n": int(src["n"].sum())})
    return rows
