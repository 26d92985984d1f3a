"""``evaluate``: every eval suite whose input is given, on one model, as tidy rows {suite, task, metric, value, n}.

The suites are the registry of ``evals/suites/`` (``wikitext``, ``heldout``, ``paloma``, ``dclm``
and any plugin's); ``SuiteRun`` is what each suite's ``run`` gets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from evals.lmeval import make_lm, metric_value, per_doc_loglikelihoods, run_task, set_offline
from evals.paloma import aggregate_bpb
from evals.suites import REGISTRY, ordered

ROLLING_METRICS = ("word_perplexity", "byte_perplexity", "bits_per_byte")


@dataclass
class SuiteRun:
    """One suite's run: the model, its input and the evaluation settings."""

    model: Any
    tokenizer: Any
    input: Path
    limit: int | None  # documents / articles per rolling task (first N)
    device: str
    split: str
    batch_size: int
    seed: int
    units: list[dict[str, Any]] | None  # per-document scores go here when given
    options: dict[str, Any] = field(default_factory=dict)  # the suite's config values (e.g. dclm_limit)
    shared: dict[str, Any] = field(default_factory=dict)  # objects the suites of one evaluate() share

    @property
    def lm(self) -> Any:
        """The lm-eval model wrapper (one per ``evaluate`` call)."""
        if "lm" not in self.shared:
            self.shared["lm"] = make_lm(self.model, self.tokenizer, device=self.device, batch_size=self.batch_size)
        return self.shared["lm"]


def rolling_suite(ctx: SuiteRun, suite: str) -> list[dict[str, Any]]:
    """Paloma-style suite: lm-eval rolling log-likelihood per document of a Paloma-layout
    directory (first ``ctx.limit`` documents per subdomain), aggregated per source. Per-document
    bits per byte go to ``ctx.units`` (metric ``<suite>/all/doc_bits_per_byte``)."""
    meta = {"strata_paloma_dir": str(Path(ctx.input).resolve()), "strata_split": ctx.split,
            "strata_docs_per_subdomain": ctx.limit}
    res = run_task(ctx.lm, "strata_paloma", metadata=meta, log_samples=True)
    docs = per_doc_loglikelihoods(res, "strata_paloma")
    per_doc = pl.DataFrame({
        "source": [d["source"] for d, _ in docs], "subdomain": [d["subdomain"] for d, _ in docs],
        "loglikelihood": [ll for _, ll in docs], "n_bytes": [len(d["text"].encode("utf-8")) for d, _ in docs],
    })
    if ctx.units is not None:
        bpb = (-per_doc["loglikelihood"] / (per_doc["n_bytes"] * math.log(2))).to_list()
        ctx.units += [{"metric": f"{suite}/all/doc_bits_per_byte", "unit": f"{d['source']}/{d.get('id', i)}", "value": v}
                      for i, ((d, _), v) in enumerate(zip(docs, bpb))]
    rows = aggregate_bpb(per_doc, suite)
    rows += [{"suite": suite, "task": "all", "metric": m, "value": metric_value(res, "strata_paloma", m), "n": len(docs)}
             for m in ROLLING_METRICS]
    return rows


def evaluate(model: Any, tokenizer: Any, inputs: dict[str, Path | None], *, limit: int | None, device: str, work_dir: Path,
             split: str = "val", batch_size: int = 8, seed: int = 0, units: list[dict[str, Any]] | None = None,
             options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Evaluate ``model`` on every suite ``inputs`` gives an input (suite name -> file or folder;
    None = off), in the suites' order; tidy rows.

    - wikitext: lm-eval rolling log-likelihood per article (first ``limit`` articles):
      word_perplexity, byte_perplexity, bits_per_byte.
    - heldout / paloma: Paloma-layout directories (``<source>/<split>/*.jsonl.gz``), first
      ``limit`` documents per subdomain; bits_per_byte per subdomain, source, mean over sources,
      plus corpus-level rolling metrics (task "all").
    - dclm: the 22 Core tasks (seeded sample of ``options["dclm_limit"]`` rows each): acc,
      centered_acc, gold_bpb per task and Core (v2, and v1 when its CSV is present).

    ``options`` holds the suites' config values. Contexts never exceed the model's
    ``max_position_embeddings`` (Strata's models: the training ``seq_len``): rolling windows are
    that long and few-shot prompts are cut from the left to it. Per-document scores of the rolling
    suites are appended to ``units`` when given.
    """
    for name in inputs:
        REGISTRY.get(name)
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    set_offline(work_dir)
    model.to(device).eval()
    rows: list[dict[str, Any]] = []
    shared: dict[str, Any] = {}
    for suite in ordered():
        path = inputs.get(suite.name)
        if path is None:
            continue
        ctx = SuiteRun(model, tokenizer, Path(path), limit, device, split, batch_size, seed, units, dict(options or {}), shared)
        rows += suite.run(ctx)
    return rows
