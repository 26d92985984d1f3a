"""The claims' registry: one :class:`ClaimSpec` per claim of a paper, one module per paper in this
folder (named by what the paper is, docs/references.md), plugins through ``STRATA_PLUGINS``
(``pipeline/registry.py``).

A spec names the claim, the paper it is from and what it says, and measures it:
``measure(data)`` takes the data root's ``pipeline.claims.measure.ClaimData`` and returns the
claim's rows (``Claim``: one or several, e.g. one per block and checkpoint), or raises
``MissingData`` when the data root lacks what it needs (the claim is then listed as not measured,
with the reason). ``reads`` are the config keys its rows depend on beyond ``bootstrap_samples``
and ``seed``, which every claim's interval reads: keys the claims stage's params read
(``pipeline.claims.stage.ClaimsParams``; the keys of the runs it reads are those runs' assets').
``inputs`` are the ``ClaimData`` fields it measures from.

Everything that lists the claims derives from the specs: what ``evaluate`` measures and in which
order (ascending ``order``, then name: the rows of DuckDB ``claims`` and ``claims_not_measured``,
of the report's claims section and of ``strata claims``), and ``strata list claims``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pipeline.registry import Registry


@dataclass(frozen=True)
class ClaimSpec:
    name: str  # the claim's name: claims_not_measured's ``claim``, evaluate(names=...)
    paper: str  # the paper, as docs/references.md names it
    description: str
    measure: Callable[..., list[Any]]  # (ClaimData) -> [Claim, ...]; raises MissingData when the data root lacks its inputs
    reads: tuple[str, ...] = ()  # StrataConfig keys its rows depend on beyond bootstrap_samples and seed
    inputs: tuple[str, ...] = ()  # the ClaimData fields it measures from
    order: int = 1000  # rows come in ascending order, then by name (the built-in claims: 10, 20, ...)


REGISTRY: Registry[ClaimSpec] = Registry(ClaimSpec, __name__, "claim")


def ordered() -> list[ClaimSpec]:
    """The claims in the order their rows come."""
    return sorted(REGISTRY.entries().values(), key=lambda c: (c.order, c.name))


def reads() -> tuple[str, ...]:
    """The configuration keys the claims read, sorted."""
    return tuple(sorted({k for c in REGISTRY.entries().values() for k in c.reads}))
