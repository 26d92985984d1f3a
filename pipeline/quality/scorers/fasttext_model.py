"""``fasttext``: a fastText classifier file in DCLM's format (``fasttext.train_supervised``'s
``.bin``); a document's score is the probability of the positive label (``quality.label``,
default ``__label__hq``: DCLM's ``openhermes_reddit_eli5_vs_rw_v2_bigram_200k_train.bin`` labels
its positives ``__label__hq`` and Common Crawl ``__label__cc``). The text is one line, its line
breaks made spaces, as DCLM's ``fasttext_classify`` feeds it."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from pipeline.errors import StrataInputError
from pipeline.heavy import lazy
from pipeline.quality.scorers import Scorer

fasttext = lazy("fasttext")

DEFAULT_LABEL = "__label__hq"


@functools.lru_cache(maxsize=2)
def load(path: str):
    """The fastText model at ``path`` (once per process), or exit 2 naming it: not a fastText file,
    or not a classifier (an unsupervised word-vector model has no labels to score)."""
    try:
        model = fasttext.load_model(path)
    except (ValueError, RuntimeError, MemoryError) as exc:
        raise StrataInputError(f"not a fastText model file ({exc})", path=path,
                               fix="set quality.path to a classifier saved by fasttext's save_model (a .bin, e.g. DCLM's)") from None
    if str(model.f.getArgs().model).rpartition(".")[2] != "supervised":
        raise StrataInputError("a fastText model without labels (a word-vector model, not a classifier)", path=path,
                               fix="set quality.path to a supervised classifier (fasttext.train_supervised)")
    return model


def positive_label(model, path: str, label: str) -> str:
    labels = model.get_labels()
    want = label or DEFAULT_LABEL
    if want not in labels:
        raise StrataInputError(f"the classifier has no label {want!r} (its labels: {', '.join(labels)})", path=path,
                               fix="set quality.label to the label of the positive (high-quality) class")
    return want


def one_line(text: str) -> str:
    return text.replace("\n", " ")


def probabilities(model, texts: list[str], label: str) -> np.ndarray:
    """The probability of ``label`` for each text (every label's probability asked: k = -1; a label
    fastText leaves out scores 0). The per-document work around ``predict`` is one ``str.replace``
    and one list lookup: benchmarks/bench_quality.py measures it against ``predict`` alone."""
    labels, probs = model.predict([t.replace("\n", " ") for t in texts], k=-1)
    return np.fromiter((ps[ls.index(label)] if label in ls else 0.0 for ls, ps in zip(labels, probs)), np.float64, len(texts))


class FastTextFile(Scorer):
    name = "fasttext"
    description = "a fastText classifier file (DCLM's format): the positive label's probability"
    expects = "a fastText classifier .bin (e.g. DCLM's openhermes_reddit_eli5_vs_rw_v2_bigram_200k_train.bin)"

    def check(self, model: str, options: dict[str, Any]) -> None:
        positive_label(load(model), model, options["label"])

    def score(self, model: str, options: dict[str, Any], texts: list[str]) -> np.ndarray:
        m = load(model)
        return probabilities(m, texts, positive_label(m, model, options["label"]))


SPECS = (FastTextFile(),)
