"""Per shard, then gathered: the shape every whole-corpus stage over a per-shard one shares.

A per-shard stage (``token_shards``, ``embedding_shards``, ``cluster_shards``, ``clean_shards``) works
on one corpus shard's training documents (:func:`partition_shard`: a ``corpus_shard`` partition's
validated file) and names its artifacts by that shard and its producer. The whole-corpus stage
over it (``tokens``, ``embeddings``, ``clusters``, ``clean``) gathers them with
:func:`gather_shards`: every shard of the corpus ``corpus`` gathered (``corpus/shards.parquet``, in
corpus order), the per-shard computation called over all of them (it reuses the files the
partitions wrote and computes a missing one, the same way), the artifacts of shards no longer in
the corpus removed; :class:`Gathered` then gives each shard's rows in ``corpus.parquet`` and the
shards' partitions the gather read (its lineage inputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import polars as pl

from pipeline.data.corpus import shard_key, shard_version, validate_shard
from pipeline.data.shard_docs import ShardDocs, kept_rows, manifest_shards, prune
from pipeline.errors import StrataInputError


def shard_of(params, partition_key: str) -> tuple[str, str]:
    """(raw shard, content fingerprint) of a ``corpus_shard`` partition (``params``: the corpus shards'
    reading options, :class:`pipeline.data.stage.CorpusShardParams`)."""
    found = shard_version(params.corpus, partition_key)
    if found is None:
        raise StrataInputError(f"shard partition {partition_key!r} is not in the corpus any more",
                               path=str(params.corpus.path), fix="run `strata status` (it drops partitions of removed shards)")
    return found


def validated_shard(layout, params, partition_key: str) -> tuple[str, str, Path, dict, bool]:
    """A ``corpus_shard`` partition read and validated into ``corpus/shards/`` (an unchanged shard is
    not read again): (raw shard, fingerprint, validated file, its report, whether it was reused)."""
    unit, fp = shard_of(params, partition_key)
    out, info, reused = validate_shard(unit, fp, params.corpus, params.heldout_fraction, params.seed, layout.shard_dir("corpus"),
                                       engine=params.engine, ray_cfg=params.ray)
    return unit, fp, out, info, reused


def partition_shard(layout, params, partition_key: str) -> ShardDocs:
    """The training rows of a ``corpus_shard`` partition, for the per-shard stages (its validated
    file, which ``corpus_shards`` wrote; validated here if missing)."""
    unit, _, out, _, _ = validated_shard(layout, params, partition_key)
    return ShardDocs.of(unit, out)


def shard_facts(shard: ShardDocs, run: dict[str, Any], **facts: Any) -> dict[str, Any]:
    """The facts a per-shard stage shows: the validated file, whether the shard's artifacts were
    reused (or it has no training documents), then ``facts``."""
    return {"validated": shard.name, "reused": run["shards_reused"] > 0 or shard.n_docs == 0, **facts}


@dataclass(frozen=True)
class Gathered:
    """Every shard of the corpus with its per-shard artifacts in place (:func:`gather_shards`)."""

    shards: list[tuple[dict, ShardDocs]]  # each row of corpus/shards.parquet with its validated shard, in corpus order
    run: dict[str, Any]  # what the per-shard computation over every shard reported
    corpus_path: Path

    @property
    def docs(self) -> list[ShardDocs]:
        return [s for _, s in self.shards]

    def parts(self) -> Iterable[tuple[dict, ShardDocs, np.ndarray | None]]:
        """Each shard with training documents in ``corpus.parquet``, in corpus order: its manifest
        row, its validated shard and the shard rows ``corpus`` kept (None: all of them)."""
        for row, shard in self.shards:
            if int(row["n_docs"]):
                yield row, shard, kept_rows(self.corpus_path, row, shard)

    def deps(self, asset: str) -> dict[str, list[str]]:
        """The partitions of the per-shard ``asset`` the gather read, as lineage inputs."""
        return {asset: [shard_key(s.unit) for _, s in self.shards]}


def gather_shards(layout, stage: str, compute: Callable[[list[ShardDocs]], dict[str, Any]],
                  files: Callable[[ShardDocs], Iterable[Path]]) -> Gathered:
    """Every shard of the corpus ``corpus`` gathered, with ``compute`` (the per-shard stage over a
    list of shards, reusing the files already there) called over all of them; the files under
    ``layout.shard_dir(stage)`` that ``files`` names for no current shard are removed."""
    shards = manifest_shards(pl.read_parquet(layout.shards), layout.shard_dir("corpus"))
    run = compute([s for _, s in shards])
    prune(layout.shard_dir(stage), {f.name for _, s in shards for f in files(s)})
    return Gathered(shards, run, layout.corpus)
