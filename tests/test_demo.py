"""``strata demo``'s configuration: three seeds, stratified and the positive control in the default set, ``--evals DIR``."""

from __future__ import annotations

import pytest
import yaml
from helpers import DATA

from evals.suites import eval_paths
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
