"""``strata demo``'s configuration: three seeds, stratified and the positive control in the default set, ``--evals DIR``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import DATA

from evals.suites import eval_paths
from pipeline.cli.demo import demo_config
from pipeline.config import StrataConfig, load_config
from pipeline.config_source import write_demo_config
from pipeline.errors import StrataInputError


def test_demo_config_has_three_seeds_and_the_default_strategies(tmp_path):
    path = write_demo_config(tmp_path, None, None)
    cfg = load_config(path)
    assert cfg.seeds == [0, 1, 2] and cfg.max_steps * cfg.batch_size * cfg.seq_len == 122_880
    assert "stratified" in cfg.strategies and cfg.strategies == StrataConfig().strategies
    assert "cluster_sorted" in cfg.strategies  # the positive control the ablation report opens with
    assert not (cfg.wikitext_path or cfg.paloma_dir or cfg.dclm_dir)  # the demo evaluates no external suite by default


@pytest.mark.skipif(not (DATA / "eval").is_dir(), reason="shared eval data not found")
def test_evals_dir_turns_on_wikitext_paloma_and_dclm(tmp_path):
    cfg = load_config(write_demo_config(tmp_path, None, eval_paths(DATA / "eval")))
    assert cfg.wikitext_path.endswith("wikitext/wiki.test.raw")
    assert cfg.paloma_dir.endswith("paloma_fixture") and cfg.dclm_dir.endswith("dclm_core")
    given = tmp_path / "mine.yaml"
    given.write_text(yaml.safe_dump({"seeds": [4], "max_steps": 3}))
    cfg = load_config(write_demo_config(tmp_path, str(given), None))
    assert cfg.seeds == [4] and cfg.max_steps == 3


def test_evals_dir_without_any_suite_is_a_clear_error(tmp_path):
    with pytest.raises(StrataInputError, match="no wikitext"):
        eval_paths(tmp_path)
    with pytest.raises(StrataInputError, match="not found"):
        eval_paths(tmp_path / "missing")


def test_the_demo_scores_quality_with_the_builtin_scorer_on_the_builtin_corpus(tmp_path):
    """On the built-in corpus the demo turns on the ablation's scorer (docs/quality.md), its label files
    in the data root, written once; a corpus of the user's, or a quality of the user's, is left as given."""
    from pipeline.quality.builtin_labels import TRAINING, builtin_labels, jsonl

    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump({"corpus": {"builtin_max_docs": 240}}))
    root = tmp_path / "root"
    cfg = load_config(demo_config(root, str(small)))
    q = cfg.quality
    assert q.enabled and q.filter.keep_top == 1.0 and q.filter.threshold is None  # no filter: the orderings' bytes stay
    assert {k: getattr(q, k) for k in TRAINING} == TRAINING
    labels = builtin_labels(240)
    assert Path(q.positives) == root / "quality" / "labels" / "positives.jsonl"
    assert Path(q.positives).read_text(encoding="utf-8") == jsonl(labels.positives)
    assert Path(q.negatives).read_text(encoding="utf-8") == jsonl(labels.negatives)
    stamps = [Path(p).stat().st_mtime_ns for p in (q.positives, q.negatives)]
    assert load_config(demo_config(root, str(small))).quality == q  # a rerun: the same config, the files not rewritten
    assert [Path(p).stat().st_mtime_ns for p in (q.positives, q.negatives)] == stamps

    own = tmp_path / "own.yaml"
    own.write_text(yaml.safe_dump({"corpus": {"path": str(tmp_path / "c.jsonl")}}))
    assert not load_config(demo_config(tmp_path / "other", str(own))).quality.enabled  # no labels for the user's corpus
    assert not (tmp_path / "other" / "quality").exists()
    own.write_text(yaml.safe_dump({"corpus": {"builtin_max_docs": 240}, "quality": {"enabled": False}}))
    assert not load_config(demo_config(tmp_path / "third", str(own))).quality.enabled
    with pytest.raises(StrataInputError, match="not empty"):  # a folder of the user's gets no label file
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "notes.txt").write_text("mine")
        demo_config(tmp_path / "mine", str(small))
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]
