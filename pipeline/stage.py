"""What a stage function takes and returns.

Takes: a small typed params model, a subclass of :class:`StageParams` (a frozen dataclass), never
the whole :class:`pipeline.config.StrataConfig`. Settings objects are built from a config in one
place each: a params class names, field by field, the config key it reads (:func:`setting`), and
its inherited ``from_config(cfg)`` reads exactly those keys. So the keys a stage depends on are
stated once, beside the stage, and ``assets/params.py`` derives each asset's parameters (its code
version and launchpad face) from the params class of the stage it calls (``keys()``) plus the keys
its registry's entries read. A stage function reads ``params.<field>`` and passes its params (or
the part an inner function needs) down; a field named as its flat config key lets an inner function
that reads ``cfg.<key>`` take the params as they are. The pattern, for a new stage::

    @dataclass(frozen=True)
    class PackParams(StageParams):
        seq_len: int = setting()                      # the config key is the field's name
        seed: int = setting()
        claims_k: int = setting("claims.k")           # a group's key
        engine: str = setting(versioned=False)        # read, but not one of the asset's parameters

    def pack_sequences(layout, params: PackParams, connect: Connect) -> StageResult: ...

    # the asset:  stage.pack_sequences(layout, PackParams.from_config(cfg), duckdb.get_connection)

``versioned=False`` marks a key the result does not depend on (a speed knob, where work runs) or
one an upstream asset's parameters cover already (so it stays in that asset's launchpad).

Returns: a :class:`StageResult`, built with keywords: the files it wrote, its row counts, the
parameters its result depends on and the facts an asset shows (metadata, check results). The asset
records it as its lineage row and its Dagster result (``assets/common.py: Recorder.finish_stage``).
The library never imports Dagster, so checks are :class:`CheckFact` rows here and markdown is
marked :class:`Markdown`.
"""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

# A DuckDB connection to the data root's warehouse, closed when the block ends (Dagster's
# ``DuckDBResource.get_connection``, or ``pipeline.storage.duck.duck_connection`` bound to a path).
Connect = Callable[[], AbstractContextManager[Any]]


P = TypeVar("P", bound="StageParams")


def setting(key: str | None = None, *, versioned: bool = True, convert: Callable[[Any], Any] | None = None) -> Any:
    """A field of a :class:`StageParams` read from the config key ``key`` (default: the field's
    name; dotted for a group's key, e.g. ``claims.k``), passed through ``convert`` when given (a
    params class with ``from_config`` reads its own keys: give the class). ``versioned=False``: not
    one of the asset's parameters (see the module's docstring)."""
    return field(metadata={"key": key, "versioned": versioned, "convert": convert})


@dataclass(frozen=True)
class StageParams:
    """Base of a stage's params model: a frozen dataclass whose fields are :func:`setting` s."""

    @classmethod
    def _settings(cls) -> list[tuple[str, str | None, dict]]:
        return [(f.name, f.metadata.get("key") or (None if _nested(f.metadata) else f.name), dict(f.metadata))
                for f in dataclasses.fields(cls) if "versioned" in f.metadata]  # a plain field: the subclass's from_config sets it

    @classmethod
    def reads(cls) -> tuple[str, ...]:
        """Every config key ``from_config`` reads, in field order (a nested params class's keys included)."""
        out: list[str] = []
        for _, key, meta in cls._settings():
            out += list(meta["convert"].reads()) if key is None else [key]
        return tuple(dict.fromkeys(out))

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The config keys the stage's result depends on: ``reads()`` but the ``versioned=False`` ones."""
        out: list[str] = []
        for _, key, meta in cls._settings():
            if meta.get("versioned", True):
                out += list(meta["convert"].keys()) if key is None else [key]
        return tuple(dict.fromkeys(out))

    @classmethod
    def from_config(cls: type[P], cfg: Any) -> P:
        """The params of a :class:`pipeline.config.StrataConfig`: each field from its key."""
        values = {}
        for name, key, meta in cls._settings():
            convert = meta.get("convert")
            if key is None:
                values[name] = convert.from_config(cfg)
                continue
            value = cfg
            for part in key.split("."):
                value = getattr(value, part)
            values[name] = convert(value) if convert is not None else value
        return cls(**values)


@dataclass(frozen=True)
class EngineParams(StageParams):
    """Where per-shard work runs (``pipeline.distributed``): none of it changes a result."""

    engine: str = setting(versioned=False)  # local | ray
    ray: Any = setting(versioned=False)  # pipeline.config.RayConfig
    shard_docs: int = setting(versioned=False)  # documents per work unit


def _nested(meta: Any) -> bool:
    """Whether a field's ``convert`` is a params class that reads its own keys (it has ``from_config``)."""
    convert = meta.get("convert")
    return isinstance(convert, type) and hasattr(convert, "from_config") and hasattr(convert, "reads")


class Markdown(str):
    """A metadata value shown as markdown (a table) rather than as plain text."""


@dataclass(frozen=True)
class CheckFact:
    """The result of one asset check, computed by the stage: ``warn`` checks never block."""

    name: str
    passed: bool
    metadata: dict[str, Any] = field(default_factory=dict)
    description: str | None = None
    warn: bool = False


@dataclass(kw_only=True)
class StageResult:
    """One materialization's result: ``outputs`` (hashed into its data version), ``rows`` (row
    counts), ``parameters`` (what the result depends on, recorded in the lineage), ``facts``
    (metadata shown in the UI), ``checks`` and ``deps`` (upstream partitions to record instead of
    the asset's declared ones, e.g. the ordering an order was derived from) and ``digests`` (the
    SHA-256 of outputs that are not local files, e.g. objects written to an object store, taken
    while they were written). A result with ``skipped`` (why there was nothing to do) records no
    lineage row and no data version: the asset's metadata says why. Keywords only:
    ``StageResult(outputs=..., rows=..., parameters=...)``."""

    outputs: list[Path]
    rows: dict[str, int]
    parameters: dict[str, Any]
    facts: dict[str, Any] = field(default_factory=dict)
    checks: list[CheckFact] = field(default_factory=list)
    deps: dict[str, Any] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    skipped: str | None = None
