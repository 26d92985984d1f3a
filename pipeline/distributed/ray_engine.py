"""The Ray backend of :mod:`pipeline.distributed.engine`: shards as Ray tasks or on model actors.

Ray is imported here only, so the local engine never needs it. Results come back to the driver
through Ray's object store and are written there, so workers need no shared filesystem for
outputs (they do need Strata and the embedding model installed: docs/distributed.md).

Faults: a task whose worker process (or node) dies is retried up to ``ray.max_retries`` times;
a dead model actor is restarted as often and its in-flight shard retried. A bad-input error is
not retried: it comes back as a value (:class:`~pipeline.distributed.shards.ShardFailure`) and is
raised on the driver with the same file/line message as the local engine.

What comes back: every result the driver takes from the cluster is counted (:func:`received`) at the
size of its object as Ray stores and ships it (``ray.experimental.get_object_locations``'s
``object_size``: the serialized value, small results inlined in the reply included), by shard
function. With ``STRATA_RAY_RECEIVED_LOG`` set to a file, each mapping also appends one JSON line
there (time, process, function, results, bytes), so a benchmark can split a whole run by stage.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Callable, Iterator, Sequence

from pipeline.distributed.shards import Shard, ShardFailure, call_shard
from pipeline.offline import set_offline

RECEIVED_LOG = "STRATA_RAY_RECEIVED_LOG"
_received: dict[str, list[int]] = {}  # shard function -> [results, bytes] taken by this driver process


def received() -> dict[str, dict[str, int]]:
    """The results this process has taken from Ray so far and their bytes, by shard function."""
    return {name: {"results": n, "bytes": b} for name, (n, b) in _received.items()}


def _object_bytes(ray, ref, result: Any) -> int:
    """The size of ``ref``'s object as Ray holds and ships it; the value pickled again where Ray does not say."""
    size = ray.experimental.get_object_locations([ref]).get(ref, {}).get("object_size")
    return int(size) if size is not None else len(ray.cloudpickle.dumps(result))


class _Tally:
    """One mapping's results and bytes: added to :func:`received` and, with ``STRATA_RAY_RECEIVED_LOG``, logged."""

    def __init__(self, fn: Callable[..., Any]):
        self.name, self.results, self.bytes = getattr(fn, "__name__", "task"), 0, 0

    def add(self, ray, ref, result: Any) -> None:
        self.results += 1
        self.bytes += _object_bytes(ray, ref, result)

    def close(self) -> None:
        total = _received.setdefault(self.name, [0, 0])
        total[0] += self.results
        total[1] += self.bytes
        if path := os.environ.get(RECEIVED_LOG):
            with open(path, "a") as fh:
                fh.write(json.dumps({"t": time.time(), "pid": os.getpid(), "fn": self.name, "results": self.results,
                                     "bytes": self.bytes}) + "\n")


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
    fresh_process: bool = False,
) -> dict[int, ShardFailure]:
    """Run every shard of ``todo`` on the cluster, ``save`` each result as it arrives; return failures by index.
    ``fresh_process``: each task in a worker process of its own (``max_calls=1``), whose peak is its task's alone."""
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
            task = ray.remote(max_retries=cfg.max_retries, retry_exceptions=False, max_calls=1 if fresh_process else 0,
                              **options)(_worker_call)
            free = [None] * slots
        inflight: dict[Any, tuple[int, Any]] = {}
        queue = list(enumerate(todo))
        tally = _Tally(fn)
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
            tally.add(ray, ref, result)
            if isinstance(result, ShardFailure):
                failures[i] = result
                continue
            save(todo[i], result)
            if progress:
                progress(todo[i])
        tally.close()
    return failures


def run_remote(fn: Callable[..., Any], args: tuple, cfg, *, num_cpus: float, num_gpus: float, fresh_process: bool = False) -> Any:
    """``fn(*args)`` as one Ray task (``num_gpus`` only when the cluster has GPUs); bad input raises as locally.

    ``fresh_process``: run it in a worker process of its own (no module state from earlier tasks)."""
    with session(cfg) as ray:
        gpus = num_gpus if ray.cluster_resources().get("GPU", 0) > 0 else 0
        task = ray.remote(num_cpus=num_cpus, num_gpus=gpus, max_retries=cfg.max_retries, retry_exceptions=False,
                          max_calls=1 if fresh_process else 0)(_worker_call)
        ref, tally = task.remote(fn, args), _Tally(fn)
        result = _get(ray, ref, Shard(tally.name, args))
        tally.add(ray, ref, result)
        tally.close()
    if isinstance(result, ShardFailure):
        raise result.error()
    return result
