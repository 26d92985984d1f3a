"""The typed configuration: types, ranges, unknown keys, name lists, data-root precedence, exit codes."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from pipeline import names
from pipeline.config import CorpusConfig, StrataConfig, config_from_dict, load_config, resolve_config
from pipeline.errors import StrataInputError


def test_defaults_and_attribute_access():
    cfg = config_from_dict({"corpus": {"path": "c.jsonl"}, "k": 8, "lam": 1})
    assert (cfg.k, cfg.corpus.path, cfg.lam, cfg.seq_len) == (8, "c.jsonl", 1.0, 256)
    assert cfg.to_dict()["corpus"]["path"] == "c.jsonl" and isinstance(cfg.corpus, CorpusConfig)
    assert StrataConfig().validate().to_dict() == config_from_dict({}).to_dict()


@pytest.mark.parametrize("key, value, fix", [
    ("k", "32", "write an integer without quotes"),
    ("k", 3.5, "write an integer"),
    ("lam", "1", "write a number without quotes"),
    ("kmeans_spherical", "yes", "write true or false"),
    ("seq_len", 1, "use an integer >= 2"),
    ("lam", -1.0, "use a value >= 0"),
    ("embed_method", "bag_of_words", "use 'sentence', 'shallow' or 'deep'"),
    ("model_preset", "huge", "'tiny', 'small', 'base' or '100m'"),
    ("packing", "zigzag", "use one of ['concat'"),
    ("strategies", ["random", "sorted_by_vibes"], "unknown strategies ['sorted_by_vibes']"),
    ("strategies", [], "at least 1 item"),
    ("seeds", [0, 0], "distinct integers"),
    ("odm.smoothing", 1.0, "use a moving-average weight in [0, 1)"),  # the ODM sampler rejects 1: caught at load
    ("odm.smoothing", -0.5, "use a moving-average weight in [0, 1)"),
    ("odm.smoothing", float("inf"), "use a moving-average weight in [0, 1)"),
    ("odm.smoothing", float("nan"), "use a moving-average weight in [0, 1)"),
    ("odm.warmup_fraction", 1.0, "use a fraction of the steps in [0, 1)"),
    ("claims.seeds", [1, 1], "distinct integers"),
    ("export.formats", ["tfrecord"], "unknown export formats ['tfrecord']"),
    ("length_bin_weighting", "count", "use 'tokens' or 'documents'"),
])
def test_type_and_range_errors_name_key_value_and_fix(key, value, fix):
    group, _, name = key.rpartition(".")  # a group's key (odm.smoothing) is given in its group
    with pytest.raises(StrataInputError) as err:
        config_from_dict({group: {name: value}} if group else {key: value})
    assert f"config value {key}={value!r} is impossible" in str(err.value)
    assert fix in err.value.fix and err.value.fix.startswith(f"{key}: ")


def test_nested_and_unknown_keys():
    with pytest.raises(StrataInputError, match=r"corpus.on_error='never' is impossible"):
        config_from_dict({"corpus": {"on_error": "never"}})
    with pytest.raises(StrataInputError, match=r"unknown config key\(s\) \['corpus.pathh', 'seqlen'\]") as err:
        config_from_dict({"seqlen": 128, "corpus": {"pathh": "x"}})
    assert "did you mean 'seq_len'" in err.value.fix and "did you mean 'corpus.path'" in err.value.fix


def test_assignment_is_validated():
    cfg = StrataConfig()
    with pytest.raises(StrataInputError, match="k='3'"):
        cfg.k = "3"
    cfg.k = 3
    assert cfg.k == 3


def test_config_file_error_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text('k: "32"\n')
    with pytest.raises(StrataInputError, match=f"{path}: config value k='32' is impossible"):
        load_config(path)
    (tmp_path / "empty.yaml").write_text("")
    assert load_config(tmp_path / "empty.yaml").k == 32


def test_names_declared_for_the_config_match_the_stages():
    """Stages answer to the names pipeline/names.py declares (the config imports no stage)."""
    from pipeline.ordering import STRATEGIES
    from pipeline.ordering.characteristics import Family, family_matrix, preset
    from pipeline.ordering.documents import WITHIN_SORTS
    from pipeline.ordering.features import sequence_features
    from pipeline.packing.pack import PACKING_SPECS, parse_packing
    from pipeline.represent.embeddings import METHODS
    from pipeline.training.model import PRESETS

    assert set(STRATEGIES) == set(names.ORDERING_STRATEGIES), "names.py reads the strategies' registry"
    assert set(PRESETS) == set(names.MODEL_PRESETS), "declare new model presets in pipeline/names.py"
    assert METHODS == names.EMBED_METHODS and WITHIN_SORTS == names.WITHIN_SORTS
    assert all(preset(o, 1.0) for o in names.OBJECTIVES if o != "custom")  # every named objective is a preset
    from pipeline.ordering import families

    read = {n: np.array([0, 1, 1]) for n in families.names() if families.spec_of(n).column is not None}  # quality_bin's codes
    f = sequence_features(np.array([0, 0, 1]), np.array([0, 1, 1]), np.array([3, 4, 5]), np.array([1, 2, 3]), 2, seg_columns=read)
    assert len(families.names("tokens")) >= 3 and len(families.names("sequences")) >= 3
    for name in families.names():  # every registered family is built
        assert family_matrix(f, Family(name), 1.0).n_rows == 2
    assert all(parse_packing(spec) for spec in PACKING_SPECS)


def test_config_imports_no_stage():
    import subprocess
    import sys

    code = ("import sys, pipeline.config; "
            "print(sorted(m for m in sys.modules if m.startswith('pipeline.') and m.split('.')[1] not in "
            "('config', 'errors', 'names', 'registry', 'storage')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_data_root_precedence(tmp_path):
    """--data-root > data_root in the config file > STRATA_HOME > ./.strata."""
    with_root = tmp_path / "with_root.yaml"
    with_root.write_text(yaml.safe_dump({"data_root": str(tmp_path / "from_file")}))
    without = tmp_path / "without.yaml"
    without.write_text(yaml.safe_dump({"k": 4}))
    env = {"STRATA_HOME": str(tmp_path / "from_env")}
    assert resolve_config(with_root, tmp_path / "from_flag", env).root == tmp_path / "from_flag"
    assert resolve_config(with_root, None, env).root == tmp_path / "from_file"
    assert resolve_config(without, None, env).root == tmp_path / "from_env"
    assert resolve_config(None, None, env).root == tmp_path / "from_env"
    assert resolve_config(without, None, {}).root.name == ".strata"


def test_cli_exit_codes(tmp_path, capsys, monkeypatch):
    from assets.cli import EXIT_INPUT, EXIT_USAGE, main

    monkeypatch.setenv("STRATA_CONFIG", "")  # the CLI sets these; monkeypatch restores them
    monkeypatch.setenv("DAGSTER_HOME", "")

    bad = tmp_path / "bad.yaml"
    bad.write_text("k: 0\n")
    assert main(["run", "--config", str(bad)]) == EXIT_INPUT == 2
    err = capsys.readouterr().err
    assert "k=0 is impossible" in err and "Fix: k: use k >= 1 clusters" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exc:
        main(["run"])  # --config missing
    assert exc.value.code == EXIT_USAGE == 64
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == EXIT_USAGE


def test_select_uses_dagster_selection_syntax(tmp_path):
    from assets.definitions import build_definitions
    from assets.runner import selected_keys

    defs = build_definitions(None, str(tmp_path / "root"))
    assert selected_keys(defs, "*orderings") == {"raw_corpus", "corpus_shards", "corpus", "tokenizer", "token_shards", "tokens",
                                                 "embedding_shards", "embeddings", "centroids", "cluster_shards", "clusters",
                                                 "clean_shards", "clean", "quality_shards", "quality", "sequences", "orderings"}
    assert selected_keys(defs, "evaluations+") == {"evaluations", "ablation_report"}
    with pytest.raises(StrataInputError, match="selects no asset|cannot resolve"):
        selected_keys(defs, "no_such_asset")
    assert not (tmp_path / "root").exists()  # building definitions writes nothing


@pytest.mark.parametrize("old, new, both, old_key, new_key", [
    ({"max_repeats": 3}, {"max_sequence_copies": 3}, {"max_repeats": 3, "max_sequence_copies": 2},
     "max_repeats", "max_sequence_copies"),
    ({"mixture": {"max_repeat": 2.5}}, {"mixture": {"max_cluster_epochs": 2.5}},
     {"mixture": {"max_repeat": 2.5, "max_cluster_epochs": 2.0}},
     "mixture.max_repeat", "mixture.max_cluster_epochs"),
])
def test_renamed_keys_still_read_with_a_warning(tmp_path, old, new, both, old_key, new_key):
    """A key's former name gives the config its new key gives, with a warning naming the new key and
    the file; the former and the new name together are an input error."""
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(old))
    with pytest.warns(FutureWarning) as caught:
        cfg = load_config(path)
    assert cfg == config_from_dict(new) != StrataConfig()
    text = " ".join(str(w.message) for w in caught)
    assert str(path) in text and f"config key {old_key} is deprecated and read as {new_key}" in text
    with pytest.raises(StrataInputError, match=f"{old_key} .*and {new_key} are both given") as err:
        config_from_dict(both)
    assert f"keep only {new_key}" in err.value.fix


def test_library_defaults_are_the_configs():
    """OrderParams and the greedy's functions default to the config's values (one source of truth)."""
    import inspect

    from pipeline.config import config_default
    from pipeline.ordering.engine import OrderParams
    from pipeline.ordering.greedy import greedy_scaled_order

    params, cfg = OrderParams(), StrataConfig()
    assert params == OrderParams.from_config(cfg)
    sig = inspect.signature(greedy_scaled_order).parameters
    assert {k: sig[k].default for k in ("greedy_exact_max", "greedy_block", "batch_size", "greedy_repair")} == \
        {k: getattr(cfg, k) for k in ("greedy_exact_max", "greedy_block", "batch_size", "greedy_repair")}
    assert config_default("mixture.max_cluster_epochs") == cfg.mixture.max_cluster_epochs


def test_flat_keys_of_the_groups_read_into_them_with_a_warning(tmp_path):
    """Every former flat key of the claims:, odm: and export: groups (claims_k, odm_clock, export_dir, ...)
    loads into its group's key, from a file and as a StrataConfig keyword, with one warning per key naming
    the old and the new key (and the file); the values equal the nested spelling's."""
    from pipeline.config import MOVED_KEYS, ConfigKeyRenamed

    assert len(MOVED_KEYS) == 12 + 5 + 5 and MOVED_KEYS["claims_k"] == "claims.k" and MOVED_KEYS["export_formats"] == "export.formats"
    flat = {"claims_k": 7, "claims_seeds": [3, 4], "claims_full": True, "odm_clock": "step", "odm_smoothing": 0.25,
            "export_formats": ["numpy", "mds"], "export_dir": "out", "batch_size": 8, "odm_micro_batches": 4}
    nested = {"claims": {"k": 7, "seeds": [3, 4], "full": True}, "odm": {"clock": "step", "smoothing": 0.25, "micro_batches": 4},
              "export": {"formats": ["numpy", "mds"], "dir": "out"}, "batch_size": 8}
    path = tmp_path / "flat.yaml"
    path.write_text(yaml.safe_dump(flat))
    with pytest.warns(ConfigKeyRenamed) as caught:
        cfg = load_config(path)
    assert cfg == config_from_dict(nested) != StrataConfig()
    assert cfg.claims.k == 7 and cfg.odm.clock == "step" and cfg.export.formats == ["numpy", "mds"] and cfg.claims.full
    moved = [str(w.message) for w in caught if str(path) in str(w.message)]
    assert len(moved) == len(flat) - 1  # one each, naming the file (batch_size is no former key)
    for old in set(flat) - {"batch_size"}:
        assert sum(f"config key {old} is deprecated and read as {MOVED_KEYS[old]}" in m for m in moved) == 1, old
    with pytest.warns(ConfigKeyRenamed, match="config key claims_k is deprecated and read as claims.k"):
        assert StrataConfig(claims_k=9, claims={"shuffles": 5}).claims.model_dump(include={"k", "shuffles"}) == {"k": 9, "shuffles": 5}
    with pytest.warns(ConfigKeyRenamed):  # the same value both ways: read, with the warning
        assert config_from_dict({"claims_k": 5, "claims": {"k": 5}}).claims.k == 5
    assert cfg.subset(["claims_k", "claims.k"]) == {"claims_k": 7, "claims.k": 7}  # a recorded former key still reads


def test_a_flat_and_a_nested_key_with_different_values_is_an_error(tmp_path):
    """claims_k: 3 beside claims: {k: 5} in one file: a StrataInputError naming both keys and values (exit 2)."""
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump({"claims_k": 3, "claims": {"k": 5}}))
    with pytest.raises(StrataInputError, match=r"claims_k \(its former name\) and claims.k are both given, with different values "
                                               r"\(3 and 5\)") as err:
        load_config(path)
    assert "keep only claims.k (remove claims_k)" in err.value.fix and err.value.path == path
    with pytest.raises(StrataInputError, match="export_workers .* and export.workers"):
        config_from_dict({"export_workers": 2, "export": {"workers": 3}})


def test_odm_micro_batches_is_checked_against_the_batch_size():
    with pytest.raises(StrataInputError, match=r"config value odm.micro_batches=3 is impossible") as err:
        config_from_dict({"batch_size": 16, "odm": {"micro_batches": 3}})
    assert err.value.fix.startswith("odm.micro_batches: ODM draws one cluster per micro-batch, so G must divide batch_size=16")
    assert config_from_dict({"batch_size": 16, "odm": {"micro_batches": 4}}).odm.micro_batches == 4
