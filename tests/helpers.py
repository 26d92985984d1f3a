"""Helpers shared by the tests: the shared data folder and small real corpora made from it."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path

import pytest

SHARED = Path(os.environ.get("STRATA_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
DATA = SHARED / "data"
DEMO_CORPUS = DATA / "corpus" / "demo_corpus.jsonl.gz"


def demo_slice(n: int, stride: int = 47) -> list[dict]:
    """Every ``stride``-th document of the demo corpus (all domains represented), first ``n``."""
    if not DEMO_CORPUS.exists():
        pytest.skip(f"shared data not found at {DEMO_CORPUS} (set STRATA_SHARED)")
    out = []
    with gzip.open(DEMO_CORPUS, "rt", encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i % stride == 0:
                out.append(json.loads(line))
                if len(out) == n:
                    break
    return out


def built_corpus(cfg, work: Path):
    """``build_corpus`` of ``cfg`` in a new folder under ``work``, with no held-out split: the
    documents of its ``corpus.parquet`` and its reading report."""
    import polars as pl

    from pipeline.data.corpus import build_corpus

    out = Path(tempfile.mkdtemp(dir=work))
    build = build_corpus(cfg, 0, 0.0, out / "shards", out / "corpus.parquet")
    return pl.read_parquet(out / "corpus.parquet"), build.report
