"""Benchmark decontamination: training documents that share word n-grams (13 by default, as
lm-eval's janitor and the GPT-3 paper count them) with an evaluation set. Each set's n-grams are
hashed once into a sorted array; training documents stream past it in batches."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from pipeline.clean.ngrams import text_ngrams


def _batched(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for t in texts:
        batch.append(t)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


@dataclass(frozen=True)
class EvalNgrams:
    """The hashed n-grams of each evaluation set (sorted, unique)."""

    names: tuple[str, ...]
    hashes: tuple[np.ndarray, ...]
    n: int

    @classmethod
    def build(cls, sets: dict[str, Callable[[], Iterable[str]]], n: int, batch: int = 4096) -> "EvalNgrams":
        """The n-grams of every text of each set (``name -> a function giving its texts``); a text
        shorter than ``n`` words adds none."""
        names, hashes = [], []
        for name, texts in sets.items():
            parts = [text_ngrams(b, n)[0] for b in _batched(texts(), batch)]
            names.append(name)
            hashes.append(np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.uint64))
        return cls(tuple(names), tuple(hashes), int(n))

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


def _dclm_texts(dclm_dir: str) -> Iterator[str]:
    """Every text of the DCLM-core tasks' rows: each string field, each list element, and each
    query or context joined with each of its choices or continuation (what a model is shown)."""
    from evals.dclm import TASK_FILES, core_tasks, read_jsonl, task_file

    files = dict.fromkeys(task_file(Path(dclm_dir), t) for t in core_tasks(Path(dclm_dir)) if t in TASK_FILES)
    for path in files:
        for row in read_jsonl(path):
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
    from evals.paloma import read_paloma_docs

    for split in ("val", "test"):
        if any(Path(root).glob(f"*/{split}/*.jsonl*")):
            yield from read_paloma_docs(root, split)["text"].to_list()


def _wikitext_texts(path: str) -> Iterator[str]:
    from evals.wikitext import read_articles

    yield from read_articles(path)


def eval_sets(cfg, heldout_dir: Path | None) -> dict[str, Callable[[], Iterable[str]]]:
    """The evaluation sets ``cfg`` names (``wikitext_path``, ``paloma_dir``, ``dclm_dir``) and, with
    ``decontam.heldout``, the corpus's held-out split (``heldout_dir``, Paloma layout), as
    ``name -> a function giving its texts``."""
    sets: dict[str, Callable[[], Iterable[str]]] = {}
    if cfg.wikitext_path:
        sets["wikitext"] = lambda: _wikitext_texts(cfg.wikitext_path)
    if cfg.paloma_dir:
        sets["paloma"] = lambda: _paloma_texts(cfg.paloma_dir)
    if cfg.dclm_dir:
        sets["dclm"] = lambda: _dclm_texts(cfg.dclm_dir)
    if cfg.decontam.heldout and heldout_dir is not None and any(heldout_dir.glob("*/val/*.jsonl*")):
        sets["heldout"] = lambda: _paloma_texts(heldout_dir)
    return sets
