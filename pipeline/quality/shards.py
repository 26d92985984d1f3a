"""Quality scores per corpus shard (the ``quality_shards`` partitions).

Each validated shard's training rows are scored on their own into
``quality/shards/<validated>-<key>.npy`` (float64, one score a training row), in work units of
``shard_docs`` documents on the configured engine (in this process, or on Ray actors that load the
model once). ``key`` is the scorer's fingerprint (:func:`pipeline.quality.scorers.fingerprint`:
every byte of the model and its parameters), so a shard is scored once per model and an appended
shard is the only one to score. A score that is not a finite number stops the stage (exit 2)
naming the shard file, the row and the document's id.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np

from pipeline.data.shard_docs import ShardDocs, read_shard_docs
from pipeline.distributed.units import map_corpus_shards
from pipeline.errors import StrataInputError
from pipeline.quality.scorers import Prepared, score_unit
from pipeline.storage.atomic import write_npy
from pipeline.storage.integrity import intact


def score_file(shard_dir: Path, shard: ShardDocs, key: str) -> Path:
    return shard_dir / f"{shard.name}-{key}.npy"


def finite(scores: np.ndarray, shard: ShardDocs, scorer: str) -> np.ndarray:
    """``scores`` when every one is a finite number, else exit 2 naming the first document that is not."""
    bad = np.flatnonzero(~np.isfinite(scores))
    if bad.size:
        row = int(bad[0])
        doc = read_shard_docs(shard, row, row + 1, columns=("id",))["id"][0]
        raise StrataInputError(f"the scorer {scorer!r} returned {scores[row]} for the document {doc!r} (training row {row}; "
                               f"{bad.size} documents of this shard have no finite score)", path=shard.path,
                               fix="use a model that gives every document a finite score (a probability or a regression value)")
    return scores


def score_shards(shards: list[ShardDocs], prepared: Prepared, shard_dir: Path, work_dir: Path, cfg) -> dict[str, int]:
    """Score every shard of ``shards`` whose file for ``prepared`` is missing (:func:`map_corpus_shards`'s counts)."""
    shard_dir.mkdir(parents=True, exist_ok=True)
    options = json.dumps(prepared.options, sort_keys=True)

    def unit_args(shard: ShardDocs, a: int, b: int) -> tuple:
        return prepared.scorer, prepared.model, options, read_shard_docs(shard, a, b)["text"].to_list()

    def assemble(shard: ShardDocs, results: Iterator[tuple]) -> None:
        scores = np.concatenate([np.asarray(r[0], np.float64) for r in results])
        write_npy(finite(scores, shard, prepared.scorer), score_file(shard_dir, shard, prepared.key))

    return map_corpus_shards(shards, score_unit, unit_args, assemble, lambda s: intact([score_file(shard_dir, s, prepared.key)]),
                             stage="quality", key=prepared.key, work_dir=work_dir, cfg=cfg, actors=True)
