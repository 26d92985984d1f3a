"""The Ray backend of :mod:`pipeline.distributed.engine`: shards as Ray tasks or on model actors.

Ray is imported here only, so the local engine never needs it. Results come back to the driver
through Ray's object store and are written there, so workers need no shared filesystem for
outputs (they do need Strata and the embedding model installed: docs/distributed.md).

Faults: a task whose worker process (or node) dies is retried up to ``ray.max_retries`` times;
a dead model actor is restarted as often and its in-flight shard retried. A bad-input error is
not retried: it comes back as a value (:class:`~pipeline.distributed.shards.ShardFailure`) and is
raised on the driver with the same file/line message as the local engine.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

from pipeline.distributed.shards import Shard, ShardFailure, call_shard
from pipeline.offline import set_offline


def _worker_call(fn: Callable[..., Any], args: tuple) -> Any:
    set_offline()
    return call_shard(fn, args)


class ShardActor:
    """A long-lived worker: models loaded by the shard function stay loaded between shards."""

    def run(self, fn: Callable[..., Any], args: tuple) -> Any:
        return _worker_call(fn, args)


@contextlib.contextmanager
def session(cfg) -> Iterator[Any]:
    """Connect to ``ray.address`` (``""`` starts a private local Ray instance for the block)."""
    import ray

    if ray.is_initialized():
        yield ray
        return
    address = cfg.address or "local"  # "local" never attaches to another cluster on this machine
    ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR", configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def _get(ray, ref, shard: Shard) -> Any:
    try:
        return ray.get(ref)
    except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as exc:
        raise RuntimeError(f"shard {shard.name}: its Ray worker died more often than ray.max_retries allows ({exc})") from None


def map_shards_ray(
    fn: Callable[..., Any],
    todo: Sequence[Shard],
    save: Callable[[Shard, Any], None],
    cfg,
    *,
    actors: bool = False,
    progress: Callable[[Shard], None] | None = None,
) -> dict[int, ShardFailure]:
    """Run every shard of ``todo`` on the cluster, ``save`` each result as it arrives; return failures by index."""
    failures: dict[int, ShardFailure] = {}
    if not todo:
        return failures
    with session(cfg) as ray:
        total = ray.cluster_resources()
        use_gpu = actors and total.get("GPU", 0) > 0 and cfg.embed_gpus > 0
        if use_gpu:
            slots = int(total["GPU"] // cfg.embed_gpus)
        else:
            slots = int(total.get("CPU", 1) // cfg.embed_cpus) if cfg.embed_cpus > 0 else len(todo)
        slots = max(1, min(slots, cfg.max_concurrency or slots, len(todo)))
        options = {"num_cpus": cfg.embed_cpus, "num_gpus": cfg.embed_gpus if use_gpu else 0}
        if actors:
            actor_cls = ray.remote(max_restarts=cfg.max_retries, max_task_retries=cfg.max_retries, **options)(ShardActor)
            free = [actor_cls.remote() for _ in range(slots)]
        else:
            task = ray.remote(max_retries=cfg.max_retries, retry_exceptions=False, **options)(_worker_call)
            free = [None] * slots
        inflight: dict[Any, tuple[int, Any]] = {}
        queue = list(enumerate(todo))
        while queue or inflight:
            while queue and free:
                i, shard = queue.pop(0)
                worker = free.pop()
                args = shard.arguments()
                ref = worker.run.remote(fn, args) if actors else task.remote(fn, args)
                inflight[ref] = (i, worker)
            [ref], _ = ray.wait(list(inflight), num_returns=1)
            i, worker = inflight.pop(ref)
            free.append(worker)
            result = _get(ray, ref, todo[i])
            if isinstance(result, ShardFailure):
                failures[i] = result
                continue
            save(todo[i], result)
            if progress:
                progress(todo[i])
    return failures


def run_remote(fn: Callable[..., Any], args: tuple, cfg, *, num_cpus: float, num_gpus: float, fresh_process: bool = False) -> Any:
    """``fn(*args)`` as one Ray task (``num_gpus`` only when the cluster has GPUs); bad input raises as locally.

    ``fresh_process``: run it in a worker process of its own (no module state from earlier tasks)."""
    with session(cfg) as ray:
        gpus = num_gpus if ray.cluster_resources().get("GPU", 0) > 0 else 0
        task = ray.remote(num_cpus=num_cpus, num_gpus=gpus, max_retries=cfg.max_retries, retry_exceptions=False,
                          max_calls=1 if fresh_process else 0)(_worker_call)
        result = _get(ray, task.remote(fn, args), Shard(getattr(fn, "__name__", "task"), args))
    if isinstance(result, ShardFailure):
        raise result.error()
    return result
