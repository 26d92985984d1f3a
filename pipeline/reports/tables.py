"""The ablation report: per-run metrics, mean ± std over seeds, paired differences to ``random``.

Inputs are per-unit rows (strategy, seed, metric, unit, value): held-out documents for the fixed
held-out batch (``heldout_batch/loss``, nats/token at the last step) and for per-document
evaluation scores, one unit ``all`` for metrics that only exist as an aggregate (WikiText
perplexity, DCLM Core, ...). Nothing is bolded for being the best mean; a difference to the
baseline is bolded only when its paired-bootstrap 95% interval excludes zero
(``pipeline.reports.stats``).
"""

from __future__ import annotations

import math

import polars as pl

from pipeline.reports.consumed import METRICS as DIVERSITY_METRICS

HIGHER_IS_BETTER = ("acc", "centered_acc", "core_v1", "core_v2")
UNIT_SCHEMA = {"strategy": pl.String, "seed": pl.Int64, "metric": pl.String, "unit": pl.String, "value": pl.Float64}


def higher_is_better(metric: str) -> bool:
    """Accuracies and Core scores: higher is better; losses, perplexities, bits per byte: lower."""
    return metric.rsplit("/", 1)[-1] in HIGHER_IS_BETTER


def run_units(heldout_curve: pl.DataFrame | None, evals: pl.DataFrame | None, eval_units: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per-unit rows of every run (``UNIT_SCHEMA``).

    ``heldout_curve`` (strategy, seed, step, tokens_seen, unit, loss): its last step per run is
    ``heldout_batch/loss``. ``evals`` (strategy, seed, suite, task, metric, value): each row a
    metric ``suite/task/metric`` with unit ``all``. ``eval_units`` (strategy, seed, metric, unit,
    value): per-document evaluation scores as they are.
    """
    parts = []
    if heldout_curve is not None and heldout_curve.height:
        last = heldout_curve.filter(pl.col("step") == pl.col("step").max().over("strategy", "seed"))
        parts.append(last.select("strategy", "seed", metric=pl.lit("heldout_batch/loss"), unit="unit", value="loss"))
    if evals is not None and evals.height:
        parts.append(evals.select(
            "strategy", "seed", metric=pl.col("suite") + "/" + pl.col("task") + "/" + pl.col("metric"),
            unit=pl.lit("all"), value="value",
        ))
    if eval_units is not None and eval_units.height:
        parts.append(eval_units.select("strategy", "seed", "metric", "unit", "value"))
    parts = [p.select(pl.col(c).cast(t) for c, t in UNIT_SCHEMA.items()) for p in parts]
    return pl.concat(parts) if parts else pl.DataFrame(schema=UNIT_SCHEMA)


def ablation_table(units: pl.DataFrame) -> pl.DataFrame:
    """Long table (strategy, metric, mean, std, n_seeds): a run's value is the mean over its
    units; mean and sample std over the training seeds."""
    per_run = units.group_by("strategy", "seed", "metric").agg(pl.col("value").mean())
    return (
        per_run.group_by("strategy", "metric")
        .agg(mean=pl.col("value").mean(), std=pl.col("value").std(), n_seeds=pl.col("seed").n_unique())
        .sort("metric", "strategy")
    )


def _fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.4f}" if abs(v) < 1000 else f"{v:.4g}"


def _cell(mean: float | None, std: float | None, n: int | None) -> str:
    if mean is None:
        return ""
    return _fmt(mean) + (f" ± {_fmt(std)}" if n and n > 1 and std is not None else "")


def _signed(v: float) -> str:
    if v is None or math.isnan(v):
        return "—"
    return f"{v:+.4f}" if abs(v) < 1000 else f"{v:+.4g}"


def _delta_cell(r: dict) -> str:
    text = f"{_signed(r['delta'])} [{_signed(r['ci_low'])}, {_signed(r['ci_high'])}]"
    return f"**{text}**" if r["significant"] else text


def _shown(metric: str, max_depth: int) -> bool:
    return metric.count("/") < max_depth


def render_report(table: pl.DataFrame, max_depth: int = 3, strategies: list[str] | None = None, extra: str = "",
                  deltas: pl.DataFrame | None = None, diversity: pl.DataFrame | None = None) -> str:
    """Markdown: the mean ± std table (metrics as rows, strategies as columns, nothing bolded),
    the difference-to-baseline table with 95% intervals (bold only where the interval excludes
    zero) and minimum detectable effects, and the consumed-stream diversity table. Rows nested
    deeper than ``max_depth`` parts (per subdomain) stay in DuckDB."""
    table = table.filter(pl.col("metric").str.count_matches("/") < max_depth)
    present = sorted(set(table["strategy"]))
    strategies = [s for s in (strategies or present) if s in present]
    n_seeds = int(table["n_seeds"].max()) if table.height else 0
    lines = [
        "# Strata ablation report",
        "",
        f"Mean{' ± std over ' + str(n_seeds) + ' seeds' if n_seeds > 1 else ''} per strategy "
        "(lower is better except accuracies and Core). `heldout_batch/loss` is the next-token loss "
        "(nats/token) on the same held-out documents for every run, at the last step.",
        "",
        "| metric | " + " | ".join(strategies) + " |",
        "|---|" + "---:|" * len(strategies),
    ]
    for metric in table["metric"].unique().sort():
        rows = {r["strategy"]: r for r in table.filter(pl.col("metric") == metric).iter_rows(named=True)}
        cells = [_cell(rows[s]["mean"], rows[s]["std"], rows[s]["n_seeds"]) if s in rows else "" for s in strategies]
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    if deltas is not None and deltas.height:
        d = deltas.filter(pl.col("metric").map_elements(lambda m: _shown(m, max_depth), return_dtype=pl.Boolean))
        base = d["baseline"][0] if d.height else "random"
        others = [s for s in strategies if s != base and s in set(d["strategy"])]
        n_boot = int(d["n_boot"].max()) if d.height else 0
        lines += [
            "",
            f"## Difference to `{base}` (paired bootstrap, 95% interval)",
            "",
            f"Δ = strategy − {base}, paired by seed and held-out unit; interval from {n_boot:,} two-way "
            "bootstrap replicates over seeds and units (metrics with 1 unit: paired t interval over seeds, "
            "none with one seed). **Bold** only where the interval excludes zero "
            "(nothing else is marked). MDE: the smallest |Δ| detectable at 5% / 80% power from the "
            "seed-to-seed spread of the paired differences. Units per metric: held-out documents "
            "(`heldout_batch/loss`, `*/doc_bits_per_byte`) or 1 (aggregate metrics: seeds only).",
            "",
            "| metric | " + " | ".join(f"{s} Δ [95% CI]" for s in others) + " | units | MDE (" + ", ".join(others) + ") |",
            "|---|" + "---:|" * len(others) + "---:|---:|",
        ]
        for metric in d["metric"].unique().sort():
            rows = {r["strategy"]: r for r in d.filter(pl.col("metric") == metric).iter_rows(named=True)}
            cells = [_delta_cell(rows[s]) if s in rows else "" for s in others]
            units = max(r["n_units"] for r in rows.values())
            mdes = ", ".join(_fmt(rows[s]["mde"]) if s in rows else "—" for s in others)
            lines.append(f"| {metric} | " + " | ".join(cells) + f" | {units} | {mdes} |")
    if diversity is not None and diversity.height:
        agg = diversity.group_by("strategy", "metric").agg(pl.col("value").mean())
        lines += [
            "",
            "## Diversity of the consumed stream (Diversity-ordered training's table)",
            "",
            "Distinct clusters per training sequence and per batch, and the largest deviation of a "
            "batch's cluster token shares from the global shares, over the ids training actually "
            "consumed (mean over seeds).",
            "",
            "| strategy | " + " | ".join(DIVERSITY_METRICS) + " |",
            "|---|" + "---:|" * len(DIVERSITY_METRICS),
        ]
        for s in [s for s in strategies if s in set(agg["strategy"])]:
            vals = dict(agg.filter(pl.col("strategy") == s).select("metric", "value").iter_rows())
            lines.append(f"| {s} | " + " | ".join(_fmt(vals.get(m)) for m in DIVERSITY_METRICS) + " |")
    return "\n".join(lines) + "\n" + extra
