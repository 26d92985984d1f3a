"""What the Dagster UI shows from the definitions alone: the lineage is the pipeline's chain, the
catalog's descriptions are markdown, the stationarity check is per strategy, every asset of the graph
has its ``up_to_date`` check (the staleness itself: tests/test_staleness.py; in a browser:
tests/test_ui_browser.py)."""

from __future__ import annotations

import dagster as dg
import pytest

from assets.params import PARAMS, RAW_CORPUS, RAW_SHARDS


@pytest.fixture(scope="module")
def graph():
    from assets.definitions import build_definitions

    return build_definitions(None, None, sync_checks=True).resolve_asset_graph()


def test_only_the_chain_s_first_assets_depend_on_the_corpus_source(graph):
    """The source's direct dependents are the chain's first assets, and ``gradient_analyses``, which gathers the
    training runs (a partitioned parent of an unpartitioned asset does not pass Dagster's staleness beyond 100
    partitions); every other asset reaches the source through its parents."""
    children = {src: {k.to_user_string() for k in graph.get(src).child_keys} for src in (RAW_CORPUS, RAW_SHARDS)}
    assert children[RAW_CORPUS] == {"corpus", "gradient_analyses"} and children[RAW_SHARDS] == {"corpus_shards"}
    parents = {k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys} for k in graph.materializable_asset_keys}
    assert parents["tokenizer"] == {"corpus"} and parents["centroids"] == {"embeddings"} and parents["orderings"] == {"sequences"}
    assert parents["evaluations"] == {"training_runs"}


def test_every_asset_reaches_the_corpus(graph):
    def ancestors(key: dg.AssetKey) -> set[dg.AssetKey]:
        out, todo = set(), [key]
        while todo:
            for p in graph.get(todo.pop()).parent_keys:
                if p not in out:
                    out.add(p)
                    todo.append(p)
        return out

    for name in PARAMS:
        assert {RAW_CORPUS, RAW_SHARDS} & ancestors(dg.AssetKey(name)), name


def test_descriptions_are_markdown(graph):
    """Docstrings' reStructuredText ``code`` shows as `code`, not as doubled backticks."""
    descriptions = {k.to_user_string(): graph.get(k).description or "" for k in graph.materializable_asset_keys}
    assert not [n for n, d in descriptions.items() if "``" in d]
    assert "`vocab_size`" in descriptions["tokenizer"]


def test_checks_the_ui_shows(graph):
    from assets.common import STRATEGY_PARTITIONS
    from assets.diagnostics import STATIONARITY_CHECK
    from assets.sync import CHECK

    assert STATIONARITY_CHECK.partitions_def == STRATEGY_PARTITIONS == graph.get(dg.AssetKey("ordering_diagnostics")).partitions_def
    assert {k.asset_key.to_user_string() for k in graph.asset_check_keys if k.name == CHECK} == set(PARAMS)


def test_headless_definitions_leave_the_up_to_date_checks_out():
    from assets.definitions import build_definitions
    from assets.sync import CHECK

    checks = build_definitions(None, None).resolve_asset_graph().asset_check_keys
    assert checks and not [k for k in checks if k.name == CHECK]


def test_the_readme_s_launchpad_example_names_real_fields():
    """README's *Launchpad* bullet: each `XParams`: `key`, … it names is an asset's config class with those fields."""
    import re
    from pathlib import Path

    from assets.params import PARAM_CLASSES

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    bullet = readme[readme.index("- **Launchpad.**"):].split("\n- ")[0]
    named = re.findall(r"`(\w+Params)`: ((?:`\w+`, )*`\w+`)", bullet)
    assert len(named) == 3, bullet
    classes = {cls.__name__: cls for cls in PARAM_CLASSES.values()}
    for name, fields in named:
        assert name in classes, name
        assert set(re.findall(r"`(\w+)`", fields)) <= set(classes[name].model_fields), (name, fields)
