"""Partitions of one per-shard batch run side by side, each in a Dagster run of its own.

``strata run`` materializes a per-shard stage one Dagster run per corpus shard: each shard keeps
its own data version, lineage and events, which staleness and incremental reruns read. For the
stages whose partitions leave a core idle, :func:`run_side_by_side` runs ``workers`` of those runs
at once, each in a process of its own (spawned: Dagster, DuckDB and the BLAS/OpenMP libraries are
not fork-safe), fed one partition at a time:

- ``corpus_shards``: pyarrow's Parquet writer compresses on one thread (a reading, validating and
  hashing thread beside it);
- ``cluster_shards``: faiss's search runs on every core, but between two searches Dagster's run of
  a partition (its run and event storage, on one thread) and the shard's first read
  leave the cores idle.

Each run computes what it computes alone, with the same thread counts (the kernels' own results do
not depend on which runs share the machine), so the outputs are byte-identical to running the
partitions one after another. How to measure it: docs/scale.md ("Partitions side by side").
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Callable, Iterable

import dagster as dg

from pipeline.distributed.processes import run_in_processes
from pipeline.distributed.run_log import RunTerminal, run_failed, run_log_path
from pipeline.errors import StrataInputError, StrataRunError, storage_error

# The per-shard assets whose partitions run side by side, and the most runs at once by default
# (None: one a core). corpus_shards' runs each keep about one core busy; cluster_shards' faiss
# searches already use every core (at the thread count its results depend on), so a second run is
# enough to fill the gaps between them. The others' kernels keep every core busy (the tokenizers'
# Rust thread pool in token_shards and embedding_shards).
SIDE_BY_SIDE: dict[str, int | None] = {"corpus_shards": None, "cluster_shards": 2}

_worker: dict = {}


def side_by_side_workers(names: Iterable[str], n_partitions: int, setting: int, engine: str, cores: int) -> int:
    """How many runs of the batch ``names`` to keep going at once: 1 (one after another) unless
    every asset of the batch is in :data:`SIDE_BY_SIDE`, the engine is local and each worker gets
    two partitions or more (a worker's start-up, imports and definitions, is then paid back); else
    ``setting`` (the config's ``partition_workers``), or by default one a core up to the assets' caps."""
    names = set(names)
    if engine != "local" or not names or not names <= SIDE_BY_SIDE.keys():
        return 1
    workers = setting or min([cores] + [SIDE_BY_SIDE[n] for n in names if SIDE_BY_SIDE[n]])
    return workers if workers >= 2 and n_partitions >= 2 * workers else 1


def materialize_run(all_assets: list, resources: dict, instance: dg.DagsterInstance, selection: list[str], partition: str | None,
                    log_level: str = "INFO", tags: dict | None = None) -> list[str]:
    """One Dagster run of ``selection`` (for ``partition``); a Strata input error is raised as itself,
    its fix naming the run's log file (:func:`run_log_path`), where Dagster's trace went instead of
    the terminal; any other failure as a :class:`StrataRunError` naming the cause and that log file.
    Returns one line per warning check that failed (``asset[partition] check: description``), which
    ``strata run`` prints at its end: a warning that only the UI shows is not seen."""
    log = run_log_path()
    saved = sys.stderr
    if log is not None:
        sys.stderr = RunTerminal(saved, log)
    try:
        result = dg.materialize(
            all_assets, selection=selection, partition_key=partition, instance=instance, resources=resources,
            raise_on_error=True, run_config={"loggers": {"console": {"config": {"log_level": log_level}}}}, tags=tags,
        )
    except (dg.DagsterUserCodeExecutionError, StrataInputError) as exc:
        err = exc.user_exception if isinstance(exc, dg.DagsterUserCodeExecutionError) else exc
        if not isinstance(err, StrataInputError) and (storage := storage_error(err)) is not None:
            run_failed(selection, partition, err, log)  # the trace to the run's log
            err = storage  # a full volume, a read-only one, the file-size limit: the path and the fix, exit 2
        if not isinstance(err, StrataInputError):
            raise run_failed(selection, partition, err, log) from (None if log is not None else exc)
        if log is None or str(log) in err.fix:
            raise err from None
        raise StrataInputError(err.problem, path=err.path, line=err.line,
                               fix=f"{err.fix} (Dagster's log of the run, with the trace: {log})") from None
    except Exception as exc:  # Dagster's own errors and anything raised outside the asset's code
        raise run_failed(selection, partition, exc, log) from (None if log is not None else exc)
    finally:
        if log is not None:
            sys.stderr.log.close()
            sys.stderr = saved
    if not result.success:
        raise run_failed(selection, partition, None, log)
    return [f"{e.asset_key.to_user_string()}{f'[{partition}]' if partition else ''} {e.check_name}: {e.description}"
            for e in result.get_asset_check_evaluations() if not e.passed and e.severity == dg.AssetCheckSeverity.WARN]


def _start(config_file: str | None, data_root: str, instance_ref, log_level: str, tags: dict) -> None:
    """A worker's set-up: the definitions and the Dagster instance, once."""
    from assets.definitions import build_definitions

    defs = build_definitions(config_file, data_root)
    _worker.update(assets=list(defs.assets) + list(defs.asset_checks or []), resources=defs.resources,
                   instance=dg.DagsterInstance.from_ref(instance_ref), log_level=log_level, tags=tags)


def _run(selection: list[str], partition: str) -> None:
    """One run in a worker. Errors other than a Strata input error come back as a RuntimeError
    naming the run and the cause (Dagster's own errors do not survive pickling); the worker's
    traceback comes with it (``__cause__``)."""
    w = _worker
    try:
        materialize_run(w["assets"], w["resources"], w["instance"], selection, partition, w["log_level"], w["tags"])
    except (StrataInputError, StrataRunError):
        raise
    except Exception as exc:
        cause = exc.user_exception if isinstance(exc, dg.DagsterUserCodeExecutionError) else exc
        raise RuntimeError(f"materialization failed: {', '.join(selection)} [{partition}]: {type(cause).__name__}: {cause}") from exc


def run_side_by_side(selection: list[str], partitions: list[str], workers: int, config_file: str | None, data_root: str,
                     instance, log_level: str, tags: dict, log: Callable[[str], None] = print) -> None:
    """One Dagster run of ``selection`` for each of ``partitions``, ``workers`` at a time in worker
    processes (:func:`pipeline.distributed.processes.run_in_processes`), started in the partitions'
    order. After a failure no further run starts; the runs under way finish, then the first error
    is raised (a Strata input error as itself)."""
    label = ", ".join(selection)
    run_in_processes(partial(_run, selection), partitions, workers, _start, (config_file, data_root, instance.get_ref(), log_level, tags),
                     started=lambda key: log(f"==> materializing {label} [{key}]"))


def run_partitions(all_assets: list, resources: dict, instance: dg.DagsterInstance, selection: list[str], partitions: list[str],
                   cfg, config_file: str | None, log_level: str = "INFO", tags: dict | None = None,
                   log: Callable[[str], None] = print) -> None:
    """One Dagster run of ``selection`` for each of ``partitions`` (a per-shard batch), side by side
    where :func:`side_by_side_workers` says so (and the instance can be opened again by a worker),
    else one after another in this process."""
    from pipeline.threads import cores

    workers = side_by_side_workers(selection, len(partitions), cfg.partition_workers, cfg.engine, cores())
    if workers > 1 and not instance.is_ephemeral:
        run_side_by_side(selection, partitions, workers, config_file, str(cfg.root), instance, log_level, tags or {}, log)
        return
    for key in partitions:
        log(f"==> materializing {', '.join(selection)} [{key}]")
        materialize_run(all_assets, resources, instance, selection, key, log_level, tags)
