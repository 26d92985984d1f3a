"""Map a pure per-shard function over shards, on this process (``local``) or on Ray, with the same bytes.

A :class:`~pipeline.distributed.shards.Shard` names the arguments of one call and the artifacts it produces. Both engines
compute ``fn(*shard.args)`` for every shard whose artifacts are missing and hand each result to
``save`` on the driver, which writes the shard's artifacts atomically. So:

- the unit of work (which documents go into one call, hence one embedding batch plan) is fixed by
  the shard list, never by the engine: both engines write identical bytes;
- a run killed midway leaves complete shards only; a rerun skips them (resume);
- a :class:`~pipeline.errors.StrataInputError` raised in a shard reaches the caller as the same
  error (same file, line and fix) whichever engine ran it. When several shards are bad, the one
  earliest in the list is reported.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from pipeline.distributed.processes import map_processes
from pipeline.distributed.ray_engine import map_shards_ray
from pipeline.distributed.shards import Shard, ShardFailure, call_shard
from pipeline.errors import StrataInputError


def map_shards(
    fn: Callable[..., Any],
    shards: Sequence[Shard],
    save: Callable[[Shard, Any], None],
    *,
    engine: str = "local",
    ray_cfg: Any = None,
    actors: bool = False,
    progress: Callable[[Shard], None] | None = None,
    fresh_process: bool = False,
) -> int:
    """Compute and ``save`` every shard not yet done; return how many were computed.

    ``fn`` must be a module-level function (Ray ships it by reference). ``actors=True`` runs the
    shards on long-lived model actors (one per GPU, else per ``ray.embed_cpus``) so a model is
    loaded once per actor, not once per shard.
    """
    todo = [s for s in shards if not s.done()]
    if engine == "ray":
        failures = map_shards_ray(fn, todo, save, ray_cfg, actors=actors, progress=progress, fresh_process=fresh_process)
    elif engine == "local":
        failures = {}
        for i, shard in enumerate(todo):
            result = call_shard(fn, shard.arguments())
            if isinstance(result, ShardFailure):
                failures[i] = result
                break
            save(shard, result)
            if progress:
                progress(shard)
    else:
        raise StrataInputError(f"unknown engine {engine!r}", fix="use engine: local or engine: ray")
    if failures:
        raise failures[min(failures)].error()
    return len(todo)


def map_tasks(fn: Callable[..., Any], shards: Sequence[Shard], *, engine: str = "local", ray_cfg: Any = None, workers: int = 1,
              retries: int = 3) -> int:
    """Run every shard not yet done whose function writes its own artifacts (under a data root every
    worker reads and writes) and returns their paths: with ``engine: local`` each in a worker process
    of its own (``workers`` at once), with ``engine: ray`` each a Ray task in a worker process of its
    own (a task's heap never carries an earlier task's); a worker that dies is retried (``retries``;
    Ray: ``ray.max_retries``). Return how many ran."""
    if engine == "ray":
        return map_shards(fn, shards, lambda shard, result: None, engine="ray", ray_cfg=ray_cfg, fresh_process=True)
    if engine != "local":
        raise StrataInputError(f"unknown engine {engine!r}", fix="use engine: local or engine: ray")
    return map_processes(fn, shards, workers, retries)
