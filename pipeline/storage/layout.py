"""Where every artifact lives under the data root (the on-disk half of the data contract).

``Layout`` names the paths; ``Store`` reads the artifacts whose reading has a rule: an ordering
with the segments its ids refer to, the packed sequences with their ``seq_len``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import StrataInputError

if TYPE_CHECKING:
    import numpy as np
    import polars as pl


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def corpus(self) -> Path:
        return self.root / "corpus.parquet"

    @property
    def shards(self) -> Path:
        """The shard manifest written by ``corpus`` (one row per corpus shard)."""
        return self.root / "corpus" / "shards.parquet"

    def shard_dir(self, stage: str) -> Path:
        """Per-shard artifacts of a stage (``corpus``), named by content fingerprint."""
        return self.root / stage / "shards"

    @property
    def heldout(self) -> Path:
        return self.root / "heldout"

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer"

    @property
    def tokens(self) -> Path:
        """The token store: an index over the ``token_shards`` files (:mod:`pipeline.data.token_index`)."""
        return self.root / "tokens" / "runs.parquet"

    @property
    def doc_offsets(self) -> Path:
        return self.root / "tokens" / "doc_offsets.npy"

    @property
    def documents(self) -> Path:
        return self.root / "documents.parquet"

    @property
    def embeddings(self) -> Path:
        """The embedding matrix's index over the shard files (:mod:`pipeline.represent.embedding_index`)."""
        return self.root / "embeddings" / "runs.parquet"

    @property
    def clusters(self) -> Path:
        return self.root / "clusters.parquet"

    @property
    def centroids(self) -> Path:
        return self.root / "clusters" / "centroids.npy"

    @property
    def segments(self) -> Path:
        return self.root / "sequences" / "segments.parquet"

    @property
    def sequence_matrix(self) -> Path:
        return self.root / "sequences" / "tokens.bin"

    @property
    def sequences_meta(self) -> Path:
        """``{"seq_len": L, "packing": ...}`` of the packed sequences."""
        return self.root / "sequences" / "meta.json"

    @property
    def duckdb(self) -> Path:
        return self.root / "strata.duckdb"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    def ordering(self, strategy: str) -> Path:
        return self.inside("orderings", f"{strategy}.parquet")

    def ordering_segments(self, strategy: str) -> Path:
        return self.inside("orderings", f"{strategy}.segments.parquet")

    def ordering_mixture(self, strategy: str) -> Path:
        """Target and realized cluster shares of a strategy that realizes a mixture, with its token accounting."""
        return self.inside("orderings", f"{strategy}.mixture.parquet")

    @property
    def mixture_weights(self) -> Path:
        return self.inside("mixture", "weights.parquet")

    def run_dir(self, strategy: str, seed: int) -> Path:
        return self.inside("runs", strategy, f"seed{seed}")

    def eval_file(self, strategy: str, seed: int) -> Path:
        return self.inside("evals", f"{strategy}.seed{seed}.parquet")

    def export_dir(self, strategy: str, fmt: str) -> Path:
        return self.inside("exports", strategy, fmt)

    def inside(self, *parts: str) -> Path:
        """A path under the root; refuses names that would escape it (``..``, absolute paths)."""
        path = self.root.joinpath(*parts).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise StrataInputError(f"path {'/'.join(parts)!r} escapes the data root {self.root}", fix="use plain names without '..' or '/'")
        return path


@dataclass(frozen=True)
class Ordering:
    """A strategy's order and the packing its sequence ids refer to."""

    strategy: str
    order: "np.ndarray"  # int64 sequence ids by position
    segments: "pl.DataFrame"  # the strategy's own repacking, else the base packing
    repacked: bool
    path: Path
    segments_path: Path
    target_share: "np.ndarray | None" = None  # per cluster, when the strategy realizes a mixture (its order is a schedule)


@dataclass(frozen=True)
class Sequences:
    """The base packing: ``segments.parquet``, the M x L matrix ``tokens.bin`` and its ``seq_len``."""

    seq_len: int
    segments_path: Path
    matrix_path: Path
    freeze_prefix: int = 0  # sequences whose positions every stream keeps (pipeline/packing/frozen.py); 0 = off


@dataclass(frozen=True)
class Store:
    """Typed reads of the artifacts under a data root (``Layout`` gives their paths)."""

    layout: Layout

    def ordering(self, strategy: str) -> Ordering:
        """``orderings/<strategy>.parquet`` with the segments it refers to: the strategy's own
        (``orderings/<strategy>.segments.parquet``, when it repacked), else ``sequences/segments.parquet``;
        and the target cluster shares of ``orderings/<strategy>.mixture.parquet`` when it realizes a mixture."""
        import numpy as np
        import polars as pl

        path = self.layout.ordering(strategy)
        if not path.exists():
            raise StrataInputError(f"no ordering for strategy {strategy!r}", path=path,
                                   fix=f"materialize orderings[{strategy}] first (strata run, or the Dagster UI)")
        order = pl.read_parquet(path).sort("position")["sequence_id"].to_numpy().astype(np.int64)
        own = self.layout.ordering_segments(strategy)
        seg_path = own if own.exists() else self.layout.segments
        mixture = self.layout.ordering_mixture(strategy)
        target = pl.read_parquet(mixture).sort("cluster")["target_share"].to_numpy() if mixture.exists() else None
        return Ordering(strategy, order, pl.read_parquet(seg_path), own.exists(), path, seg_path, target)

    @property
    def sequences(self) -> Sequences:
        """The packed sequences; ``seq_len`` from ``sequences/meta.json``, or for a data root
        written before it from the matrix size (M sequences x seq_len tokens of the token dtype)."""
        lay = self.layout
        if lay.sequences_meta.exists():
            meta = json.loads(lay.sequences_meta.read_text(encoding="utf-8"))
            return Sequences(int(meta["seq_len"]), lay.segments, lay.sequence_matrix, int(meta.get("freeze_prefix", 0)))
        if not lay.segments.exists() or not lay.sequence_matrix.exists():
            raise StrataInputError("no packed sequences in the data root", path=lay.root / "sequences",
                                   fix="materialize sequences first (strata run, or the Dagster UI)")
        import polars as pl

        from pipeline.data.tokens import open_tokens

        ids = pl.read_parquet(lay.segments, columns=["sequence_id"])["sequence_id"]
        n_seq = int(ids.max()) + 1 if len(ids) else 0
        itemsize = open_tokens(lay.tokens, lay.doc_offsets)[0].dtype.itemsize
        size = lay.sequence_matrix.stat().st_size
        if not n_seq or size % (n_seq * itemsize):
            raise StrataInputError(f"the sequence matrix ({size} bytes) is not {n_seq} rows of {itemsize}-byte tokens",
                                   path=lay.sequence_matrix, fix="rematerialize sequences")
        return Sequences(size // (n_seq * itemsize), lay.segments, lay.sequence_matrix)
