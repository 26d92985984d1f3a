"""The evaluations stage: a trained model scored on every eval suite whose input is there
(``evaluations``). It lives in evals/, beside the suites it runs: evals/ depends on pipeline/, never
the other way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import polars as pl

from evals.run import evaluate
from evals.suites import ordered, reads
from pipeline.devices import device
from pipeline.errors import StrataInputError
from pipeline.render.markdown import frame_table
from pipeline.stage import Connect, Markdown, StageParams, StageResult, setting
from pipeline.storage.atomic import write_parquet
from pipeline.storage.warehouse import replace_rows


@dataclass(frozen=True)
class EvaluateParams(StageParams):
    """The evaluations' settings (``evaluations``): the limit, the seed and the values of the keys the
    eval suites read (``evals/suites/``, each suite's ``reads``: they join the asset's parameters there)."""

    eval_limit: int = setting()
    seed: int = setting()
    suites: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: Any) -> "EvaluateParams":
        return cls(eval_limit=cfg.eval_limit, seed=cfg.seed, suites=cfg.subset(reads()))


def evaluate_run(layout, params: EvaluateParams, strategy: str, seed: int, connect: Connect) -> StageResult:
    """Evaluate the model of ``strategy`` x ``seed`` on every eval suite whose input is there
    (``evals/suites/``): rows to ``evals/<strategy>.parquet`` (DuckDB ``eval_results``), the
    per-document values beside it (``.units.parquet``, DuckDB ``eval_units``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    suites = ordered()
    settings = SimpleNamespace(**params.suites)  # each suite's input is a key it reads (path_key)
    inputs = {s.name: s.input(settings, layout) for s in suites}
    if not any(inputs.values()):  # a launch from the UI, which check_heldout (strata run) did not see
        keys = [s.path_key for s in suites if s.path_key]
        raise StrataInputError(f"no eval suite has an input: the held-out split is empty (heldout_fraction 0, or no held-out "
                               f"document) and none of {', '.join(keys)} is set", path=layout.heldout,
                               fix=f"set heldout_fraction > 0 (e.g. 0.02) or one of {', '.join(keys)}, or leave evaluations out "
                                   "(e.g. strata run --select '*orderings')")
    model_dir = layout.run_dir(strategy, seed) / "model"
    dev = device()
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).to(dev).eval()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    units: list[dict] = []
    rows = evaluate(model, tok, inputs, limit=params.eval_limit, device=dev,
                    work_dir=layout.root / "lm_eval", seed=params.seed, units=units,
                    options={k: params.suites[k] for k in sorted({k for s in suites for k in s.reads})})
    df = pl.DataFrame(rows).with_columns(strategy=pl.lit(strategy), seed=pl.lit(seed))
    out = write_parquet(df, layout.eval_file(strategy, seed))
    per_doc = pl.DataFrame(units, schema={"metric": pl.String, "unit": pl.String, "value": pl.Float64})
    per_doc = per_doc.with_columns(strategy=pl.lit(strategy), seed=pl.lit(seed))
    out_units = write_parquet(per_doc, layout.eval_file(strategy, seed).with_suffix(".units.parquet"))
    with connect() as con:
        replace_rows(con, "eval_results", df, {"strategy": strategy, "seed": seed})
        if per_doc.height:
            replace_rows(con, "eval_units", per_doc, {"strategy": strategy, "seed": seed})
    return StageResult(outputs=[out, out_units], rows={"results": df.height, "units": per_doc.height},
                       parameters={"strategy": strategy, "seed": seed, "limit": params.eval_limit},
                       facts={"results": Markdown(frame_table(df.select("suite", "task", "metric", "value")))})
