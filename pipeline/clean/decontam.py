"""Benchmark decontamination: training documents that share word n-grams (13 by default, as
lm-eval's janitor and the GPT-3 paper count them) with an evaluation set. Each set's n-grams are
hashed once into a sorted array; training documents stream past it in batches.

An n-gram found in many units of one set (documents, DCLM-core rows, WikiText articles) is that
set's boilerplate — a license header, a task template — not a passage a model could have
memorized. An n-gram in more than ``decontam.common_share`` of a set's units and in more than
``COMMON_MIN`` of them never flags.

The training side cannot tell boilerplate from a leak on its own: a benchmark passage copied into
many training documents is the worst contamination, not boilerplate, and is found in as many
documents as a shared footer. What tells them apart is the evaluation side: a leaked passage sits
in one evaluation unit, a footer in several (the man pages of the held-out split that share a
license footer, too few of them for the rule above). So an n-gram in at least ``SHARED_MIN``
units of its set *and* in more than ``common_share`` of the training documents (and more than
``COMMON_MIN`` of them) is boilerplate too; an n-gram of one evaluation unit always flags, however
many training documents hold it (:func:`common_grams`). Every n-gram left out is reported with
the documents holding it (the ``clean`` stage). ``common_share: 1.0`` counts every n-gram, the
plain 13-gram overlap."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from pipeline.clean.ngrams import LONG_CHARS, long_text_ngrams, text_ngrams
from pipeline.data.dclm_tasks import TASK_FILES, core_tasks, read_jsonl, task_file
from pipeline.data.paloma import read_paloma_docs
from pipeline.data.wikitext import read_articles
from pipeline.storage.atomic import atomic_dir, is_sidecar

COMMON_MIN = 3  # an n-gram in at most this many units of a set is always kept, however small the set
SHARED_MIN = 2  # units of its set an n-gram needs before many training documents make it boilerplate (a leak sits in one)


def _batched(texts: Iterable, size: int) -> Iterator[list]:
    batch: list = []
    for t in texts:
        batch.append(t)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


@dataclass(frozen=True)
class EvalNgrams:
    """The hashed n-grams of each evaluation set (sorted, unique), with the number of the set's units
    holding each one (what :meth:`boilerplate` reads) and the set's number of units."""

    names: tuple[str, ...]
    hashes: tuple[np.ndarray, ...]
    n: int
    common: tuple[int, ...] = ()  # n-grams left out of each set as its boilerplate
    units_with: tuple[np.ndarray, ...] = ()  # per set, per n-gram: the units holding it
    n_units: tuple[int, ...] = ()

    @classmethod
    def build(cls, sets: dict[str, Callable[[], Iterable[str | Sequence[str]]]], n: int, batch: int = 4096,
              common_share: float = 1.0) -> "EvalNgrams":
        """The n-grams of every unit of each set (``name -> a function giving its units``: a unit is
        a text or the list of texts one document or row shows a model); a text shorter than ``n``
        words adds none. An n-gram in more than ``common_share`` of a set's units and more than
        :data:`COMMON_MIN` of them is left out (the set's boilerplate); ``common`` counts them."""
        names, hashes, common, units_of, sizes = [], [], [], [], []
        for name, units in sets.items():
            per_unit, n_units = [], 0
            for b in _batched(units(), batch):
                texts = [t for u in b for t in ([u] if isinstance(u, str) else u)]
                unit_of = np.repeat(np.arange(len(b)), [1 if isinstance(u, str) else len(u) for u in b])
                flat, offsets = text_ngrams(texts, n)
                per_unit.append(_unique_per_unit(flat, unit_of[np.repeat(np.arange(len(texts)), np.diff(offsets))]))
                n_units += len(b)
            grams, units_with = np.unique(np.concatenate(per_unit), return_counts=True) if per_unit else (np.zeros(0, np.uint64),) * 2
            keep = ~over_share(units_with, n_units, common_share)
            names.append(name)
            hashes.append(grams[keep].astype(np.uint64))
            units_of.append(units_with[keep].astype(np.int64))
            sizes.append(n_units)
            common.append(int((~keep).sum()))
        return cls(tuple(names), tuple(hashes), int(n), tuple(common), tuple(units_of), tuple(sizes))

    def boilerplate(self, share: float) -> list[np.ndarray]:
        """Per set, boolean per n-gram: in more than ``share`` of the set's units and more than
        :data:`COMMON_MIN` of them (none when ``share`` is 1)."""
        return [over_share(u, k, share) for u, k in zip(self.units_with, self.n_units)]

    def save(self, path: Path) -> Path:
        """Write the n-grams to ``path`` (a folder: one ``.npy`` a set and array, and ``sets.json``), atomically."""
        with atomic_dir(path) as tmp:
            for j in range(len(self.names)):
                np.save(tmp / f"{j}.hashes.npy", self.hashes[j], allow_pickle=False)
                np.save(tmp / f"{j}.units.npy", self.units_with[j], allow_pickle=False)
            (tmp / "sets.json").write_text(json.dumps({"names": self.names, "n": self.n, "common": self.common,
                                                       "n_units": self.n_units}), encoding="utf-8")
        return Path(path)

    @classmethod
    def load(cls, path: Path) -> "EvalNgrams":
        """The n-grams :meth:`save` wrote to ``path`` (the arrays memory-mapped)."""
        meta = json.loads((Path(path) / "sets.json").read_text(encoding="utf-8"))
        k = range(len(meta["names"]))
        return cls(tuple(meta["names"]), tuple(np.load(Path(path) / f"{j}.hashes.npy", mmap_mode="r") for j in k), int(meta["n"]),
                   tuple(meta["common"]), tuple(np.load(Path(path) / f"{j}.units.npy", mmap_mode="r") for j in k),
                   tuple(meta["n_units"]))

    def hits(self, texts: Sequence[str], limit: int | None = None) -> list[np.ndarray]:
        """Per set, the (k, 2) int64 pairs (text index, index of the n-gram in that set's array) of
        the set's n-grams each text holds, each pair once. A text longer than ``limit`` characters
        (:data:`LONG_CHARS <pipeline.clean.ngrams.LONG_CHARS>`) is looked up piece by piece
        (:func:`pipeline.clean.ngrams.long_text_ngrams`), in memory that does not grow with it."""
        limit = int(limit or LONG_CHARS)
        whole = np.array([i for i, t in enumerate(texts) if len(t) <= limit], np.int64)
        flat, offsets = text_ngrams([texts[i] for i in whole], self.n)
        text_of = whole[np.repeat(np.arange(whole.size), np.diff(offsets))]
        found = [[self._pairs(h, flat, text_of)] for h in self.hashes]
        for i in sorted(set(range(len(texts))) - set(whole.tolist())):
            parts: list[list[np.ndarray]] = [[] for _ in self.hashes]
            for grams in long_text_ngrams(texts[i], self.n, limit=limit):
                for j, h in enumerate(self.hashes):
                    parts[j].append(np.unique(self._pairs(h, grams, np.zeros(0, np.int64))[:, 1]))
            for j, p in enumerate(parts):
                at = np.unique(np.concatenate(p)) if p else np.zeros(0, np.int64)
                found[j].append(np.column_stack([np.full(at.size, i, np.int64), at]))
        out = []
        for f in found:
            pairs = np.concatenate(f).astype(np.int64)
            out.append(pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))] if len(f) > 1 else pairs)
        return out

    @staticmethod
    def _pairs(h: np.ndarray, flat: np.ndarray, text_of: np.ndarray) -> np.ndarray:
        """(text, n-gram index) of the n-grams ``flat`` (of texts ``text_of``; empty: all text 0)
        found in the set's sorted ``h``, each pair once."""
        if not (h.size and flat.size):
            return np.zeros((0, 2), np.int64)
        at = np.minimum(np.searchsorted(h, flat), h.size - 1)
        hit = h[at] == flat
        if not hit.any():
            return np.zeros((0, 2), np.int64)
        rows = text_of[hit] if text_of.size else np.zeros(int(hit.sum()), np.int64)
        return np.unique(np.stack([rows, at[hit]], axis=1), axis=0).astype(np.int64)

    def overlaps(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), sets) int64: each text's n-grams found in each set (positions, so a repeated
        n-gram counts each time)."""
        flat, offsets = text_ngrams(texts, self.n)
        out = np.zeros((len(texts), len(self.names)), np.int64)
        if not flat.size:
            return out
        text_of = np.repeat(np.arange(len(texts)), np.diff(offsets))
        for j, h in enumerate(self.hashes):
            if not h.size:
                continue
            at = np.minimum(np.searchsorted(h, flat), h.size - 1)
            hit = h[at] == flat
            out[:, j] = np.bincount(text_of[hit], minlength=len(texts))
        return out


def over_share(units_with: np.ndarray, n_units: int, share: float) -> np.ndarray:
    """Boolean per n-gram: found in more than ``share`` of ``n_units`` units and in more than
    :data:`COMMON_MIN` of them (``units_with``: the units holding each); none when ``share`` is 1."""
    if share >= 1.0:
        return np.zeros(np.asarray(units_with).size, bool)
    return np.asarray(units_with) > max(COMMON_MIN, int(share * n_units))


def common_grams(pairs: np.ndarray, n_grams: int, n_docs: int, share: float, units_with: np.ndarray) -> np.ndarray:
    """Boolean per n-gram of one set: found in more than ``share`` of the ``n_docs`` training
    documents and in more than :data:`COMMON_MIN` of them (``pairs``: (document, n-gram) hits, each
    once), and in at least :data:`SHARED_MIN` of the set's units (``units_with``: the units holding
    each n-gram); none when ``share`` is 1."""
    return trained_boilerplate(np.bincount(pairs[:, 1], minlength=n_grams), n_docs, share, units_with)


def trained_boilerplate(docs_with: np.ndarray, n_docs: int, share: float, units_with: np.ndarray) -> np.ndarray:
    """Boolean per n-gram of one set: in more than ``share`` of the ``n_docs`` training documents
    and more than :data:`COMMON_MIN` of them (``docs_with``: the documents holding each), and in
    :data:`SHARED_MIN` or more of the set's units (``units_with``). A passage of one evaluation unit
    is never boilerplate, however many training documents copy it: that is the leak to find."""
    return over_share(docs_with, n_docs, share) & (np.asarray(units_with) >= SHARED_MIN)


def _unique_per_unit(grams: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """``grams`` with each (unit, gram) pair once: what a count of units per n-gram needs."""
    order = np.lexsort((grams, unit))
    g, u = grams[order], unit[order]
    first = np.ones(g.size, bool)
    first[1:] = (g[1:] != g[:-1]) | (u[1:] != u[:-1])
    return g[first]


def _dclm_units(dclm_dir: str) -> Iterator[list[str]]:
    """The texts of each DCLM-core row together (:func:`_dclm_texts`, row by row)."""
    files = dict.fromkeys(task_file(Path(dclm_dir), t) for t in core_tasks(Path(dclm_dir)) if t in TASK_FILES)
    for path in files:
        for row in read_jsonl(path):
            yield list(_row_texts(row))


def _dclm_texts(dclm_dir: str) -> Iterator[str]:
    """Every text of the DCLM-core tasks' rows (:func:`_row_texts`)."""
    for unit in _dclm_units(dclm_dir):
        yield from unit


def _row_texts(row: dict) -> Iterator[str]:
    """Each string field, each list element, and each query or context joined with each of its
    choices or continuation (what a model is shown)."""
    head = str(row.get("query") or row.get("context") or "")
    tail = row.get("continuation")
    for value in row.values():
        if isinstance(value, str):
            yield value
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, str):
                    yield item
                    yield f"{head} {item}" if head else f"{item} {tail or ''}"
    if head and isinstance(tail, str):
        yield f"{head} {tail}"


def _paloma_texts(root: str | Path) -> Iterator[str]:
    """Every document of a Paloma-layout directory's val and test splits."""
    for split in ("val", "test"):
        if any(Path(root).glob(f"*/{split}/*.jsonl*")):
            yield from read_paloma_docs(root, split)["text"].to_list()


def _wikitext_texts(path: str) -> Iterator[str]:
    yield from read_articles(path)


_READERS: dict[str, Callable[[Path], Iterable]] = {
    "wikitext": lambda p: _wikitext_texts(str(p)), "paloma": _paloma_texts, "dclm": lambda p: _dclm_units(str(p)),
    "heldout": _paloma_texts,
}


def eval_sources(cfg, heldout_dir: Path | None) -> dict[str, Path]:
    """The evaluation sets ``cfg`` names (``wikitext_path``, ``paloma_dir``, ``dclm_dir``) and, with
    ``decontam.heldout``, the corpus's held-out split (``heldout_dir``, Paloma layout): ``name -> its
    file or folder``."""
    out: dict[str, Path] = {}
    if cfg.wikitext_path:
        out["wikitext"] = Path(cfg.wikitext_path)
    if cfg.paloma_dir:
        out["paloma"] = Path(cfg.paloma_dir)
    if cfg.dclm_dir:
        out["dclm"] = Path(cfg.dclm_dir)
    if cfg.decontam.heldout and heldout_dir is not None and any(Path(heldout_dir).glob("*/val/*.jsonl*")):
        out["heldout"] = Path(heldout_dir)
    return out


def eval_sets(cfg, heldout_dir: Path | None) -> dict[str, Callable[[], Iterable[str]]]:
    """:func:`eval_sources` as ``name -> a function giving its units``."""
    return {name: (lambda name=name, path=path: _READERS[name](path)) for name, path in eval_sources(cfg, heldout_dir).items()}


def sources_fingerprint(sources: dict[str, Path]) -> str:
    """A hash of the sets' names and every byte of their files (folders: every file under them,
    by relative path): equal fingerprints, equal n-grams."""
    h = hashlib.sha256()
    for name, path in sorted(sources.items()):
        files = sorted(f for f in path.rglob("*") if f.is_file() and not is_sidecar(f)) if path.is_dir() else [path]
        h.update(f"{name}\0".encode())
        for f in files:
            h.update(f"{f.relative_to(path) if path.is_dir() else f.name}\0".encode())
            with open(f, "rb") as fh:
                for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()
