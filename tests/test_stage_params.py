"""Stage params models (pipeline/stage.py): each stage's settings from a config in one place, the
assets' parameters derived from them, and StageResult built with keywords."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from pipeline.config import StrataConfig, config_from_dict, is_config_key
from pipeline.stage import StageParams, StageResult, setting

ROOT = Path(__file__).resolve().parents[1]


def test_stage_result_refuses_positional_arguments():
    with pytest.raises(TypeError):
        StageResult([Path("a")], {"rows": 1}, {"k": 1})  # type: ignore[misc]
    result = StageResult(outputs=[Path("a")], rows={"rows": 1}, parameters={"k": 1})
    assert result.facts == {} and result.checks == [] and result.deps == {} and result.digests == {}


def test_no_stage_result_is_built_by_position():
    """Every StageResult(...) in the library names its arguments."""
    positional = []
    for path in (ROOT / "pipeline").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "StageResult" and node.args:
                positional.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert positional == []


def test_params_read_their_keys_from_the_config():
    """from_config reads each field from the key it names (a group's dotted key, a nested settings
    object's own keys); keys() leaves out the versioned=False ones."""
    from pipeline.ordering.engine import OrderParams

    @dataclasses.dataclass(frozen=True)
    class Toy(StageParams):
        k: int = setting()
        claims_k: int = setting("claims.k")
        batch: int = setting("batch_size", versioned=False)
        order: OrderParams = setting(versioned=False, convert=OrderParams)
        seeds: tuple = setting(convert=tuple)

    cfg = config_from_dict({"k": 3, "claims": {"k": 9}, "batch_size": 4, "lam": 0.5, "seeds": [1, 2]})
    toy = Toy.from_config(cfg)
    assert (toy.k, toy.claims_k, toy.batch, toy.order.lam, toy.seeds) == (3, 9, 4, 0.5, (1, 2))
    assert Toy.keys() == ("k", "claims.k", "seeds")
    assert Toy.reads()[:3] == ("k", "claims.k", "batch_size") and set(OrderParams.reads()) <= set(Toy.reads())
    with pytest.raises(dataclasses.FrozenInstanceError):
        toy.k = 4  # type: ignore[misc]


def test_every_stage_params_model_reads_config_keys_only():
    from assets.params import STAGE_PARAMS

    cfg = StrataConfig()
    for asset, model in STAGE_PARAMS.items():
        if model is None:
            continue
        assert all(is_config_key(k) for k in model.reads()), asset
        assert set(model.keys()) <= set(model.reads()), asset
        model.from_config(cfg)  # every key it names is there


def test_params_table_is_derived_from_the_stage_params():
    """PARAMS is each asset's stage params' keys() plus its registry's reads; a key added to a
    params model appears in its asset's parameters (and code version), and in no other asset's."""
    import assets.params as P
    from pipeline.packing.stage import PackParams

    for asset, model in P.STAGE_PARAMS.items():
        own = model.keys() if model is not None else ()
        assert set(P.PARAMS[asset]) == set(own) | set(P.REGISTRY_READS.get(asset, ())), asset
    assert "claims.k" in P.PARAMS["claims"] and "odm.clock" in P.PARAMS["training_runs"]
    assert "export.world_size" in P.PARAMS["exports"]  # mds's reads
    assert "tokenizer_sample_chars" in P.PARAMS["tokenizer"]  # another sample trains another tokenizer

    @dataclasses.dataclass(frozen=True)
    class MorePack(PackParams):
        lam: float = setting()

    before = P.asset_params("sequences")
    assert "lam" not in before
    P.STAGE_PARAMS["sequences"] = MorePack
    try:
        assert P.asset_params("sequences") == (*before, "lam")
        assert "lam" not in P.asset_params("corpus")
    finally:
        P.STAGE_PARAMS["sequences"] = PackParams


def test_moved_keys_hash_as_their_former_names():
    """A group's key that was a flat key is hashed under its former name: the move changed no code version."""
    from pipeline.overrides import params_hash

    cfg = config_from_dict({"claims": {"k": 5, "shuffles": 7}, "export": {"formats": ["numpy", "mds"]}})
    assert params_hash(["claims.k", "claims.shuffles", "export.formats", "seed"], cfg) == \
        params_hash(["claims_k", "claims_shuffles", "export_formats", "seed"], cfg)
    assert params_hash(["claims.k"], cfg) != params_hash(["claims.k"], StrataConfig())


def test_stage_functions_take_params_not_the_config():
    """No function of a pipeline/<stage>/stage.py takes a parameter named cfg (the whole config)."""
    found = []
    for path in (ROOT / "pipeline").glob("*/stage.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name != "from_config":
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                found += [f"{path.relative_to(ROOT)}:{node.name}" for a in args if a.arg == "cfg"]
    assert found == []


def test_launchpad_fields_of_group_keys_set_the_group():
    """The claims asset's launchpad field claims_shuffles overrides claims.shuffles; an unchanged or
    empty field is no override."""
    from assets.params import PARAM_CLASSES, PARAMS
    from pipeline.overrides import with_overrides

    assert "claims_shuffles" in PARAM_CLASSES["claims"].model_fields
    cfg = StrataConfig()
    with_launchpad = lambda cfg, asset, given: with_overrides(cfg, PARAMS[asset], given)  # noqa: E731
    got, overrides = with_launchpad(cfg, "claims", {"claims_shuffles": 9})
    assert overrides == {"claims.shuffles": 9} and got.claims.shuffles == 9 and got.claims.k == cfg.claims.k
    assert with_launchpad(cfg, "claims", {"claims_shuffles": None}) == (cfg, {})
    assert with_launchpad(cfg, "claims", {"claims_shuffles": cfg.claims.shuffles})[1] == {}
