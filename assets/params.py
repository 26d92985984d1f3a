"""Which configuration parameters each asset depends on: its code version and its launchpad face.

``PARAMS`` is derived, not kept by hand: an asset's parameters are the ``keys()`` of the params
model of the stage it calls (:class:`pipeline.stage.StageParams`, ``STAGE_PARAMS``) plus the keys
its registry's entries read (ordering strategies, export formats, eval suites: ``REGISTRY_READS``).
From it come
- each asset's code version: its code version plus a hash of these parameters and those of its
  upstream assets, as the definitions' config sets them (:func:`with_config_versions`), so changing
  ``k`` marks ``clusters`` and everything downstream of it stale, and nothing upstream;
- each asset's ``dg.Config`` class (launchpad): its own keys (those no other asset reads) with the
  types of :class:`pipeline.config.StrataConfig`, all optional (empty = the config file's value);
  a group's key (``claims.shuffles``) is the field ``claims_shuffles`` there;
- the runtime check that the config the asset runs with is the one its version was built from.
"""

from __future__ import annotations

import json
import typing
from typing import Any, Optional

import dagster as dg
from pydantic import create_model

from evals import suites
from evals.stage import EvaluateParams
from pipeline.claims.stage import ClaimsParams
from pipeline.clean.stage import CleanParams
from pipeline.config import StrataConfig, is_config_key
from pipeline.data.stage import CorpusParams, CorpusShardParams, TokenizerParams, TokenShardParams
from pipeline.errors import StrataInputError
from pipeline.export import formats
from pipeline.export.stage import ExportParams
from pipeline.ordering import strategies
from pipeline.ordering.stage import OrderStageParams
from pipeline.overrides import is_section, key_annotation, launchpad_field, launchpad_type, params_hash, with_overrides
from pipeline.packing.stage import PackParams
from pipeline.quality.stage import QualityParams
from pipeline.reports.stage import AblationReportParams, DiagnoseParams, DiagnosticsReportParams
from pipeline.represent.stage import CentroidParams, EmbedParams
from pipeline.stage import StageParams
from pipeline.training.stage import ClaimRunsParams, GradientParams, TrainRunParams

RAW_CORPUS = dg.AssetKey("raw_corpus")
RAW_SHARDS = dg.AssetKey("raw_shards")
# Partitioned by corpus shard: each follows its own shard (corpus_shards[p] <- raw_shards[p]), not the whole corpus.
SHARD_ASSETS = ("corpus_shards", "token_shards", "embedding_shards", "cluster_shards", "clean_shards", "quality_shards")
# asset -> the params model of the stage it calls (None: the asset has no parameters of its own, only its upstream
# assets'). A params model's keys() leave out speed knobs (embed_batch_size), checkpoint_every (a resumed run's
# outputs are byte-identical) and keys an upstream asset's parameters cover (versioned=False, pipeline/stage.py).
# The mixture assets are not listed: their code versions do not cover parameters (pipeline.mixture.stage.MixtureParams).
STAGE_PARAMS: dict[str, type[StageParams] | None] = {
    "corpus_shards": CorpusShardParams,  # reading options and content: raw_shards' data version
    "corpus": CorpusParams,
    "tokenizer": TokenizerParams,
    "token_shards": TokenShardParams,
    "tokens": TokenShardParams,
    "embedding_shards": EmbedParams,
    "embeddings": None,
    "centroids": CentroidParams,
    "cluster_shards": None,
    "clusters": None,
    # clean_shards' files are named by the keys their bytes depend on: a change of another (dedup.action)
    # reruns its partitions without reading a text
    "clean_shards": CleanParams,
    "clean": CleanParams,
    "quality_shards": QualityParams,  # the score files are named by the scorer's fingerprint
    "quality": QualityParams,
    "sequences": PackParams,
    "orderings": OrderStageParams,
    "exports": ExportParams,
    "ordering_diagnostics": DiagnoseParams,  # prefix = max_steps x batch_size
    "diagnostics_report": DiagnosticsReportParams,
    "training_runs": TrainRunParams,
    "gradient_analyses": GradientParams,
    "evaluations": EvaluateParams,
    "ablation_report": AblationReportParams,
    "claims": ClaimsParams,
    "claim_runs": ClaimRunsParams,
}
# asset -> the keys its registry's entries read (each entry's ``reads``)
REGISTRY_READS: dict[str, tuple[str, ...]] = {
    "orderings": strategies.reads("sequence", "document"),
    "exports": formats.reads(),
    "training_runs": strategies.reads("training"),
    "evaluations": suites.reads(),
}


def asset_params(asset: str) -> tuple[str, ...]:
    """The config keys ``asset``'s output depends on beyond its upstream assets' data: its stage
    params' ``keys()`` and its registry's ``reads``."""
    model = STAGE_PARAMS[asset]
    return tuple(dict.fromkeys((*(model.keys() if model is not None else ()), *REGISTRY_READS.get(asset, ()))))


# asset -> the StrataConfig keys its output depends on (beyond its upstream assets' data)
PARAMS: dict[str, tuple[str, ...]] = {asset: asset_params(asset) for asset in STAGE_PARAMS}
# asset -> assets whose parameters it reads too, without reading their data: claim_runs trains with
# training_runs' settings. Its code version covers them; they stay in training_runs' launchpad.
READS_PARAMS_OF: dict[str, tuple[str, ...]] = {"claim_runs": ("training_runs",)}


def version_keys(assets: list) -> dict[str, tuple[str, ...]]:
    """Each asset's parameters plus those of every asset upstream of it: what its output depends on."""
    parents: dict[str, list[str]] = {}
    for a in assets:
        if isinstance(a, dg.AssetsDefinition):
            for spec in a.specs:
                parents[spec.key.to_user_string()] = [d.asset_key.to_user_string() for d in spec.deps]
    out: dict[str, tuple[str, ...]] = {}

    def closure(name: str) -> tuple[str, ...]:
        if name not in out:
            keys = set(PARAMS.get(name, ()))
            for other in READS_PARAMS_OF.get(name, ()):
                keys |= set(PARAMS[other])
            for parent in parents.get(name, []):
                keys |= set(closure(parent))
            out[name] = tuple(sorted(keys))
        return out[name]

    for name in parents:
        closure(name)
    return out


def _propagates(parent, child) -> bool:
    """Whether a change of ``parent`` reaches each partition of ``child`` through Dagster's own
    staleness: ``parent`` unpartitioned, partitioned like ``child``, or one dimension of it. A
    partitioned parent of an unpartitioned child does not count: Dagster skips such dependencies
    beyond 100 partitions (SKIP_PARTITION_DATA_VERSION_DEPENDENCY_THRESHOLD)."""
    p, c = parent.partitions_def, child.partitions_def
    if p is None or p == c:
        return True
    return isinstance(c, dg.MultiPartitionsDefinition) and any(d.partitions_def == p for d in c.partitions_defs)


def source_deps(assets: list) -> dict[str, dg.AssetKey]:
    """The assets of ``PARAMS`` that get a direct dependency on the corpus source (``raw_corpus``, or
    for a per-shard asset its shard's ``raw_shards``): those that reach no source through a parent
    whose changes propagate (:func:`_propagates`). Every other asset is downstream of one of them,
    so the graph shows the pipeline's chain, not an edge from the source to every asset."""
    specs = {spec.key: spec for a in assets if isinstance(a, dg.AssetsDefinition) for spec in a.specs}
    sources = {RAW_CORPUS, RAW_SHARDS}
    out: dict[str, dg.AssetKey] = {}
    seen: dict[dg.AssetKey, bool] = {}

    def carries(key: dg.AssetKey) -> bool:  # reaches a source through propagating edges
        if key in sources:
            return True
        if key not in seen:
            seen[key] = False  # no cycles in an asset graph; guards the recursion all the same
            spec = specs.get(key)
            name = key.to_user_string()
            direct = spec is not None and any(
                d.asset_key in sources or (d.asset_key in specs and _propagates(specs[d.asset_key], spec) and carries(d.asset_key))
                for d in spec.deps)
            if spec is not None and name in PARAMS and not direct:
                out[name] = RAW_SHARDS if name in SHARD_ASSETS else RAW_CORPUS
                direct = True
            seen[key] = direct
        return seen[key]

    for key in specs:
        carries(key)
    return out


def catalog_description(text: str | None) -> str | None:
    """A docstring as the Dagster catalog shows it (markdown): reStructuredText's ````code```` becomes ```code```."""
    return text.replace("``", "`") if text else text


def with_config_versions(assets: list, cfg: StrataConfig) -> list:
    """The assets with code versions that cover their parameters and their upstream assets'
    parameters under ``cfg`` (so a change marks the whole affected subgraph stale, as Dagster
    compares code versions asset by asset), listed in the metadata ``parameters``; with a direct
    dependency on ``raw_corpus`` (or for a per-shard asset its own shard's ``raw_shards`` partition)
    where no parent leads to it (:func:`source_deps`: a corpus edit reaches every asset downstream;
    Dagster marks the direct dependents "Unsynced", ``strata status`` and the ``up_to_date`` checks
    the rest, :mod:`assets.status`); and with descriptions in markdown (:func:`catalog_description`)."""
    keys = version_keys(assets)
    sources = source_deps(assets)

    def version(spec: dg.AssetSpec) -> dg.AssetSpec:
        name = spec.key.to_user_string()
        if name not in PARAMS:
            return spec.replace_attributes(description=catalog_description(spec.description))
        code = (spec.code_version or "0").split("+")[0]
        deps = list(spec.deps)
        if name in sources and sources[name] not in {d.asset_key for d in deps}:
            deps.append(dg.AssetDep(sources[name]))
        return spec.replace_attributes(
            code_version=f"{code}+{params_hash(keys[name], cfg)}" if keys[name] else code,
            metadata={**spec.metadata, "parameters": ", ".join(keys[name]) or "none"},
            deps=deps,
            description=catalog_description(spec.description),
        )

    return [a.map_asset_specs(version) if isinstance(a, dg.AssetsDefinition) and a.is_materializable else a for a in assets]


# Keys several assets read (and the nested sections, e.g. the corpus, which raw_corpus observes) are set in the config
# file only: overriding e.g. seq_len for one asset would disagree with the others.
SHARED = {key for key in {k for keys in PARAMS.values() for k in keys}
          if is_section(key) or sum(key in keys for keys in PARAMS.values()) > 1}


def _config_class(asset: str) -> type[dg.Config]:
    fields: dict[str, Any] = {}
    for key in PARAMS[asset]:
        if key in SHARED:
            continue
        fields[launchpad_field(key)] = (Optional[launchpad_type(key_annotation(key))], None)
    name = "".join(p.capitalize() for p in asset.split("_")) + "Params"
    doc = f"Parameters of `{asset}` for this run; empty = the config file's value (README 'Configuration')."
    return typing.cast(type[dg.Config], create_model(name, __base__=dg.Config, __doc__=doc, **fields))


PARAM_CLASSES: dict[str, type[dg.Config]] = {asset: _config_class(asset) for asset in PARAMS}


def asset_config(context: dg.AssetExecutionContext, settings, params: dg.Config | None = None) -> StrataConfig:
    """The configuration an asset runs with: the config file's, with this run's launchpad overrides
    (recorded in the materialization's metadata as ``launchpad_overrides``).

    Fails when the config file no longer gives the asset's code version (it was edited after the
    definitions were loaded): the version would not describe the parameters used.
    """
    cfg = settings.config()
    name = context.asset_key.to_user_string()
    expected = context.assets_def.code_versions_by_key.get(context.asset_key) or ""
    covered = str(context.assets_def.specs_by_key[context.asset_key].metadata.get("parameters", ""))
    keys = [k for k in covered.split(", ") if is_config_key(k)]
    launched_from = json.loads(settings.loaded_versions).get(name) if getattr(settings, "loaded_versions", "") else None
    if (keys and expected.partition("+")[2] != params_hash(keys, cfg)) or (launched_from is not None and launched_from != expected):
        # the second: this run's process built its versions from the file as it is now, but the UI
        # that launched it had loaded an older file (assets/loaded.py)
        raise StrataInputError(
            f"the configuration of `{name}` changed since the Dagster definitions were loaded",
            fix="reload the definitions (Dagster UI: Deployment > Reload; `strata run` and `strata status` reload by themselves)",
        )
    cfg, overrides = with_overrides(cfg, PARAMS.get(name, ()), params.model_dump() if params is not None else {})
    if overrides:
        context.log.warning(f"launchpad overrides for this run: {overrides} (the code version describes the config file)")
        context.add_asset_metadata({"launchpad_overrides": dg.MetadataValue.json(overrides)})
    context.add_asset_metadata({"parameter_values": dg.MetadataValue.json(cfg.subset(keys))})  # what status diffs
    return cfg


__all__ = ["PARAMS", "PARAM_CLASSES", "asset_config", "version_keys", "with_config_versions"]
