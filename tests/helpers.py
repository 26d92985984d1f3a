"""Helpers shared by the tests: the shared data folder, small real corpora made from it, and the
numba kernels' chunked paths."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
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
    documents of its ``corpus.parquet`` with their texts (read from the validated shards) and its
    reading report."""
    import polars as pl

    from pipeline.data.corpus import build_corpus
    from pipeline.data.shard_docs import corpus_texts

    out = Path(tempfile.mkdtemp(dir=work))
    build = build_corpus(cfg, 0, 0.0, out / "shards", out / "corpus.parquet")
    docs = pl.read_parquet(out / "corpus.parquet")
    texts = list(corpus_texts(out / "corpus.parquet", build.manifest, out / "shards"))
    return docs.insert_column(2, pl.concat(texts) if texts else pl.Series("text", [], pl.String)), build.report


def three_shard_corpus(tmp_path: Path, max_docs: int):
    """``build_corpus`` of 120 demo documents written as 3 Parquet shards (ids ``d<shard>-<row>``)
    under ``tmp_path/root<max_docs>`` (``corpus/shards``, ``corpus.parquet``): ``(build, data root,
    text by id)``."""
    import polars as pl

    from pipeline.config import CorpusConfig
    from pipeline.data.corpus import build_corpus

    recs = demo_slice(120, stride=13)
    src = tmp_path / f"src{max_docs}"
    src.mkdir()
    by_id = {}
    for i in range(3):
        rows = [{"id": f"d{i}-{j}", "text": r["text"]} for j, r in enumerate(recs[i::3])]
        pl.DataFrame(rows).write_parquet(src / f"part-{i}.parquet")
        by_id.update((r["id"], r["text"]) for r in rows)
    out = tmp_path / f"root{max_docs}"
    build = build_corpus(CorpusConfig(path=str(src), max_docs=max_docs), 0, 0.0, out / "corpus" / "shards", out / "corpus.parquet")
    return build, out, by_id


def small_graph_config(corpus: Path) -> dict:
    """Keys of a data root built in about a minute on 2 cores: a demo-corpus slice at ``corpus``
    (see :func:`demo_slice`), 2 strategies, 4 training steps, shallow embeddings (no model to load)."""
    return {"corpus": {"path": str(corpus), "source_field": "domain"}, "heldout_fraction": 0.05, "vocab_size": 512,
            "k": 4, "seq_len": 64, "length_bins": 8, "strategies": ["random", "greedy"], "batch_size": 8,
            "max_steps": 4, "warmup_steps": 1, "heldout_every": 2, "heldout_docs": 8, "eval_limit": 2,
            "embed_method": "shallow", "embed_max_tokens": 64, "stationarity_shuffles": 5, "claims": {"probe_batches": 2},
            "bootstrap_samples": 200}


@contextmanager
def chunked_threads(monkeypatch) -> Iterator[list[int]]:
    """The kernels of ``pipeline.segments.n_chunks`` split every input (chunks of one row minimum);
    yields the thread counts to run them on (1, and 2 where numba has two), numba's own restored after."""
    import numba

    from pipeline import segments

    monkeypatch.setattr(segments, "MIN_CHUNK_ROWS", 1)
    before = numba.get_num_threads()
    try:
        yield sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)})
    finally:
        numba.set_num_threads(before)


def demo_domains(domains: tuple[str, ...], per_domain: int) -> list[dict]:
    """The first ``per_domain`` documents of each of ``domains`` in the demo corpus (its domains as named sources)."""
    if not DEMO_CORPUS.exists():
        pytest.skip(f"shared data not found at {DEMO_CORPUS} (set STRATA_SHARED)")
    got: dict[str, list[dict]] = {d: [] for d in domains}
    with gzip.open(DEMO_CORPUS, "rt", encoding="utf-8") as fh:
        for line in fh:
            if any(f'"domain": "{d}"' in line for d in domains):
                rec = json.loads(line)
                if rec["domain"] in got and len(got[rec["domain"]]) < per_domain:
                    got[rec["domain"]].append(rec)
                    if all(len(v) == per_domain for v in got.values()):
                        break
    return [r for d in domains for r in got[d]]


def stage_shares(order: np.ndarray, g: np.ndarray, ends: list[float]) -> np.ndarray:
    """Realized group shares per stage of a blend's order (``g``: sequences x groups tokens), each
    position in the stage its first token falls in (computed here, not by the library)."""
    tok = g[order]
    start = np.r_[0, np.cumsum(tok.sum(axis=1))[:-1]]
    stage = np.minimum(np.searchsorted(np.array(ends) * tok.sum(), start, side="right"), len(ends) - 1)
    return np.array([tok[stage == k].sum(axis=0) / tok[stage == k].sum() for k in range(len(ends))])
