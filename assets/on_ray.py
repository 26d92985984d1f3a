"""``engine: ray`` for the ablation: one ``training_runs`` / ``evaluations`` partition as one Ray task.

The asset's step (launched by ``strata run`` or from the UI) submits a Ray task that asks for
``ray.train_gpus`` GPUs (when the cluster has any) and ``ray.train_cpus`` CPUs; the task
materializes that same partition on the worker, in a fresh process, and hands back its metadata
and data version. A backfill of all strategy x seed partitions therefore trains them in parallel,
as many at once as the cluster has GPUs. The data root (and the config file) must be on storage
every node sees (docs/distributed.md).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import dagster as dg

from assets.common import StrataSettings
from pipeline.errors import StrataInputError

_ON_WORKER = "STRATA_RAY_WORKER"
CODE_LOCATION = "assets.definitions"  # the module workspace.yaml loads; a worker loads it by name, as Dagster does


def materialize_partition(config_file: str, data_root: str, asset: str, partition: str) -> tuple[dict[str, Any], str | None]:
    """On a Ray worker: materialize ``asset[partition]`` here; return its metadata and data version."""
    os.environ[_ON_WORKER] = "1"
    if config_file:
        os.environ["STRATA_CONFIG"] = config_file
    from assets.common import sync_partitions
    from pipeline.config import resolve_config

    defs = importlib.import_module(CODE_LOCATION).build_definitions(config_file or None, data_root)
    instance = dg.DagsterInstance.ephemeral()
    sync_partitions(instance, resolve_config(config_file or None, data_root))  # strategies/seeds are dynamic partitions
    try:
        result = dg.materialize(list(defs.assets), selection=[asset], partition_key=partition, resources=defs.resources,
                                instance=instance)
    except dg.DagsterUserCodeExecutionError as exc:
        if isinstance(exc.user_exception, StrataInputError):
            raise exc.user_exception from None
        raise
    mat = result.asset_materializations_for_node(asset)[-1]
    return dict(mat.metadata), mat.tags.get("dagster/data_version")


def run_on_ray(context: dg.AssetExecutionContext, settings: StrataSettings) -> dg.MaterializeResult | None:
    """With ``engine: ray`` (and not already on a worker): this partition as a Ray task; else None."""
    cfg = settings.config()
    if cfg.engine != "ray" or os.environ.get(_ON_WORKER):
        return None
    from pipeline.distributed.ray_engine import run_remote

    asset = context.assets_def.key.to_user_string()
    config_file = str(os.path.abspath(settings.config_file)) if settings.config_file else ""
    context.log.info(f"{asset}[{context.partition_key}] runs as a Ray task ({cfg.ray.train_gpus} GPU when the cluster has GPUs)")
    metadata, version = run_remote(materialize_partition, (config_file, str(cfg.root), asset, str(context.partition_key)), cfg.ray,
                                   num_cpus=cfg.ray.train_cpus, num_gpus=cfg.ray.train_gpus, fresh_process=True)
    return dg.MaterializeResult(metadata={**metadata, "engine": "ray"}, data_version=dg.DataVersion(version) if version else None)
