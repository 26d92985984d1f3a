"""The names each stage answers to, declared without importing any stage.

The configuration validates against these lists; each stage is checked against them —
``tests/test_config.py`` fails when a stage adds a packing, embedding method or model preset
that is not declared here. Ordering strategies, characteristic families, export formats and eval
suites are not listed here: they come from their registries (``pipeline/ordering/strategies/``,
``pipeline/ordering/families/``, ``pipeline/export/formats/``, ``evals/suites/``);
``ORDERING_STRATEGIES`` reads the strategies' (its handle in ``pipeline/registry.py``) on first use.
"""

from __future__ import annotations

from typing import Any

from pipeline.registry import STRATEGIES

EMBED_METHODS = ("sentence", "shallow", "deep")
# greedy objectives: Don't Shuffle, Optimize's f1-f3, Strata's default, your own families
OBJECTIVES = ("stationary", "f1", "f2", "f3", "custom")
WITHIN_SORTS = ("original", "length-asc", "length-desc", "length-riffle")
POSITIVE_CONTROL = "cluster_sorted"  # the deliberately harmful order every ablation report checks first
PACKING_VARIANTS = ("concat", "padding", "best_fit")
ATOM_MULTIPLES = (0.25, 0.5, 1.0, 2.0, 4.0)  # Packing & shuffling, Table 1 / Table 4
MODEL_PRESETS = ("tiny", "small", "base", "100m")


def packing_name(variant: str, atom_multiple: float | None) -> str:
    """``("concat", 0.5)`` -> ``"concat-x0.5"``; ``None`` -> the plain variant."""
    return variant if atom_multiple is None else f"{variant}-x{atom_multiple:g}"


PACKING_SPECS = (
    *(packing_name(v, a) for v in ("concat", "padding") for a in (None, *ATOM_MULTIPLES)),
    "best_fit",
)


def __getattr__(name: str) -> Any:
    """``ORDERING_STRATEGIES``: the strategies scheduled before training, from their registry."""
    if name == "ORDERING_STRATEGIES":  # strategies.names("sequence", "document"), from the registry's handle
        return tuple(n for n, s in STRATEGIES.entries().items() if s.level in ("sequence", "document"))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
