"""A run's values of config keys, by key: the hash an asset's code version carries, and the
launchpad's per-run overrides (a field per key, ``claims.shuffles`` as ``claims_shuffles``)
applied to a validated config."""

from __future__ import annotations

import hashlib
import json
import types
import typing
from typing import Any, Iterable

from pydantic import BaseModel, ValidationError

from pipeline.config import FORMER_NAMES, StrataConfig, validation_error


def params_hash(keys: Iterable[str], cfg: StrataConfig) -> str:
    """A short hash of the values of ``keys``; a group's key that was a flat key is hashed under that
    former name (``claims.k`` as ``claims_k``), so the move into groups changed no code version."""
    values = cfg.subset(sorted(keys))
    blob = json.dumps({FORMER_NAMES.get(k, k): v for k, v in values.items()}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def launchpad_type(annotation: Any) -> Any:
    """The launchpad type of a StrataConfig field: Literals and unions with str (``freeze_prefix``)
    become str (StrataConfig validates and converts them)."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    if typing.get_origin(annotation) is typing.Literal or (union and str in typing.get_args(annotation)):
        return str
    if typing.get_origin(annotation) is list:
        return list[launchpad_type(typing.get_args(annotation)[0])]
    return annotation


def key_annotation(key: str) -> Any:
    """The type of the config ``key`` (dotted for a group's key, e.g. ``claims.shuffles``)."""
    model: Any = StrataConfig
    for part in key.split("."):
        annotation = model.model_fields[part].annotation
        model = annotation
    return annotation


def is_section(key: str) -> bool:
    """Whether ``key`` is a nested section of the config (corpus, dedup, mixture, ...): no launchpad field takes one."""
    annotation = key_annotation(key)
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def launchpad_field(key: str) -> str:
    """The launchpad field of the config ``key``: its name, a group's key with ``_`` (``claims.shuffles``: ``claims_shuffles``)."""
    return key.replace(".", "_")


def with_overrides(cfg: StrataConfig, keys: Iterable[str], given: dict[str, Any]) -> tuple[StrataConfig, dict[str, Any]]:
    """``cfg`` with the launchpad fields ``given`` for the config ``keys`` (None: the config file's
    value), and the overrides by config key (``claims_shuffles`` sets ``claims.shuffles``): those that differ."""
    fields = {launchpad_field(k): k for k in keys}
    overrides = {fields.get(f, f): v for f, v in given.items() if v is not None}
    overrides = {k: v for k, v in overrides.items() if v != cfg.subset([k])[k]}
    if not overrides:
        return cfg, overrides
    data = cfg.model_dump()
    for key, value in overrides.items():
        *groups, last = key.split(".")
        target = data
        for group in groups:
            target = target[group]
        target[last] = value
    try:
        return StrataConfig.model_validate(data), overrides
    except ValidationError as exc:
        raise validation_error(exc, "launchpad config") from None


def changed_values(recorded: dict[str, Any], cfg: StrataConfig) -> list[str]:
    """``key: before -> now`` for each config key whose value in ``cfg`` differs from ``recorded``
    (the values a materialization ran with)."""
    now = cfg.subset(list(recorded))
    return [f"{k}: {recorded[k]!r} -> {now[k]!r}" for k in sorted(recorded) if recorded[k] != now[k]]
