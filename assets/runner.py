"""Materialize the graph in-process (what ``strata demo`` and ``strata run`` do).

Runs are recorded in a persistent Dagster instance under ``<data root>/dagster`` (unless
``DAGSTER_HOME`` is set), so ``dagster dev`` with the same DAGSTER_HOME shows their history.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import dagster as dg

from pipeline.config import StrataConfig, resolve_config
from pipeline.errors import StrataInputError

# The graph before the strategies, in order: unpartitioned groups, and per-shard groups (tuples)
# run once per corpus shard partition that is missing or stale.
BEFORE_STRATEGIES: list[list[str] | tuple[str, ...]] = [
    ("corpus_shards",), ["raw_corpus", "corpus", "tokenizer"], ("token_shards", "embedding_shards"),
    ["tokens", "embeddings", "centroids"], ("cluster_shards",), ["clusters", "sequences"],
]
UPSTREAM = [a for group in BEFORE_STRATEGIES if isinstance(group, list) for a in group]
PER_STRATEGY = ["orderings", "exports", "ordering_diagnostics"]
PER_RUN = ["training_runs", "evaluations"]
GATHER = ["diagnostics_report", "gradient_analyses", "claims", "ablation_report"]
CLAIM_RUNS = ["claim_runs"]  # the claims' own training runs: with claims_full, or when selected (strata claims --full)


def prepare_environment(config_file: str | None, data_root: str | None) -> StrataConfig:
    """Resolve the configuration (see :func:`resolve_config`), point ``STRATA_CONFIG`` at it and set up
    a persistent Dagster instance under the data root."""
    if config_file:
        config_file = str(Path(config_file).resolve())
        os.environ["STRATA_CONFIG"] = config_file
    cfg = resolve_config(config_file, data_root)
    if not os.environ.get("DAGSTER_HOME"):
        home = cfg.root / "dagster"
        home.mkdir(parents=True, exist_ok=True)
        config = home / "dagster.yaml"
        if not config.exists():
            config.write_text("telemetry:\n  enabled: false\n")
        os.environ["DAGSTER_HOME"] = str(home)
    return cfg


def release_dead_claims(instance: dg.DagsterInstance) -> list[str]:
    """Free the training-pool slots held by runs of a ``strata`` process on this machine that is gone
    (killed mid-training): with a pool limit of 1 they would block every later run. Returns their run ids."""
    import socket

    from dagster._core.storage.dagster_run import DagsterRunStatus

    from assets.common import TRAIN_POOL

    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return []
    freed = []
    for run_id in storage.get_concurrency_info(TRAIN_POOL).active_run_ids:
        run = instance.get_run_by_id(run_id)
        if run is None or run.tags.get("strata/host") != socket.gethostname():
            continue
        pid = int(run.tags.get("strata/pid", "0"))
        try:
            alive = pid > 0 and (os.kill(pid, 0) is None)
        except ProcessLookupError:
            alive = False
        except PermissionError:
            alive = True
        if not alive:
            storage.free_concurrency_slots_for_run(run_id)
            if run.status in (DagsterRunStatus.STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.NOT_STARTED):
                instance.report_run_failed(run)
            freed.append(run_id)
    return freed


def selected_keys(defs: dg.Definitions, select: str | None) -> set[str]:
    """Asset names chosen by a Dagster asset-selection string (e.g. ``'*orderings'``); all when None."""
    graph = defs.resolve_asset_graph()
    every = {k.to_user_string() for k in graph.get_all_asset_keys()}
    if not select:
        return every
    try:
        chosen = dg.AssetSelection.from_string(select).resolve(graph)
    except Exception as exc:  # dagster raises several types for a bad selection string
        raise StrataInputError(f"cannot resolve --select {select!r} ({exc})".rstrip(),
                               fix=f"use Dagster's asset selection syntax over {sorted(every)}, e.g. '*orderings'") from None
    if not chosen:
        raise StrataInputError(f"--select {select!r} selects no asset", fix=f"name assets among {sorted(every)}, e.g. '*orderings'")
    names = {k.to_user_string() for k in chosen}
    if "corpus" in names:
        names.add("raw_corpus")  # observed with it, so the corpus's data version is current
    return names


def materialize_all(config_file: str | None = None, data_root: str | None = None, select: str | None = None,
                    log=print, log_level: str = "INFO", instance: dg.DagsterInstance | None = None) -> Path | None:
    """Materialize the selected assets (all by default): the whole-corpus assets, each corpus-shard
    partition that is missing or stale (new or edited shards; all of them after a new tokenizer or
    k-means model) between them, each strategy partition,
    each strategy x seed partition, then the gathering assets. Returns the path of ``report.md`` when
    ``ablation_report`` was among them."""
    from assets.common import sync_partitions
    from assets.definitions import build_definitions

    if config_file is None:
        config_file = os.environ.get("STRATA_CONFIG") or None
    cfg = resolve_config(config_file, data_root)
    defs = build_definitions(config_file, str(cfg.root))
    chosen = selected_keys(defs, select)
    instance = instance or dg.DagsterInstance.get()
    sync_partitions(instance, cfg)
    for run_id in release_dead_claims(instance):
        log(f"freed the training-pool slot of run {run_id} (its strata process is gone)")
    tags = {"strata/pid": str(os.getpid()), "strata/host": socket.gethostname()}
    all_assets = list(defs.assets) + list(defs.asset_checks or [])
    resources = defs.resources

    def run(group: list[str], partition: str | None = None) -> None:
        selection = [a for a in group if a in chosen]
        if not selection:
            return
        label = f"{', '.join(selection)}" + (f" [{partition}]" if partition else "")
        log(f"==> materializing {label}")
        try:
            result = dg.materialize(
                all_assets, selection=selection, partition_key=partition, instance=instance, resources=resources,
                raise_on_error=True, run_config={"loggers": {"console": {"config": {"log_level": log_level}}}}, tags=tags,
            )
        except dg.DagsterUserCodeExecutionError as exc:
            if isinstance(exc.user_exception, StrataInputError):
                raise exc.user_exception from None
            raise
        if not result.success:
            raise RuntimeError(f"materialization failed: {label}")

    from assets.status import shards_to_run

    for group in BEFORE_STRATEGIES:
        if isinstance(group, list):
            run(group)
            continue
        selection = [a for a in group if a in chosen]
        for key in shards_to_run(defs, instance, cfg, selection) if selection else []:
            run(selection, key)
    mixture = cfg.mixture.enabled or select
    if mixture:  # the learned mixture and curriculum first: orderings of greedy_mixture / greedy_curriculum may read them
        learn_mixture(run, cfg)
    for s in cfg.strategies:
        run(PER_STRATEGY, s)
        for seed in cfg.seeds:
            run(PER_RUN, dg.MultiPartitionKey({"strategy": s, "seed": str(seed)}))
    if cfg.claims_full or select:
        run(CLAIM_RUNS)
    run(GATHER)
    if mixture:
        materialize_mixture(run)
    return cfg.root / "report.md" if "ablation_report" in chosen else None


def learn_mixture(run, cfg: StrataConfig) -> None:
    """The TerRIFIC mixture stage's learning (when ``mixture.enabled``, or as selected): target,
    iterations in order, weights + curriculum."""
    run(["mixture_target"])
    for i in range(cfg.mixture.iterations):
        run(["mixture_iterations"], str(i))
    run(["mixture_weights", "mixture_curriculum"])


def materialize_mixture(run) -> None:
    """The TerRIFIC mixture stage's ablation: runs per strategy on the learned mixture, then the
    comparison (after ``training_runs``, whose random and greedy models it scores too)."""
    from assets.mixture import MIXTURE_STRATEGIES

    for s in MIXTURE_STRATEGIES:
        run(["mixture_runs"], s)
    run(["mixture_ablation"])
