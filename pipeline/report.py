"""The ablation report: one row per (strategy, metric), rendered as a strategy x metric table."""

from __future__ import annotations

import polars as pl


def ablation_table(train_log: pl.DataFrame, evals: pl.DataFrame, tail_frac: float = 0.1) -> pl.DataFrame:
    """Long table (strategy, metric, value): final train loss (mean of the last 10% of steps)
    plus every evaluation metric as ``suite/task/metric``."""
    final = (
        train_log.sort("strategy", "step")
        .group_by("strategy", maintain_order=True)
        .agg(pl.col("loss").tail(pl.max_horizontal(pl.lit(1), (pl.len() * tail_frac).cast(pl.Int64))).mean().alias("value"))
        .with_columns(metric=pl.lit("train/final_loss"))
    )
    ev = evals.select(
        "strategy", (pl.col("suite") + "/" + pl.col("task") + "/" + pl.col("metric")).alias("metric"), pl.col("value").cast(pl.Float64)
    )
    return pl.concat([final.select("strategy", "metric", "value"), ev]).sort("metric", "strategy")


HIGHER_IS_BETTER = ("acc", "centered_acc", "core_v1", "core_v2")


def higher_is_better(metric: str) -> bool:
    """Accuracies and Core scores: higher is better; losses, perplexities, bits per byte: lower."""
    return metric.rsplit("/", 1)[-1] in HIGHER_IS_BETTER


def render_report(table: pl.DataFrame, max_depth: int = 3, strategies: list[str] | None = None) -> str:
    """Markdown: metrics as rows, strategies as columns; the best value of each row in bold.

    Metrics nested deeper than ``max_depth`` path parts (per-subdomain rows) stay in DuckDB only.
    """
    table = table.filter(pl.col("metric").str.count_matches("/") < max_depth)
    wide = table.pivot(on="strategy", index="metric", values="value", aggregate_function="first").sort("metric")
    present = [c for c in wide.columns if c != "metric"]
    strategies = [s for s in (strategies or present) if s in present]
    lines = ["# Strata ablation report", "", "| metric | " + " | ".join(strategies) + " |", "|---|" + "---:|" * len(strategies)]
    for row in wide.iter_rows(named=True):
        vals = [row[s] for s in strategies]
        pick = max if higher_is_better(row["metric"]) else min
        best = pick((v for v in vals if v is not None), default=None)
        cells = ["" if v is None else (f"**{v:.4f}**" if v == best and len(vals) > 1 else f"{v:.4f}") for v in vals]
        lines.append(f"| {row['metric']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
