"""evaluations and ablation_report: lm-eval suites per trained model, then the strategy x metric table."""


from pathlib import Path

import dagster as dg
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.common import Recorder, StrataSettings, run_key
from assets.orderings import STRATEGY_PARTITIONS
from assets.training import RUN_PARTITIONS
from pipeline.io import write_parquet, write_text
from pipeline.report import ablation_table, render_report
from pipeline.warehouse import replace_rows


@dg.asset(group_name="ablation", deps=["training_runs"], partitions_def=RUN_PARTITIONS, code_version="2", kinds={"parquet"})
def evaluations(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Evaluate the partition's model: lm-eval rolling log-likelihood (word/byte perplexity, bits
    per byte) on the held-out split (per source, Paloma-style), and when configured WikiText-2,
    a real Paloma directory and DCLM-core (llm-foundry scoring, centered accuracy, Core, gold
    bits-per-byte). Rows go to ``evals/<strategy>.parquet`` and DuckDB table ``eval_results``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evals.run import evaluate

    strategy, seed = run_key(context)
    rec = Recorder(context, duckdb, {"training_runs": context.partition_key})
    cfg, layout = settings.config(), settings.layout()
    model_dir = layout.run_dir(strategy, seed) / "model"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).to(device).eval()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    rows = evaluate(
        model, tok,
        heldout_dir=layout.heldout if any(layout.heldout.rglob("*.jsonl.gz")) else None,
        wikitext_path=Path(cfg.wikitext_path) if cfg.wikitext_path else None,
        paloma_dir=Path(cfg.paloma_dir) if cfg.paloma_dir else None,
        dclm_dir=Path(cfg.dclm_dir) if cfg.dclm_dir else None,
        limit=cfg.eval_limit, dclm_limit=cfg.dclm_limit or None, device=device, work_dir=layout.root / "lm_eval",
        seed=cfg.seed,
    )
    df = pl.DataFrame(rows).with_columns(strategy=pl.lit(strategy), seed=pl.lit(seed))
    out = write_parquet(df, layout.eval_file(strategy, seed))
    with duckdb.get_connection() as con:
        replace_rows(con, "eval_results", df, {"strategy": strategy, "seed": seed})
    table = df.select("suite", "task", "metric", "value").to_pandas().to_markdown(index=False)
    return rec.finish([out], {"results": df.height}, {"strategy": strategy, "seed": seed, "limit": cfg.eval_limit},
                      {"results": dg.MetadataValue.md(table)})


@dg.asset(group_name="ablation", deps=["evaluations", "training_runs"], code_version="1", kinds={"duckdb"})
def ablation_report(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Strategy x metric table (final train loss and every evaluation metric) in DuckDB and ``report.md``."""
    rec = Recorder(context, duckdb, {"evaluations": "*", "training_runs": "*"})
    layout = settings.layout()
    with duckdb.get_connection() as con:
        train_log = con.sql("SELECT * FROM train_log").pl()
        evals = con.sql("SELECT * FROM eval_results").pl()
    strategies = [s for s in STRATEGY_PARTITIONS.get_partition_keys() if s in set(train_log["strategy"])]
    table = ablation_table(train_log.filter(pl.col("strategy").is_in(strategies)), evals.filter(pl.col("strategy").is_in(strategies)))
    with duckdb.get_connection() as con:
        replace_rows(con, "ablation", table, {})
    md = render_report(table, strategies=strategies)
    out = write_text(md, layout.report)
    return rec.finish([out], {"strategies": len(strategies), "rows": table.height}, {"strategies": strategies},
                      {"report": dg.MetadataValue.md(md)})
