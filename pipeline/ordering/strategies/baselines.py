"""``original`` (the packing order) and ``random`` (a seeded uniform permutation): the baselines."""

from __future__ import annotations

import numpy as np

from pipeline.ordering.strategies import StrategySpec


def original(features, params, seed: int) -> np.ndarray:
    return np.arange(features.n_sequences, dtype=np.int64)


def random(features, params, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(features.n_sequences)


SPECS = (
    StrategySpec("original", "sequence", "packing order", seed_free=True, order=original, features=False),
    StrategySpec("random", "sequence", "seeded uniform permutation of the sequences", seed_free=False, order=random, features=False),
)
