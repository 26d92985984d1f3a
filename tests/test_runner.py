"""`strata run`'s order comes from the Dagster asset graph (assets/runner.py:plan)."""

from __future__ import annotations

import dagster as dg
import pytest

from assets.definitions import build_definitions
from assets.runner import partition_keys, plan, selected_keys
from pipeline.config import resolve_config


@pytest.fixture(scope="module")
def graph_and_cfg(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    defs = build_definitions(None, str(root))
    return defs, resolve_config(None, str(root))


def _check_topological(defs: dg.Definitions, batches) -> None:
    graph = defs.resolve_asset_graph()
    seen: set[str] = set()
    for pdef, names in batches:
        for name in names:
            node = graph.get(dg.AssetKey(name))
            if node.is_materializable:
                assert node.partitions_def == pdef, (name, pdef)
            earlier = {p.to_user_string() for p in node.parent_keys} & {n for _, ns in batches for n in ns}
            assert earlier <= seen | set(names), (name, earlier - seen)
        seen |= set(names)
    assert len(seen) == sum(len(names) for _, names in batches), "an asset is planned twice"


def test_plan_follows_the_graph_and_the_config(graph_and_cfg):
    defs, cfg = graph_and_cfg
    graph = defs.resolve_asset_graph()
    batches = plan(defs, selected_keys(defs, None), cfg)
    _check_topological(defs, batches)
    planned = {n for _, names in batches for n in names}
    materializable = {k.to_user_string() for k in graph.materializable_asset_keys}
    optional = {n for n in materializable if graph.get(dg.AssetKey(n)).group_name in ("mixture", "quality")} | {"claim_runs"}
    assert planned == (materializable - optional) | {"raw_corpus"}
    assert [names for _, names in batches][:2] == [["corpus_shards", "clean_shards"], ["raw_corpus", "corpus", "tokenizer"]]
    assert batches[-1] == (None, ["diagnostics_report", "gradient_analyses", "claims", "ablation_report"])

    on = cfg.model_copy(update={"claims": cfg.claims.model_copy(update={"full": True}),
                                "mixture": cfg.mixture.model_copy(update={"enabled": True}),
                                "quality": cfg.quality.model_copy(update={"enabled": True})})
    batches = plan(defs, selected_keys(defs, None), on)
    _check_topological(defs, batches)
    assert {n for _, names in batches for n in names} == materializable | {"raw_corpus"}
    order = [n for _, names in batches for n in names]
    assert order.index("quality") < order.index("sequences"), "the packing applies the quality filter"
    learning = ["mixture_target", "mixture_iterations", "mixture_weights", "mixture_curriculum"]
    assert max(map(order.index, learning)) < order.index("orderings"), "greedy_mixture's ordering reads the learned weights"
    assert order[-2:] == ["mixture_runs", "mixture_ablation"], "the mixture stage's ablation runs after everything else"


def test_selection_opens_the_optional_assets_and_keeps_the_order(graph_and_cfg):
    defs, cfg = graph_and_cfg
    batches = plan(defs, selected_keys(defs, "*orderings"), cfg, selected=True)
    _check_topological(defs, batches)
    assert batches[-1][1] == ["orderings"] and "claim_runs" not in {n for _, ns in batches for n in ns}
    assert "claim_runs" in {n for _, ns in plan(defs, selected_keys(defs, "claim_runs"), cfg, selected=True) for n in ns}


def test_runs_nest_under_their_strategy(graph_and_cfg):
    defs, cfg = graph_and_cfg
    graph = defs.resolve_asset_graph()
    runs = graph.get(dg.AssetKey("training_runs")).partitions_def
    keys = partition_keys(runs, cfg, {"strategy": cfg.strategies[1]})
    assert [k.keys_by_dimension for k in keys] == [{"strategy": cfg.strategies[1], "seed": str(s)} for s in cfg.seeds]
    assert len(partition_keys(runs, cfg)) == len(cfg.strategies) * len(cfg.seeds)
