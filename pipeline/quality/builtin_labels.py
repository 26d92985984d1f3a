"""The built-in corpus's quality labels: what ``fasttext_trained`` learns from in ``strata demo`` and in
``benchmarks/bench_quality_ablation.py``, so docs/quality.md's ablation is about the demo's scorer.

DCLM's recipe needs curated positives and a pool of crawled negatives; the built-in corpus
(:mod:`pipeline.data.builtin_corpus`, no download) stands in for both:

- positives: the corpus's ``docs`` source (Python's reference documentation and module docstrings,
  edited prose) among its documents, the first ``corpus_docs`` (``corpus.builtin_max_docs``)
  built-in documents;
- negatives: a seeded sample (``random.Random(seed)``) of ``negatives`` built-in documents *beyond*
  those (more standard-library code, ``/usr/share/doc`` files, man pages: none in the corpus).

The positives are in the corpus, so the classifier scores them high by construction: its score
means "reads like Python's reference documentation". Each file is JSONL, one ``{"text": ...}`` a
line (``quality.positives`` / ``quality.negatives``), written atomically and only when its bytes
change, so a rerun keeps the trained model (keyed by the files' bytes) and its freshness."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.data.builtin_corpus import builtin_documents
from pipeline.storage.atomic import write_text

CORPUS_DOCS = 3000  # corpus.builtin_max_docs's default: the corpus the ablation ran on
NEGATIVES = 400  # negatives sampled beyond the corpus
POSITIVE_SOURCE = "docs"
# the scorer's settings besides the two files: 20 epochs at lr 0.5 and 131,072 bigram buckets, a model of 38 MB in every
# demo root where fastText's default 2,000,000 makes 494 MB, with the same held-out AUC on these labels; the rest
# QualityConfig's defaults
TRAINING = {"scorer": "fasttext_trained", "epochs": 20, "lr": 0.5, "bucket": 131_072}
FILES = ("positives.jsonl", "negatives.jsonl")


@dataclass(frozen=True)
class BuiltinLabels:
    """The two classes' documents, each ``(id, text, source, subdomain)`` as the built-in corpus gives them."""

    positives: list[tuple[str, str, str, str]]
    negatives: list[tuple[str, str, str, str]]

    def sources(self) -> dict[str, dict[str, int]]:
        """Documents per source of each class, sources in order of first appearance."""
        out: dict[str, dict[str, int]] = {"positives": {}, "negatives": {}}
        for name, docs in (("positives", self.positives), ("negatives", self.negatives)):
            for d in docs:
                out[name][d[2]] = out[name].get(d[2], 0) + 1
        return out


def builtin_labels(corpus_docs: int = CORPUS_DOCS, negatives: int = NEGATIVES, seed: int = 0) -> BuiltinLabels:
    """Positives: the ``docs`` documents among the first ``corpus_docs`` built-in documents; negatives:
    ``negatives`` of the next ``corpus_docs`` (all of them when fewer), sampled with ``random.Random(seed)``."""
    docs = builtin_documents(2 * corpus_docs)
    corpus, beyond = docs[:corpus_docs], docs[corpus_docs:]
    pos = [d for d in corpus if d[2] == POSITIVE_SOURCE]
    neg = random.Random(seed).sample(beyond, min(negatives, len(beyond)))
    return BuiltinLabels(pos, neg)


def jsonl(docs: list[tuple[str, str, str, str]]) -> str:
    """One ``{"text": ...}`` line a document (what ``quality.positives`` / ``negatives`` read)."""
    return "".join(json.dumps({"text": d[1]}) + "\n" for d in docs)


def write_builtin_labels(folder: Path, corpus_docs: int = CORPUS_DOCS, negatives: int = NEGATIVES) -> tuple[Path, Path, BuiltinLabels]:
    """``folder/positives.jsonl`` and ``folder/negatives.jsonl`` of :func:`builtin_labels`, each written
    (atomically, its digest recorded) only when absent or different; returns their paths and the labels."""
    labels = builtin_labels(corpus_docs, negatives)
    paths = []
    for name, docs in zip(FILES, (labels.positives, labels.negatives)):
        path, text = Path(folder) / name, jsonl(docs)
        if not (path.is_file() and path.read_bytes() == text.encode("utf-8")):
            write_text(text, path)
        paths.append(path)
    return paths[0], paths[1], labels


def builtin_quality(folder: Path, corpus_docs: int = CORPUS_DOCS) -> dict[str, Any]:
    """The ``quality:`` mapping of the built-in scorer, its label files written under ``folder``
    (:func:`write_builtin_labels`): enabled, no filter, so the packing and the orderings do not change."""
    pos, neg, _ = write_builtin_labels(folder, corpus_docs)
    return {"enabled": True, **TRAINING, "positives": str(pos), "negatives": str(neg)}
