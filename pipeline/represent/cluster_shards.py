"""Cluster assignment per corpus shard (the ``cluster_shards`` partitions).

The k-means model (``clusters/model/``, trained on a sample of the gathered embeddings and kept
across appends, :mod:`pipeline.represent.clusters`) assigns each shard's embedding rows on their
own into ``clusters/shards/<validated>-<model>.npy`` (int32), in work units of ``shard_docs`` rows on
the configured engine. The file is named by the model's key, so a kept model never reassigns an
old shard and a retrained one reassigns them all. The ``clusters`` asset gathers the shards' rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.data.shard_docs import ShardDocs
from pipeline.distributed.units import map_corpus_shards
from pipeline.represent.clusters import Transform, assign_transformed
from pipeline.storage.atomic import write_npy
from pipeline.storage.integrity import intact
from pipeline.storage.npy_rows import NpyRows


def assignment_file(shard_dir: Path, shard: ShardDocs, model_key: str) -> Path:
    return shard_dir / f"{shard.name}-{model_key}.npy"


def assign_shards(shards: list[ShardDocs], centroids: np.ndarray, transform: Transform, model_key: str,
                  embedding_file, shard_dir: Path, work_dir: Path, cfg) -> dict[str, int]:
    """Assign every shard whose file is missing; ``embedding_file(shard)`` is its embeddings' ``.npy``."""
    shard_dir.mkdir(parents=True, exist_ok=True)

    def unit_args(shard: ShardDocs, a: int, b: int) -> tuple:
        """The unit's rows read and transformed (normalized): on the local engine this runs ahead,
        beside faiss's search of the previous unit, so both cores stay busy."""
        rows = NpyRows(embedding_file(shard)).rows(a, b)
        return (centroids, transform.spherical, transform(rows.astype(np.float32, copy=False), inplace=True))

    return map_corpus_shards(
        shards, assign_transformed, unit_args,
        lambda shard, results: write_npy(np.concatenate([r[0] for r in results]), assignment_file(shard_dir, shard, model_key)),
        lambda s: intact([assignment_file(shard_dir, s, model_key)]), stage="clusters", key=model_key, work_dir=work_dir, cfg=cfg,
        checkpoint=False,
    )
