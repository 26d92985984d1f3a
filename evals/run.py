"""``evaluate``: every configured suite on one model, as tidy rows {suite, task, metric, value, n}."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl

from evals import dclm
from evals.lmeval import make_lm, max_length, metric_value, per_doc_loglikelihoods, run_task, set_offline
from evals.paloma import aggregate_bpb

SUITES = ("wikitext", "heldout", "paloma", "dclm")
ROLLING_METRICS = ("word_perplexity", "byte_perplexity", "bits_per_byte")


def _rolling_suite(lm: Any, suite: str, root: Path, *, split: str, docs_per_subdomain: int | None,
                   units: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Paloma-style suite: lm-eval rolling log-likelihood per document, aggregated per source.
    Per-document bits per byte go to ``units`` (metric ``<suite>/all/doc_bits_per_byte``)."""
    meta = {"strata_paloma_dir": str(Path(root).resolve()), "strata_split": split,
            "strata_docs_per_subdomain": docs_per_subdomain}
    res = run_task(lm, "strata_paloma", metadata=meta, log_samples=True)
    docs = per_doc_loglikelihoods(res, "strata_paloma")
    per_doc = pl.DataFrame({
        "source": [d["source"] for d, _ in docs], "subdomain": [d["subdomain"] for d, _ in docs],
        "loglikelihood": [ll for _, ll in docs], "n_bytes": [len(d["text"].encode("utf-8")) for d, _ in docs],
    })
    if units is not None:
        bpb = (-per_doc["loglikelihood"] / (per_doc["n_bytes"] * math.log(2))).to_list()
        units += [{"metric": f"{suite}/all/doc_bits_per_byte", "unit": f"{d['source']}/{d.get('id', i)}", "value": v}
                  for i, ((d, _), v) in enumerate(zip(docs, bpb))]
    rows = aggregate_bpb(per_doc, suite)
    rows += [{"suite": suite, "task": "all", "metric": m, "value": metric_value(res, "strata_paloma", m), "n": len(docs)}
             for m in ROLLING_METRICS]
    return rows


def evaluate(model: Any, tokenizer: Any, *, heldout_dir: Path | None, wikitext_path: Path | None,
             paloma_dir: Path | None, dclm_dir: Path | None, limit: int | None, dclm_limit: int | None,
             device: str, work_dir: Path, split: str = "val", batch_size: int = 8, seed: int = 0,
             units: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Evaluate ``model`` on every suite whose input is given; tidy rows, suite in ``SUITES``.

    - wikitext: lm-eval rolling log-likelihood per article of ``wikitext_path`` (first ``limit``
      articles): word_perplexity, byte_perplexity, bits_per_byte.
    - heldout / paloma: Paloma-layout directories (``<source>/<split>/*.jsonl.gz``), first
      ``limit`` documents per subdomain; bits_per_byte per subdomain, source, mean over sources,
      plus corpus-level rolling metrics (task "all").
    - dclm: the 22 Core tasks (seeded sample of ``dclm_limit`` rows each): acc, centered_acc,
      gold_bpb per task and Core (v2, and v1 when its CSV is present).

    Contexts never exceed the model's ``max_position_embeddings`` (Strata's models: the training
    ``seq_len``): rolling windows are that long and few-shot prompts are cut from the left to it.
    Per-document scores of the rolling suites are appended to ``units`` when given.
    """
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    set_offline(work_dir)
    model.to(device).eval()
    rows: list[dict[str, Any]] = []
    if wikitext_path is not None or heldout_dir is not None or paloma_dir is not None:
        lm = make_lm(model, tokenizer, device=device, batch_size=batch_size)
        if wikitext_path is not None:
            res = run_task(lm, "strata_wikitext", metadata={"strata_wikitext_path": str(Path(wikitext_path).resolve())},
                           limit=limit)
            n = len(res["samples"]["strata_wikitext"]) if "samples" in res else int(res["n-samples"]["strata_wikitext"]["effective"])
            rows += [{"suite": "wikitext", "task": "wikitext", "metric": m,
                      "value": metric_value(res, "strata_wikitext", m), "n": n} for m in ROLLING_METRICS]
        if heldout_dir is not None:
            rows += _rolling_suite(lm, "heldout", Path(heldout_dir), split=split, docs_per_subdomain=limit, units=units)
        if paloma_dir is not None:
            rows += _rolling_suite(lm, "paloma", Path(paloma_dir), split=split, docs_per_subdomain=limit, units=units)
    if dclm_dir is not None:
        rows += dclm.run_core(model, tokenizer, Path(dclm_dir), device=device, max_len=max_length(model),
                              limit=dclm_limit, seed=seed, batch_size=batch_size)
    return rows
