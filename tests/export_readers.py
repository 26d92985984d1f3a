"""Readers the export tests use where a trainer library cannot be installed beside the stack.

``streaming_partitions`` is MosaicML streaming 0.13.0's ``get_partitions_orig``
(``streaming/base/partition/orig.py``, Apache-2.0), copied for the single-canonical-node case
without ``drop_first``, so the MDS layout is checked against the library's own partition
algorithm; ``read_mds`` parses shards by the MDS format specification (``format/mds``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np


def streaming_partitions(num_samples: int, ranks_per_node: int, workers_per_rank: int, batch_size: int) -> np.ndarray:
    """(1, ranks, workers, batches, batch) sample ids, as StreamingDataset(shuffle=False) deals them
    with num_canonical_nodes = num_physical_nodes = 1."""
    num_physical_nodes = 1
    ids = np.arange(num_samples, dtype=np.int64).reshape(1, num_samples)
    ids = ids.transpose().flatten().reshape(-1, num_physical_nodes).transpose()
    overflow = ids.shape[1] % ranks_per_node
    if overflow:
        underflow = ranks_per_node - overflow
        last = ids[:, -ranks_per_node - underflow + 1 : -ranks_per_node + 1]
        ids = np.concatenate([ids, last], 1)
    ids = ids.reshape(num_physical_nodes, -1, ranks_per_node)
    rounded = math.ceil(ids.shape[1] / (workers_per_rank * batch_size)) * (workers_per_rank * batch_size)
    overflow = rounded - ids.shape[1]
    if overflow:
        ids = np.concatenate([ids, np.full((num_physical_nodes, overflow, ranks_per_node), -1, np.int64)], 1)
    ids = ids.transpose(0, 2, 1).reshape(num_physical_nodes, ranks_per_node, -1, workers_per_rank, batch_size)
    return ids.transpose(0, 1, 3, 2, 4)


def read_mds(directory: Path) -> np.ndarray:
    """All samples of an MDS dataset with one fixed-size ndarray column, by sample id: (n, L)."""
    index = json.loads((directory / "index.json").read_text())
    assert index["version"] == 2
    rows = []
    for shard in index["shards"]:
        assert shard["format"] == "mds" and shard["compression"] is None
        (enc,) = shard["column_encodings"]
        _, dtype, shape = enc.split(":")
        data = (directory / shard["raw_data"]["basename"]).read_bytes()
        assert len(data) == shard["raw_data"]["bytes"]
        n = int(np.frombuffer(data, np.uint32, 1)[0])
        assert n == shard["samples"]
        offsets = np.frombuffer(data, np.uint32, n + 1, 4).astype(np.int64)
        config = json.loads(data[4 + 4 * (n + 1) : offsets[0]])
        assert config["column_encodings"] == shard["column_encodings"]
        for a, b in zip(offsets[:-1], offsets[1:]):
            rows.append(np.frombuffer(data[a:b], dtype=dtype).reshape(int(shape)))
    return np.stack(rows)


def loader_order(partition: np.ndarray, rank: int) -> list[np.ndarray]:
    """Batches of one rank in the order a DataLoader with W workers returns them (round robin)."""
    _, _, workers, batches, _ = partition.shape
    out = []
    for j in range(batches):
        for w in range(workers):
            batch = partition[0, rank, w, j]
            batch = batch[batch >= 0]
            if batch.size:
                out.append(batch)
    return out


def olmo_core_local_indices(n_instances: int, instances_per_batch: int, rank: int, world_size: int,
                            worker: int, workers: int, batches_processed: int = 0) -> np.ndarray:
    """Instances one rank's DataLoader worker reads, as OLMo-core's ``NumpyFSLDataLoader`` with
    ``shuffle=False`` computes them (``_build_global_indices`` then ``_get_local_instance_indices``
    in ``olmo_core/data/data_loader.py``): whole global batches dealt round robin to workers, each
    batch strided over the data-parallel ranks."""
    total = instances_per_batch * (n_instances // instances_per_batch)
    indices = np.arange(n_instances, dtype=np.uint32)[:total].reshape(-1, instances_per_batch)
    indices = indices[batches_processed:]
    indices = indices[worker::workers]
    return indices[:, rank::world_size].reshape(-1)
