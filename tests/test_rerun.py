"""Reruns on a used data root: a changed corpus and a changed strategy list on the same root.

Issue 12: the blocking check ``ordering_is_permutation`` read every strategy's file, including
stale ones from the old corpus, so this rerun failed with a Dagster traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml
from helpers import demo_slice

from pipeline.storage.layout import Layout

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[1]


def _run(cfg: dict, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "STRATA_CONFIG": "", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(path), *extra],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600)


def _write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_rerun_with_changed_corpus_on_a_used_root(tmp_path):
    records = demo_slice(70)
    corpus = tmp_path / "corpus.jsonl"
    _write(corpus, records[:60])
    cfg = {"data_root": str(tmp_path / "root"), "corpus": {"path": str(corpus), "source_field": "domain"},
           "heldout_fraction": 0.0, "vocab_size": 300, "k": 3, "seq_len": 64, "length_bins": 4, "batch_size": 4,
           "embed_method": "shallow", "embed_max_tokens": 32, "strategies": ["random", "greedy"]}
    first = _run(cfg, tmp_path, "--select", "*orderings")
    assert first.returncode == 0, first.stderr[-3000:]
    layout = Layout(tmp_path / "root")
    old_m = pl.read_parquet(layout.ordering("greedy")).height

    # A changed corpus (other documents, another size). The random partition is re-run first, while
    # greedy's file still holds the old corpus's ordering: random's check must not read it.
    _write(corpus, records[10:70] + records[:8])
    second = _run(cfg, tmp_path, "--select", "*orderings")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    m = int(pl.read_parquet(layout.segments)["sequence_id"].max()) + 1
    assert m != old_m
    for strategy in ("random", "greedy"):  # both re-run on the new corpus
        assert sorted(pl.read_parquet(layout.ordering(strategy))["sequence_id"].to_list()) == list(range(m))
