"""Held-out documents written in Paloma's layout, so Strata's own split and real Paloma load alike.

Layout: ``<out>/<source>/val/<source>_<subdomain>.jsonl.gz`` with fields
``text, id, source, subdomain`` (Paloma's own files carry more fields; only these are read).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import polars as pl

from pipeline.io import atomic_path


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "unknown"


def write_paloma_layout(docs: pl.DataFrame, out_dir: Path, split: str = "val") -> list[Path]:
    """Write ``docs`` (id, text, source, subdomain) grouped by source and subdomain; return the files."""
    written: list[Path] = []
    for (source, subdomain), group in sorted(docs.group_by("source", "subdomain"), key=lambda kv: kv[0]):
        path = out_dir / _safe(source) / split / f"{_safe(source)}_{_safe(subdomain)}.jsonl.gz"
        with atomic_path(path) as tmp:
            with gzip.GzipFile(tmp, "wb", mtime=0) as fh:
                for row in group.sort("id").iter_rows(named=True):
                    rec = {"text": row["text"], "id": row["id"], "source": source, "subdomain": subdomain}
                    fh.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
        written.append(path)
    return written
