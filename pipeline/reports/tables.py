"""The ablation report: strategy x metric, mean ± std over training seeds, as markdown."""

from __future__ import annotations

import polars as pl

HIGHER_IS_BETTER = ("acc", "centered_acc", "core_v1", "core_v2")


def higher_is_better(metric: str) -> bool:
    """Accuracies and Core scores: higher is better; losses, perplexities, bits per byte: lower."""
    return metric.rsplit("/", 1)[-1] in HIGHER_IS_BETTER


def ablation_table(train_log: pl.DataFrame, evals: pl.DataFrame, tail_frac: float = 0.1) -> pl.DataFrame:
    """Long table (strategy, metric, mean, std, n_seeds).

    Metrics: ``train/final_loss`` (mean loss of the last 10% of steps of each run) and every
    evaluation row as ``suite/task/metric``; mean and sample std over the training seeds.
    """
    final = (
        train_log.sort("strategy", "seed", "step")
        .group_by("strategy", "seed", maintain_order=True)
        .agg(pl.col("loss").tail(pl.max_horizontal(pl.lit(1), (pl.len() * tail_frac).cast(pl.Int64))).mean().alias("value"))
        .with_columns(metric=pl.lit("train/final_loss"))
    )
    ev = evals.select(
        "strategy", "seed", (pl.col("suite") + "/" + pl.col("task") + "/" + pl.col("metric")).alias("metric"),
        pl.col("value").cast(pl.Float64),
    )
    runs = pl.concat([final.select("strategy", "seed", "metric", "value"), ev])
    return (
        runs.group_by("strategy", "metric")
        .agg(mean=pl.col("value").mean(), std=pl.col("value").std(), n_seeds=pl.col("seed").n_unique())
        .sort("metric", "strategy")
    )


def _cell(mean: float | None, std: float | None, n: int | None, bold: bool) -> str:
    if mean is None:
        return ""
    fmt = (lambda v: f"{v:.4f}") if abs(mean) < 1000 else (lambda v: f"{v:.4g}")
    text = fmt(mean) + (f" ± {fmt(std)}" if n and n > 1 and std is not None else "")
    return f"**{text}**" if bold else text


def render_report(table: pl.DataFrame, max_depth: int = 3, strategies: list[str] | None = None, extra: str = "") -> str:
    """Markdown: metrics as rows, strategies as columns (mean ± std over seeds); the best mean of
    each row in bold. Rows nested deeper than ``max_depth`` parts (per subdomain) stay in DuckDB."""
    table = table.filter(pl.col("metric").str.count_matches("/") < max_depth)
    present = sorted(set(table["strategy"]))
    strategies = [s for s in (strategies or present) if s in present]
    n_seeds = int(table["n_seeds"].max()) if table.height else 0
    lines = [
        "# Strata ablation report",
        "",
        f"Mean{' ± std over ' + str(n_seeds) + ' seeds' if n_seeds > 1 else ''} per strategy; best in bold "
        "(lower is better except accuracies and Core).",
        "",
        "| metric | " + " | ".join(strategies) + " |",
        "|---|" + "---:|" * len(strategies),
    ]
    for metric in table["metric"].unique().sort():
        rows = {r["strategy"]: r for r in table.filter(pl.col("metric") == metric).iter_rows(named=True)}
        means = [rows[s]["mean"] for s in strategies if s in rows and rows[s]["mean"] is not None]
        best = (max if higher_is_better(metric) else min)(means) if len(means) > 1 else None
        cells = [_cell(rows[s]["mean"], rows[s]["std"], rows[s]["n_seeds"], rows[s]["mean"] == best) if s in rows else "" for s in strategies]
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n" + extra
