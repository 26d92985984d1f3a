"""Global batches: which positions of the ordering form batch b, and each rank's share of it.

Strata's promise: global batch b is positions ``[b*G, (b+1)*G)`` of the ordering, batches in
increasing b. With R data-parallel ranks each rank holds a contiguous micro-slice of B = G/R
positions: rank r gets ``[b*G + r*B, b*G + (r+1)*B)`` (how Megatron's pretraining sampler and
accelerate's batch sharding split a sequentially read dataset). A trailing partial batch is
dropped by every reader here, as by the trainers' ``drop_last``.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import StrataInputError


def check_batching(n_sequences: int, global_batch: int, world_size: int, workers: int) -> int:
    """Validate the batching arguments; return the per-rank batch B = G / R."""
    if global_batch < 1 or world_size < 1 or workers < 1:
        raise StrataInputError(
            f"global batch {global_batch}, world size {world_size}, workers {workers} are impossible",
            fix="set export.global_batch (0 = batch_size), export.world_size and export.workers to integers >= 1",
        )
    if global_batch % world_size:
        raise StrataInputError(
            f"global batch {global_batch} is not divisible by world size {world_size}",
            fix="choose a global batch that is a multiple of the number of data-parallel ranks",
        )
    if n_sequences < global_batch:
        raise StrataInputError(
            f"the ordering has {n_sequences} sequences, fewer than one global batch of {global_batch}",
            fix="lower export.global_batch (0 = batch_size)",
        )
    return global_batch // world_size


def rank_positions(step: int, global_batch: int, rank: int, world_size: int) -> np.ndarray:
    """Positions rank ``rank`` trains on at optimizer step ``step``."""
    b = global_batch // world_size
    lo = step * global_batch + rank * b
    return np.arange(lo, lo + b, dtype=np.int64)
