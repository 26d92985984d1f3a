"""Loaders and result hooks for Strata's lm-eval tasks.

Data paths come from the TaskManager metadata (``evals.lmeval.run_tasks`` writes absolute paths
there at run time), never from the current directory.
"""

from __future__ import annotations

import re
from typing import Any

import datasets

from pipeline.data.paloma import read_paloma_docs
from pipeline.data.wikitext import read_articles


def load_wikitext(strata_wikitext_path: str, **_: Any) -> datasets.DatasetDict:
    """Articles of a local WikiText raw file, one ``page`` per document (lm-eval's schema)."""
    pages = read_articles(strata_wikitext_path)
    return datasets.DatasetDict({"test": datasets.Dataset.from_dict({"page": pages})})


def load_paloma(strata_paloma_dir: str, strata_split: str = "val", strata_docs_per_subdomain: int | None = None,
                **_: Any) -> datasets.DatasetDict:
    """Documents of a Paloma-layout directory (``<source>/<split>/*.jsonl.gz``)."""
    df = read_paloma_docs(strata_paloma_dir, split=strata_split, docs_per_subdomain=strata_docs_per_subdomain)
    rows = df.select("text", "id", "source", "subdomain").to_dict(as_series=False)
    return datasets.DatasetDict({"test": datasets.Dataset.from_dict(rows)})


def doc_text(doc: dict[str, Any]) -> str:
    """The document's raw text, unchanged."""
    return doc["text"]


def paloma_results(doc: dict[str, Any], results: list[float]) -> dict[str, tuple[float, int]]:
    """Per-document log-likelihood with word and UTF-8 byte counts of the scored text."""
    (loglikelihood,) = results
    text = doc["text"]
    n_bytes = len(text.encode("utf-8"))
    return {
        "word_perplexity": (loglikelihood, len(re.split(r"\s+", text))),
        "byte_perplexity": (loglikelihood, n_bytes),
        "bits_per_byte": (loglikelihood, n_bytes),
    }
