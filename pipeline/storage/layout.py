"""Where every artifact lives under the data root (the on-disk half of the data contract).

``Layout`` names the paths; ``Store`` reads the artifacts whose reading has a rule: an ordering
with the segments its ids refer to, the packed sequences with their ``seq_len``. Storage imports
no stage: reading the packed sequences' tokens is the packing's (``pipeline/packing/stored.py``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from pipeline.errors import StrataInputError
from pipeline.storage.atomic import file_sha256

if TYPE_CHECKING:
    import numpy as np
    import polars as pl


ROOT_MARKER = ".strata-root"  # written into every data root Strata prepares: corpus discovery never reads below it
BOOKKEEPING = ("strata.duckdb", "strata.duckdb.wal", "dagster")  # the runs' records, not artifacts


def table_columns(outputs: list[Path]) -> list[tuple[str, str]] | None:
    """(name, Arrow type) of the columns of the first Parquet table among ``outputs`` (a stage's
    table; its DuckDB rows have the same columns); None when there is none."""
    for p in outputs:
        if str(p).endswith(".parquet") and Path(p).is_file():
            return [(f.name, str(f.type)) for f in pq.read_schema(p)]
    return None


def artifact_digests(root: Path) -> dict[str, str]:
    """SHA-256 of every artifact file under the data root ``root``, by relative path: not the runs'
    bookkeeping (DuckDB, Dagster's storage) nor hidden files (logs, markers, temporaries). Two roots
    built from the same inputs and seed give equal digests (the data contract)."""
    out = {}
    for p in sorted(Path(root).rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and rel.parts[0] not in BOOKKEEPING and not any(part.startswith(".") for part in rel.parts):
            out[rel.as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def is_data_root(directory: Path) -> bool:
    """Whether ``directory`` is a Strata data root (its marker, or a ``strata.duckdb`` of an older root)."""
    return (directory / ROOT_MARKER).is_file() or (directory / "strata.duckdb").is_file()


def foreign_entries(root: Path) -> list[str]:
    """The names in the folder ``root`` that make it another's folder, not a Strata data root: every
    entry, unless the folder is a data root (:func:`is_data_root`); only ``dagster`` (an instance
    the README's ``DAGSTER_HOME=<data root>/dagster`` made before the first run) is allowed in a
    folder not yet marked."""
    root = Path(root)
    if not root.is_dir() or is_data_root(root):
        return []
    return sorted(e.name for e in root.iterdir() if e.name != "dagster")


def check_data_root(root: Path, *, write: bool = True) -> Path:
    """``root`` as a usable data root: created if missing and marked (:data:`ROOT_MARKER`); a path
    that is a file, or (with ``write``) a folder Strata cannot write into, is a StrataInputError.
    With ``write``, so is a folder that holds anything and is not a data root, whatever its
    spelling (``.``, ``~``, a project folder): Strata replaces and prunes folders under its data
    root, and must never delete a file it did not write."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise StrataInputError("the data root is a file, not a directory", path=root,
                               fix="set data_root (or STRATA_HOME) to a directory; Strata creates it if missing")
    if not write:
        return root
    if foreign := foreign_entries(root):
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise StrataInputError(
            f"the data root is a folder that is not empty ({shown}) and is not a Strata data root (no {ROOT_MARKER}): "
            "Strata would replace and prune folders in it", path=root,
            fix=f"set data_root (or STRATA_HOME) to a new or empty directory, e.g. {root / '.strata'}; "
                f"a data root Strata made holds {ROOT_MARKER}")
    try:
        root.mkdir(parents=True, exist_ok=True)
        marker = root / ROOT_MARKER  # first: another process checking the new root at once finds it marked
        if not marker.exists():
            marker.write_text("This folder is a Strata data root; Strata never reads it as corpus.\n", encoding="utf-8")
        probe = root / f".write-probe-{os.getpid()}.tmp"  # os.access says yes to root on a read-only folder
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise StrataInputError(f"the data root cannot be written ({exc.strerror or exc})", path=root,
                               fix="make it writable (chmod u+w) or set data_root to another directory") from None
    return root


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
    def quality(self) -> Path:
        """The quality stage's per-document table (doc_id, quality, removed): the documents' ``quality`` column."""
        return self.root / "quality" / "documents.parquet"

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

    @property
    def mixture_curriculum(self) -> Path:
        """The mixture stage's learned curriculum (knots format), which ``greedy_curriculum`` reads by default."""
        return self.inside("mixture", "curriculum.yaml")

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
    """A strategy's order and the packing its sequence ids refer to (``segments``, read on first use)."""

    strategy: str
    order: "np.ndarray"  # int64 sequence ids by position
    repacked: bool
    path: Path
    segments_path: Path  # the strategy's own repacking, else the base packing
    target_share: "np.ndarray | None" = None  # per cluster, when the strategy realizes a mixture (its order is a schedule)

    @functools.cached_property
    def segments(self) -> "pl.DataFrame":
        return pl.read_parquet(self.segments_path)

    @property
    def n_sequences(self) -> int:
        """Sequences of the packing (its largest sequence id + 1), read from that one column."""
        top = pl.scan_parquet(self.segments_path).select(pl.col("sequence_id").max()).collect().item()
        return 0 if top is None else int(top) + 1


@dataclass(frozen=True)
class Sequences:
    """The base packing: ``segments.parquet`` (offsets into the token store) and its ``seq_len``."""

    seq_len: int
    segments_path: Path
    freeze_prefix: int = 0  # sequences whose positions every stream keeps (pipeline/packing/frozen.py); 0 = off
    tokens: str | None = None  # tokens_fingerprint of the token store the segments point into (None: not recorded)


@dataclass(frozen=True)
class Store:
    """Typed reads of the artifacts under a data root (``Layout`` gives their paths)."""

    layout: Layout

    def ordering(self, strategy: str) -> Ordering:
        """``orderings/<strategy>.parquet`` with the segments it refers to: the strategy's own
        (``orderings/<strategy>.segments.parquet``, when it repacked), else ``sequences/segments.parquet``;
        and the target cluster shares of ``orderings/<strategy>.mixture.parquet`` when it realizes a mixture."""
        path = self.layout.ordering(strategy)
        if not path.exists():
            raise StrataInputError(f"no ordering for strategy {strategy!r}", path=path,
                                   fix=f"materialize orderings[{strategy}] first (strata run, or the Dagster UI)")
        order = pl.read_parquet(path).sort("position")["sequence_id"].to_numpy().astype(np.int64)
        own = self.layout.ordering_segments(strategy)
        seg_path = own if own.exists() else self.layout.segments
        mixture = self.layout.ordering_mixture(strategy)
        target = pl.read_parquet(mixture).sort("cluster")["target_share"].to_numpy() if mixture.exists() else None
        return Ordering(strategy, order, own.exists(), path, seg_path, target)

    def document_clusters(self, columns: "list[str] | tuple[str, ...]" = ("n_tokens",)) -> "pl.DataFrame":
        """``doc_id``, the ``documents.parquet`` ``columns`` (and the quality stage's ``quality``) and
        each document's ``cluster``, in doc_id order. Both files are written in doc_id order, so the columns are put side by side; a
        polars hash join of 10M rows would hold about 0.8 GB. Tables out of that order (or of
        different documents) are joined (inner) and sorted."""
        cols = [c for c in columns if c != "doc_id"]
        scored = [c for c in cols if c not in pl.read_parquet_schema(self.layout.documents) and c in self.quality_columns()]
        docs = pl.read_parquet(self.layout.documents, columns=["doc_id", *[c for c in cols if c not in scored]])
        if scored:  # the quality stage's columns (quality/documents.parquet), in the documents' doc_id order
            docs = docs.join(pl.read_parquet(self.layout.quality, columns=["doc_id", *scored]), on="doc_id", how="left",
                             maintain_order="left")
        clusters = pl.read_parquet(self.layout.clusters, columns=["doc_id", "cluster"])
        if docs["doc_id"].equals(clusters["doc_id"]) and docs["doc_id"].is_sorted():
            return docs.with_columns(clusters["cluster"])
        return docs.join(clusters, on="doc_id").sort("doc_id")

    def quality_columns(self) -> tuple[str, ...]:
        """The columns the quality stage adds to the documents (``quality``), none before it ran."""
        path = self.layout.quality
        return tuple(c for c in pl.read_parquet_schema(path) if c not in ("doc_id", "removed")) if path.is_file() else ()

    @property
    def sequences(self) -> Sequences:
        """The packed sequences, ``seq_len`` from ``sequences/meta.json``."""
        lay = self.layout
        if not lay.sequences_meta.exists() or not lay.segments.exists():
            raise StrataInputError("no packed sequences (segments.parquet and meta.json) in the data root", path=lay.root / "sequences",
                                   fix="materialize sequences (strata run, or the Dagster UI); a data root packed before "
                                       "sequences/meta.json existed needs sequences rematerialized")
        meta = json.loads(lay.sequences_meta.read_text(encoding="utf-8"))
        return Sequences(int(meta["seq_len"]), lay.segments, int(meta.get("freeze_prefix", 0)), meta.get("tokens"))


def tokens_fingerprint(layout: Layout) -> str:
    """SHA-256 of the token store's index and document offsets (their digests, taken while they were
    written): what ``sequences`` records as the store its segments point into."""
    return hashlib.sha256(f"{file_sha256(layout.tokens)} {file_sha256(layout.doc_offsets)}".encode()).hexdigest()
