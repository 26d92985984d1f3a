"""What the engines map: a :class:`Shard` (one call's arguments and the artifacts it produces) and a
bad-input error carried back from a worker as a value (:class:`ShardFailure`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

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
