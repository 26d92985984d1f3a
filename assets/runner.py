"""Materialize the whole graph in-process (what ``strata demo`` and ``strata run`` do).

Runs are recorded in a persistent Dagster instance under ``<data root>/dagster`` (unless
``DAGSTER_HOME`` is set), so ``dagster dev`` with the same DAGSTER_HOME shows their history.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from pipeline.errors import StrataInputError

UPSTREAM = ["raw_corpus", "corpus", "tokenizer", "tokens", "embeddings", "clusters", "sequences"]
PER_STRATEGY = ["orderings", "ordering_diagnostics"]
PER_RUN = ["training_runs", "evaluations"]


def prepare_environment(config_file: str | None, data_root: str | None) -> None:
    """Point the definitions at a config and data root; set up a persistent Dagster instance."""
    if config_file:
        os.environ["STRATA_CONFIG"] = str(Path(config_file).resolve())
    if data_root:
        os.environ["STRATA_HOME"] = str(Path(data_root).resolve())
    from assets.common import env_config

    root = env_config().root
    if not os.environ.get("DAGSTER_HOME"):
        home = root / "dagster"
        home.mkdir(parents=True, exist_ok=True)
        config = home / "dagster.yaml"
        if not config.exists():
            config.write_text("telemetry:\n  enabled: false\n")
        os.environ["DAGSTER_HOME"] = str(home)


def materialize_all(strategies: list[str] | None = None, log=print, log_level: str = "INFO") -> Path:
    """Materialize upstream assets, then each strategy partition, then the report."""
    from assets.common import env_config
    from assets.definitions import defs

    instance = dg.DagsterInstance.get()
    graph = defs.resolve_asset_graph()
    all_assets = list(defs.assets) + list(defs.asset_checks or [])
    resources = defs.resources

    def run(selection: list[str], partition: str | None = None) -> None:
        label = f"{', '.join(selection)}" + (f" [{partition}]" if partition else "")
        log(f"==> materializing {label}")
        try:
            result = dg.materialize(
                all_assets, selection=selection, partition_key=partition, instance=instance, resources=resources,
                raise_on_error=True, run_config={"loggers": {"console": {"config": {"log_level": log_level}}}},
            )
        except dg.DagsterUserCodeExecutionError as exc:
            if isinstance(exc.user_exception, StrataInputError):
                raise exc.user_exception from None
            raise
        if not result.success:
            raise RuntimeError(f"materialization failed: {label}")

    run(UPSTREAM)
    keys = graph.get(dg.AssetKey("orderings")).partitions_def.get_partition_keys()
    seeds = env_config().seeds
    for s in strategies or keys:
        run(PER_STRATEGY, s)
        for seed in seeds:
            run(PER_RUN, dg.MultiPartitionKey({"strategy": s, "seed": str(seed)}))
    run(["diagnostics_report", "gradient_analyses", "ablation_report"])
    return env_config().root / "report.md"
