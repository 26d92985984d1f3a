"""Materialize the graph in-process (what ``strata demo`` and ``strata run`` do), in the order of the asset graph.

Runs are recorded in a persistent Dagster instance under ``<data root>/dagster`` (unless
``DAGSTER_HOME`` is set), so ``dagster dev`` with the same DAGSTER_HOME shows their history.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from pathlib import Path

import dagster as dg

from assets.common import config_partitions
from assets.partition_runs import materialize_run, run_partitions
from evals.suites import check_heldout
from pipeline.config import StrataConfig, resolve_config
from pipeline.config_source import optional_enabled, record_config, run_config
from pipeline.errors import StrataInputError
from pipeline.storage.layout import check_data_root
from pipeline.storage.lock import SETUP_LOCK, root_lock

Batch = tuple["dg.PartitionsDefinition | None", list[str]]  # a partitions definition (None: unpartitioned) and its assets
ORDER_TIERS = {"first": 0, "": 1, "last": 2}  # an asset's tag strata/order -> when plan() runs it among the ready ones


def plan(defs: dg.Definitions, chosen: set[str], cfg: StrataConfig, selected: bool = False) -> list[Batch]:
    """The chosen materializable assets in the asset graph's topological order, in batches: each batch
    the assets that become ready together and share a partitions definition (one run per partition).
    An asset tagged ``strata/order: first`` runs as soon as its inputs are there (the mixture stage's
    learning, which ``greedy_mixture``'s ordering reads), one tagged ``last`` after everything else
    (the mixture stage's ablation); an unpartitioned observable source that is chosen
    is observed in the first unpartitioned batch that reads it. Without ``selected``, the optional
    assets follow the config (:func:`optional_enabled`)."""
    graph = defs.resolve_asset_graph()
    rank = {k: i for i, k in enumerate(graph.toposorted_asset_keys)}
    wanted = {k for k in graph.materializable_asset_keys if k.to_user_string() in chosen
              and optional_enabled(k.to_user_string(), graph.get(k).group_name, cfg, selected)}
    sources = {k for k in graph.observable_asset_keys - graph.materializable_asset_keys
               if k.to_user_string() in chosen and graph.get(k).partitions_def is None}
    parents = {k: set(graph.get(k).parent_keys) & wanted for k in wanted}

    def order(k: dg.AssetKey) -> tuple[int, int]:
        return ORDER_TIERS[graph.get(k).tags.get("strata/order", "")], rank[k]

    done: set[dg.AssetKey] = set()
    batches: list[Batch] = []
    while wanted - done:
        first = min((k for k in wanted - done if parents[k] <= done), key=order)
        pdef, tier = graph.get(first).partitions_def, order(first)[0]
        batch: list[dg.AssetKey] = []
        while ready := [k for k in wanted - done - set(batch) if parents[k] <= done | set(batch)
                        and graph.get(k).partitions_def == pdef and order(k)[0] == tier]:
            batch += sorted(ready, key=order)
        if pdef is None:
            observed = sorted((s for s in sources if any(s in graph.get(k).parent_keys for k in batch)), key=rank.get)
            sources -= set(observed)
            batch = observed + batch
        done |= set(batch)
        batches.append((pdef, [k.to_user_string() for k in batch]))
    return batches


def _nests(inner, outer) -> bool:
    """Whether ``inner`` is a multi-partition definition with ``outer`` as one of its dimensions."""
    return outer is not None and isinstance(inner, dg.MultiPartitionsDefinition) and any(
        d.partitions_def == outer for d in inner.partitions_defs)


def partition_keys(pdef, cfg: StrataConfig, within: dict[str, str] | None = None) -> list:
    """The partition keys of ``pdef`` that the config names, in its order; for a multi-partition
    definition, those whose dimensions agree with ``within``."""
    if isinstance(pdef, dg.StaticPartitionsDefinition):
        return list(pdef.get_partition_keys())
    if isinstance(pdef, dg.MultiPartitionsDefinition):
        dims = {d.name: partition_keys(d.partitions_def, cfg) for d in pdef.partitions_defs}
        dims.update({name: [key] for name, key in (within or {}).items()})
        names = list(dims)
        return [dg.MultiPartitionKey(dict(zip(names, combo))) for combo in itertools.product(*dims.values())]
    return config_partitions(cfg)[pdef.name]


def prepare_environment(config_file: str | None, data_root: str | None) -> StrataConfig:
    """The run's configuration (:func:`pipeline.config_source.run_config`) and a persistent Dagster
    instance under the data root (unless ``DAGSTER_HOME`` is set)."""
    cfg = run_config(config_file, data_root)
    if not os.environ.get("DAGSTER_HOME"):
        home = cfg.root / "dagster"
        home.mkdir(parents=True, exist_ok=True)
        config = home / "dagster.yaml"
        if not config.exists():
            config.write_text("telemetry:\n  enabled: false\n")
        os.environ["DAGSTER_HOME"] = str(home)
    # a new home's SQLite schema, created by one process at a time (the lock lies in the home, not in a data root)
    with root_lock(os.environ["DAGSTER_HOME"], SETUP_LOCK, "a strata process setting up the Dagster instance"):
        dg.DagsterInstance.get().dispose()
    return cfg


def release_dead_claims(instance: dg.DagsterInstance) -> list[str]:
    """Free the training-pool slots held by runs of a ``strata`` process on this machine that is gone
    (killed mid-training): with a pool limit of 1 they would block every later run. Returns their run ids."""
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
            if run.status in (dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.NOT_STARTED):
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
    """Materialize the selected assets (all by default) in the order of the asset graph (:func:`plan`):
    unpartitioned batches once, corpus-shard batches for each partition that is missing or stale (new
    or edited shards; all of them after a new tokenizer or k-means model), strategy batches per
    strategy, each followed by its strategy x seed runs. Returns the path of ``report.md`` when
    ``ablation_report`` was among them. One process at a time materializes a data root
    (:func:`pipeline.storage.lock.root_lock`): a second waits, saying for whom."""
    if config_file is None:
        config_file = os.environ.get("STRATA_CONFIG") or None
    cfg = resolve_config(config_file, data_root)
    from assets.definitions import build_definitions

    defs = build_definitions(config_file, str(cfg.root))
    chosen = selected_keys(defs, select)
    check_heldout(cfg, chosen)  # heldout_fraction 0 with assets that need a held-out split: stop before any step
    check_data_root(cfg.root)  # a folder of the user's is refused before the lock file goes in
    with root_lock(cfg.root, what=f"strata run (started {time.strftime('%H:%M:%S')})"):
        return _materialize_all(cfg, defs, chosen, config_file, select, log, log_level, instance)


def _materialize_all(cfg: StrataConfig, defs: dg.Definitions, chosen: set[str], config_file: str | None, select: str | None,
                     log, log_level: str, instance: dg.DagsterInstance | None) -> Path | None:
    """:func:`materialize_all` of the ``chosen`` assets of ``defs`` once the data root's run lock is held."""
    from assets.common import sync_partitions

    # Dagster's records of this call's runs, traces included (hidden: not an artifact); workers inherit it
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    os.environ["STRATA_RUN_LOG"] = str(cfg.root / ".logs" / f"run-{stamp}-{os.getpid()}.log")
    record_config(cfg)
    instance = instance or dg.DagsterInstance.get()
    sync_partitions(instance, cfg, defs.resolve_asset_graph())
    for run_id in release_dead_claims(instance):
        log(f"freed the training-pool slot of run {run_id} (its strata process is gone)")
    tags = {"strata/pid": str(os.getpid()), "strata/host": socket.gethostname()}
    all_assets = list(defs.assets) + list(defs.asset_checks or [])
    resources = defs.resources

    warned: list[str] = []  # failed warning checks, printed at the end

    def run(group: list[str], partition: str | None = None) -> None:
        selection = [a for a in group if a in chosen]
        if selection:
            log(f"==> materializing {', '.join(selection)}" + (f" [{partition}]" if partition else ""))
            warned.extend(materialize_run(all_assets, resources, instance, selection, partition, log_level, tags))

    from assets.common import SHARD_PARTITIONS
    from assets.status import shards_to_run

    batches = plan(defs, chosen, cfg, selected=bool(select))
    while batches:
        pdef, names = batches.pop(0)
        inner = batches.pop(0) if batches and _nests(batches[0][0], pdef) else None
        if pdef is None:
            run(names)
        elif pdef == SHARD_PARTITIONS:
            selection = [a for a in names if a in chosen]
            if selection:
                run_partitions(all_assets, resources, instance, selection, shards_to_run(defs, instance, cfg, names), cfg,
                               config_file, log_level, tags, log)
        else:
            for key in partition_keys(pdef, cfg):
                run(names, key)
                for sub in partition_keys(inner[0], cfg, {pdef.name: key}) if inner else []:
                    run(inner[1], sub)
    for line in warned:
        log(f"warning: {line}")
    return cfg.root / "report.md" if "ablation_report" in chosen else None

