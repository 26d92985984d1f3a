"""Where every artifact lives under the data root (the on-disk half of the data contract)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import StrataInputError


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
        return self.root / "tokens" / "tokens.bin"

    @property
    def doc_offsets(self) -> Path:
        return self.root / "tokens" / "doc_offsets.npy"

    @property
    def documents(self) -> Path:
        return self.root / "documents.parquet"

    @property
    def embeddings(self) -> Path:
        return self.root / "embeddings" / "embeddings.npy"

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
    def duckdb(self) -> Path:
        return self.root / "strata.duckdb"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    def ordering(self, strategy: str) -> Path:
        return self.inside("orderings", f"{strategy}.parquet")

    def ordering_segments(self, strategy: str) -> Path:
        return self.inside("orderings", f"{strategy}.segments.parquet")

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
