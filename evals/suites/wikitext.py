"""``wikitext``: lm-eval rolling log-likelihood per article of WikiText-2 (``wikitext_path``)."""

from __future__ import annotations

from pathlib import Path

from evals.suites import EvalSuite


def run(ctx) -> list[dict]:
    from evals.lmeval import metric_value, run_task
    from evals.run import ROLLING_METRICS

    res = run_task(ctx.lm, "strata_wikitext", metadata={"strata_wikitext_path": str(Path(ctx.input).resolve())}, limit=ctx.limit)
    n = len(res["samples"]["strata_wikitext"]) if "samples" in res else int(res["n-samples"]["strata_wikitext"]["effective"])
    return [{"suite": "wikitext", "task": "wikitext", "metric": m, "value": metric_value(res, "strata_wikitext", m), "n": n}
            for m in ROLLING_METRICS]


def find_in(folder: Path) -> dict[str, str]:
    path = folder / "wikitext" / "wiki.test.raw"
    return {"wikitext_path": str(path)} if path.is_file() else {}


SPECS = (
    EvalSuite("wikitext", "WikiText-2 raw test articles (first eval_limit): word/byte perplexity, bits per byte", run,
              path_key="wikitext_path", reads=("wikitext_path",), find_in=find_in, order=10),
)
