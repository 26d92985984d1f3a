"""Map a pure per-shard function over shards, on this process (``local``) or on Ray, with the same bytes.

A :class:`Shard` names the arguments of one call and the artifacts it produces. Both engines
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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from pipeline.errors import StrataInputError


@dataclass(frozen=True)
class Shard:
    name: str  # shown in progress and errors
    args: tuple  # positional arguments of the shard function (must pickle for Ray)
    outputs: tuple[Path, ...] = field(default_factory=tuple)  # all present = the shard is done
    load: Callable[[], tuple] | None = None  # reads the arguments when the shard is submitted, instead of ``args``

    def done(self) -> bool:
        return bool(self.outputs) and all(p.exists() for p in self.outputs)

    def arguments(self) -> tuple:
        """The shard's arguments: read only now (so only the shards in flight hold their inputs) when ``load`` is set."""
        return self.load() if self.load is not None else self.args


@dataclass(frozen=True)
class ShardFailure:
    """A bad-input error carried back from a worker as plain fields (no traceback, always pickles)."""

    problem: str
    fix: str
    path: str | None
    line: int | None

    def error(self) -> StrataInputError:
        return StrataInputError(self.problem, fix=self.fix, path=self.path, line=self.line)


def call_shard(fn: Callable[..., Any], args: tuple) -> Any:
    """Run one shard; a StrataInputError comes back as a :class:`ShardFailure` value."""
    try:
        return fn(*args)
    except StrataInputError as err:
        return ShardFailure(err.problem, err.fix, None if err.path is None else str(err.path), err.line)


def map_shards(
    fn: Callable[..., Any],
    shards: Sequence[Shard],
    save: Callable[[Shard, Any], None],
    *,
    engine: str = "local",
    ray_cfg: Any = None,
    actors: bool = False,
    progress: Callable[[Shard], None] | None = None,
) -> int:
    """Compute and ``save`` every shard not yet done; return how many were computed.

    ``fn`` must be a module-level function (Ray ships it by reference). ``actors=True`` runs the
    shards on long-lived model actors (one per GPU, else per ``ray.embed_cpus``) so a model is
    loaded once per actor, not once per shard.
    """
    todo = [s for s in shards if not s.done()]
    if engine == "ray":
        from pipeline.distributed.ray_engine import map_shards_ray

        failures = map_shards_ray(fn, todo, save, ray_cfg, actors=actors, progress=progress)
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
