"""Ordering engine: every scheduling strategy of Don't Shuffle, Optimize, 001 and 002 as plain functions.

Entry point: ``run_strategy(name, docs, segments, seq_len, params, seed) -> OrderingResult``;
registry: ``STRATEGIES``; array APIs: ``sequence_order`` / ``document_order`` on
``SequenceFeatures`` (built by ``sequence_features``) or per-document arrays.
"""

from pipeline.ordering.curriculum import Curriculum, curriculum_from_dict, load_curriculum
from pipeline.ordering.features import Csr, SequenceFeatures, sequence_features
from pipeline.ordering.greedy import (
    Objective,
    greedy_blocked_order,
    greedy_mode,
    greedy_order,
    greedy_scaled_order,
    greedy_windowed_order,
    tie_tolerance,
)
from pipeline.ordering.strategies import (
    DOCUMENT_LEVEL,
    SEQUENCE_LEVEL,
    STRATEGIES,
    OrderingResult,
    OrderParams,
    Strategy,
    document_order,
    run_strategy,
    sequence_order,
)

__all__ = [
    "Csr",
    "Curriculum",
    "DOCUMENT_LEVEL",
    "Objective",
    "OrderParams",
    "OrderingResult",
    "SEQUENCE_LEVEL",
    "STRATEGIES",
    "SequenceFeatures",
    "Strategy",
    "curriculum_from_dict",
    "document_order",
    "greedy_blocked_order",
    "greedy_mode",
    "greedy_order",
    "greedy_scaled_order",
    "greedy_windowed_order",
    "load_curriculum",
    "run_strategy",
    "sequence_features",
    "sequence_order",
    "tie_tolerance",
]
