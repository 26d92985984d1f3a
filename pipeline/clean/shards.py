"""The clean stage's per-shard scans (the ``clean_shards`` partitions) and what the gather reads of them.

Everything the clean stage learns from a text is learned once per corpus shard, by reading the
shard's training documents in units of ``shard_docs`` rows on the configured engine
(:func:`pipeline.distributed.units.map_corpus_shards`), into ``clean/shards/``:

- ``<validated>-<key>.hashes.npy``: (n,) uint64, each document's normalized-text hash (``dedup.exact``);
- ``<validated>-<key>.sig.npy``: (n, ``dedup.near_num_perm``) uint32, each document's MinHash
  signature (``dedup.near``; the LSH bands are cut from it by the gather, so ``dedup.near_rows``
  is not part of the key, while ``near_num_perm`` is);
- ``<validated>-<key>.hits.npy``: (k, 3) int32 (int64 if a value does not fit), (row, set, n-gram)
  for each evaluation n-gram a document holds, each once (``decontam``; the set and n-gram index into
  the evaluation cache). About 9 hits a document of the benchmarks' corpus against its held-out
  split: 12 bytes each, half of int64's (``benchmarks/results/scale_50k_run.json``).

``key`` covers the scan's parameters and the evaluation sets' fingerprint (every byte of their
files), so a shard is never scanned twice for the same work, and the file of another shard or
another parameter is never touched. The evaluation sets' n-grams are hashed once into
``clean/evals/<key>/`` (:meth:`pipeline.clean.decontam.EvalNgrams.save`), which every unit reads.

The held-out split is the one evaluation set that moves with the corpus (an appended shard brings
held-out documents of its own), so the partitions check the fixed sets (WikiText, Paloma,
DCLM-core) and the gather checks the held-out split: the same scan with only those n-grams,
keyed by the split's fingerprint, so it reruns over every shard exactly when the split changed.
Comparisons across shards (a document against every earlier one, whichever shard holds it) are
the gather's: :mod:`pipeline.clean.stage`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from pipeline.clean.decontam import _READERS, EvalNgrams, sources_fingerprint
from pipeline.clean.exact import text_hashes
from pipeline.clean.near import signature_rows
from pipeline.data.shard_docs import ShardDocs, read_shard_docs
from pipeline.distributed.units import map_corpus_shards
from pipeline.storage.atomic import write_npy
from pipeline.storage.integrity import intact

VERSION = "2"  # of the scan's bytes: a change here rescans every shard


@dataclass(frozen=True)
class ScanSpec:
    """What one scan computes: exact hashes, MinHash signatures ``near = (num_perm, ngram, seed)``,
    hits against the evaluation cache folder ``evals``; ``key`` names its files."""

    exact: bool
    near: tuple[int, int, int] | None
    evals: str | None

    @property
    def key(self) -> str:
        blob = json.dumps([VERSION, self.exact, self.near, Path(self.evals).name if self.evals else None])
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def empty(self) -> bool:
        return not (self.exact or self.near or self.evals)

    def files(self, shard_dir: Path, shard: ShardDocs) -> dict[str, Path]:
        """The shard's files this scan writes: ``hashes``, ``sig``, ``hits`` (those it computes)."""
        parts = [p for p, on in (("hashes", self.exact), ("sig", self.near), ("hits", self.evals)) if on]
        return {p: shard_dir / f"{shard.name}-{self.key}.{p}.npy" for p in parts}


def scan_spec(cfg, evals: Path | None, dedup: bool = True) -> ScanSpec:
    """The scan ``cfg`` asks for (with ``dedup``: its exact and near parts), against the cache ``evals``."""
    d = cfg.dedup
    return ScanSpec(exact=bool(dedup and d.enabled and d.exact),
                    near=(int(d.near_num_perm), int(d.near_ngram), int(cfg.seed) + 1) if dedup and d.enabled and d.near else None,
                    evals=str(evals) if evals is not None else None)


def eval_cache(layout, sources: dict[str, Path], ngram: int) -> Path | None:
    """The folder holding the hashed ``ngram``-grams of the evaluation sets ``sources`` (name -> file
    or folder, :func:`pipeline.clean.decontam.eval_sources`), built when missing; None for no set.
    Every n-gram is kept: the boilerplate rule is the gather's (it needs the training side too)."""
    if not sources:
        return None
    key = hashlib.sha256(f"{VERSION}:{ngram}:{sources_fingerprint(sources)}".encode()).hexdigest()[:16]
    path = layout.inside("clean", "evals", key)
    if not (path / "sets.json").is_file():
        sets = {name: (lambda name=name, p=p: _READERS[name](p)) for name, p in sources.items()}
        EvalNgrams.build(sets, ngram).save(path)
    return path


@functools.lru_cache(maxsize=2)
def _evals(path: str):
    return EvalNgrams.load(Path(path))


def scan_unit(texts: Sequence[str], exact: bool, near: tuple[int, int, int] | None, evals: str | None) -> tuple[np.ndarray, ...]:
    """One unit's documents: (count, hashes, signatures, hits) as :mod:`this module <pipeline.clean.shards>` stores them."""
    n = len(texts)
    hashes = text_hashes(texts) if exact else np.zeros(0, np.uint64)
    sigs = signature_rows(texts, near[0], near[1], near[2]) if near else np.zeros((0, 0), np.uint32)
    hits = np.zeros((0, 3), np.int64)
    if evals:
        found = _evals(evals).hits(texts)
        hits = np.concatenate([np.column_stack([f[:, 0], np.full(f.shape[0], j), f[:, 1]]) for j, f in enumerate(found)]
                              + [hits]).astype(np.int64)
    return np.array([n], np.int64), hashes, sigs, hits


def scan_shards(shards: Sequence[ShardDocs], spec: ScanSpec, shard_dir: Path, work_dir: Path, cfg) -> dict[str, int]:
    """Scan every shard whose files for ``spec`` are missing (or not the bytes written)."""
    shard_dir.mkdir(parents=True, exist_ok=True)
    if spec.empty:
        return {"shards": len(shards), "shards_computed": 0, "shards_reused": len(shards), "units": 0, "units_resumed": 0}

    def unit_args(shard: ShardDocs, a: int, b: int) -> tuple:
        return read_shard_docs(shard, a, b)["text"].to_list(), spec.exact, spec.near, spec.evals

    def assemble(shard: ShardDocs, results: Iterator[tuple]) -> None:
        counts, hashes, sigs, hits, at = [], [], [], [], 0
        for n, h, s, t in results:
            t = np.array(t, np.int64, copy=True)
            t[:, 0] += at
            at += int(n[0])
            counts.append(int(n[0]))
            hashes.append(h)
            sigs.append(s)
            hits.append(t)
        files = spec.files(shard_dir, shard)
        if "hashes" in files:
            write_npy(np.concatenate(hashes).astype(np.uint64), files["hashes"])
        if "sig" in files:
            write_npy(np.concatenate(sigs).astype(np.uint32), files["sig"])
        if "hits" in files:
            hits = np.concatenate(hits)
            small = not hits.size or (hits.min() >= 0 and hits.max() < 2**31)
            write_npy(hits.astype(np.int32) if small else hits, files["hits"])


    return map_corpus_shards(shards, scan_unit, unit_args, assemble, lambda s: intact(spec.files(shard_dir, s).values()),
                             stage="clean", key=spec.key, work_dir=work_dir, cfg=cfg, checkpoint=False)


@dataclass(frozen=True)
class ShardScan:
    """One gathered shard's scan: its documents are doc ids ``start .. start + n`` (``rows``: their
    training rows in the shard, None when all of them)."""

    start: int
    n: int
    rows: np.ndarray | None
    files: dict[str, Path]

    def take(self, part: str) -> np.ndarray:
        """The ``hashes`` or ``sig`` rows of the gathered documents (``sig`` memory-mapped)."""
        arr = np.load(self.files[part], mmap_mode="r")
        return arr if self.rows is None else arr[self.rows]

    @functools.cached_property
    def _sig(self) -> np.ndarray:
        return np.load(self.files["sig"], mmap_mode="r")

    def signatures(self, local: np.ndarray) -> np.ndarray:
        """Signatures of the gathered documents at positions ``local`` (sorted)."""
        return np.asarray(self._sig[local if self.rows is None else self.rows[local]])

    def hits(self) -> np.ndarray:
        """(k, 3) int64 (doc id, set, n-gram) of the gathered documents."""
        hits = np.load(self.files["hits"]).astype(np.int64)
        if self.rows is None:
            hits[:, 0] += self.start
            return hits
        pos = np.minimum(np.searchsorted(self.rows, hits[:, 0]), max(self.rows.size - 1, 0))
        kept = self.rows[pos] == hits[:, 0] if self.rows.size else np.zeros(hits.shape[0], bool)
        hits = hits[kept]
        hits[:, 0] = self.start + pos[kept]
        return hits
