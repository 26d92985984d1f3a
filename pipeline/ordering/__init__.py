"""Ordering engine: every scheduling strategy of Don't Shuffle, Optimize, Diversity-ordered training
and TerRIFIC curricula as plain functions.

Entry point: ``run_strategy(name, docs, segments, seq_len, params, seed) -> OrderingResult``
(``engine.py``); the strategies: one spec each in ``strategies/`` (``STRATEGIES``, the scheduled
ones by name); array APIs: ``sequence_order`` / ``document_order`` on ``SequenceFeatures`` (built
by ``sequence_features``) or per-document arrays. Names resolve on first use, so
``import pipeline.ordering`` alone imports none of its modules.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Curriculum": "curriculum", "curriculum_from_dict": "curriculum", "load_curriculum": "curriculum",
    "Csr": "features", "SequenceFeatures": "features", "sequence_features": "features",
    "Objective": "greedy", "greedy_blocked_order": "greedy", "greedy_mode": "greedy", "greedy_order": "greedy",
    "greedy_scaled_order": "greedy", "greedy_windowed_order": "greedy", "tie_tolerance": "greedy",
    "OrderingResult": "engine", "OrderParams": "engine", "document_order": "engine", "run_strategy": "engine",
    "sequence_order": "engine",
    "DOCUMENT_LEVEL": "strategies", "SEQUENCE_LEVEL": "strategies", "STRATEGIES": "strategies", "StrategySpec": "strategies",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
