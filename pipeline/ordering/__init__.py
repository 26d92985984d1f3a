"""Ordering engine: every scheduling strategy (Don't Shuffle, Optimize; Diversity-ordered training; TerRIFIC curricula) as plain functions.

Entry point: ``run_strategy(name, docs, segments, seq_len, params, seed) -> OrderingResult``;
registry: ``STRATEGIES``; array APIs: ``sequence_order`` / ``document_order`` on
``SequenceFeatures`` (built by ``sequence_features``) or per-document arrays.
"""

from pipeline.ordering.curriculum import curriculum_from_dict
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
    "run_strategy",
    "sequence_features",
    "sequence_order",
    "tie_tolerance",
]
