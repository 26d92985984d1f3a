"""The ablation report: per-run metrics, mean ± std over seeds, paired differences to ``random``.

Inputs are per-unit rows (strategy, seed, metric, unit, value): held-out documents for the fixed
held-out batch (``heldout_batch/loss``, nats/token at the last step) and for per-document
evaluation scores, one unit ``all`` for metrics that only exist as an aggregate (WikiText
perplexity, DCLM Core, ...). Nothing is bolded for being the best mean; a difference to the
baseline is bolded only when its paired-bootstrap 95% interval excludes zero
(``pipeline.reports.stats``) *and* the positive control was detected.

The report opens with the positive control (``cluster_sorted``, a deliberately harmful order):
one sentence with its Δ vs ``random`` on the held-out batch loss, its 95% interval and whether
the interval excludes zero. If it does not, the run had no power to rank the orderings and
nothing is bolded. Then the power statement: the run (seeds x held-out documents) that resolves
a 0.5% difference, this run's minimum detectable effect and the run each observed Δ would need
(``pipeline.reports.stats.power_table``).
"""

from __future__ import annotations

import math

import polars as pl

from pipeline.names import POSITIVE_CONTROL
from pipeline.reports.stats import HELDOUT_METRIC, POOLED, ControlVerdict, control_verdict
from pipeline.training.consumed import METRICS as DIVERSITY_METRICS

UNIT_SCHEMA = {"strategy": pl.String, "seed": pl.Int64, "metric": pl.String, "unit": pl.String, "value": pl.Float64}


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
    units; mean and sample std over the training seeds. Summed in a fixed order (units and runs
    sorted), so the same runs give the same bits whatever order DuckDB returned their rows in."""
    per_run = (units.sort("strategy", "seed", "metric", "unit").group_by("strategy", "seed", "metric", maintain_order=True)
               .agg(pl.col("value").mean()).sort("strategy", "metric", "seed"))
    return (
        per_run.group_by("strategy", "metric", maintain_order=True)
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


def _interval(delta: float, lo: float, hi: float) -> str:
    return f"{_signed(delta)} [{_signed(lo)}, {_signed(hi)}]"


def _delta_cell(r: dict, bold: bool = True) -> str:
    text = _interval(r["delta"], r["ci_low"], r["ci_high"])
    return f"**{text}**" if r["significant"] and bold else text


def control_sentence(v: ControlVerdict) -> str:
    """The report's first sentence: the positive control's Δ on the held-out batch loss, its 95%
    interval and whether the harness detected it (interval above zero)."""
    what = (f"The positive control `{v.control}` (sequences grouped by dominant cluster, a deliberately harmful order)")
    if v.status == "absent":
        return (f"No positive control was run: `{v.control}` (a deliberately harmful order) and `{v.baseline}` are not both "
                f"in this ablation, so nothing here shows that the harness could have detected a difference; add them to `strategies`.")
    diff = f"changed `{HELDOUT_METRIC}` by Δ = {_interval(v.delta, v.ci_low, v.ci_high)} nats vs `{v.baseline}` (95% interval)"
    if v.status == "detected":
        return f"{what} {diff}: the interval excludes zero, so the harness detected it."
    why = ("the interval lies below zero, so the harmful order came out *better* than random, which it should not"
           if v.status == "reversed" else "the interval includes zero, so the harness did not detect it")
    return f"{what} {diff}: {why}, and this run has no power to rank the other orderings (nothing below is bolded)."


def _int(v) -> str:
    return "—" if v is None else f"{int(v):,}"


def _pct(v: float | None) -> str:
    return "—" if v is None or math.isnan(v) else f"{100 * v:.2f}%"


def _plan(r: dict) -> str:
    if r["seeds_needed"] is not None:
        return f"{r['seeds_needed']} seeds × {_int(r['units_needed'])} docs"
    if r["units_floor"] is not None and r["units_floor"] > r["max_units"]:
        return f"none with the {_int(r['max_units'])} docs there are (≥ {_int(r['units_floor'])} docs)"
    return f"none ≤ 1,000 seeds × {_int(r['max_units'])} docs"


def power_section(power: pl.DataFrame, deltas: pl.DataFrame | None, verdict: ControlVerdict) -> list[str]:
    """The power statement (``power_table`` rows): the run a 0.5% difference needs, this run's
    MDE, and for each strategy the run that would resolve its observed Δ."""
    pooled = power.filter(pl.col("strategy") == POOLED)
    rows = power.filter(pl.col("strategy") != POOLED).to_dicts()
    if pooled.is_empty() or not rows:
        return ["**Power:** not computed (it needs `random` and another strategy on the held-out batch with 2 seeds or more)."]
    p = pooled.row(0, named=True)
    base = p["baseline"]
    over = [r["strategy"] for r in rows if r["strategy"] != verdict.control] or [r["strategy"] for r in rows]
    tokens = (f"; {p['seeds_needed']} × {p['tokens_per_run']:,} = {p['train_tokens']:,} training tokens per strategy"
              if p["train_tokens"] else "")
    if p["seeds_needed"] is None:
        more = (f"; the document-to-document spread alone needs ≥ {_int(p['units_floor'])} held-out documents "
                f"(raise `heldout_fraction`)" if p["units_floor"] is not None and p["units_floor"] > p["max_units"] else "")
        need = f"no run of at most 1,000 seeds × {_int(p['max_units'])} held-out documents (all there are) can{more}"
    else:
        need = (f"a run needs **{p['seeds_needed']} seeds × {p['units_needed']:,} held-out documents** "
                f"(config: {p['seeds_needed']} values in `seeds`, `heldout_docs: {p['units_needed']}`{tokens})")
    sig = {r["strategy"] for r in (deltas.filter(pl.col("metric") == HELDOUT_METRIC).filter(pl.col("significant")).to_dicts()
                                   if deltas is not None else [])}
    resolved = [s for s in (r["strategy"] for r in rows) if s in sig]
    if verdict.status in ("not_detected", "reversed"):
        today = "none of today's differences can be relied on, since the control was not detected"
    else:
        today = ("its intervals resolve " + (", ".join(f"`{s}`" for s in resolved) if resolved else "none of today's differences"))
    lines = [
        f"**Power.** To detect a Δ of {_pct(p['target_rel'])} of `{base}`'s `{HELDOUT_METRIC}` "
        f"({_fmt(p['target'])} nats at {_fmt(p['baseline_mean'])}; the size of Don't Shuffle, Optimize's largest gain) "
        f"at 80% power (two-sided α = 0.05), {need}, given the spread measured in this run (pooled over "
        + ", ".join(f"`{s}`" for s in over)
        + f": σ_seed = {_fmt(p['sigma_seed'])}, σ_doc = {_fmt(p['sigma_doc'])}, σ_res = {_fmt(p['sigma_res'])} nats). "
        f"This run ({p['n_seeds']} seeds × {p['n_units']} documents) has a minimum detectable effect of "
        f"{_fmt(p['mde'])} nats ({_pct(p['mde_rel'])}); {today}.",
        "",
        "Model: Δ̂ = mean of D[s, u] = strategy − random over seeds s and held-out documents u (the same documents for "
        "every seed), Var(Δ̂) = σ²_seed/n_seeds + σ²_doc/n_docs + σ²_res/(n_seeds·n_docs), the σ²'s from the two-way "
        "ANOVA of D; MDE = (z₀.₉₇₅ + z₀.₈)·√Var(Δ̂). Tokens enter through the held-out documents scored (each its first "
        "`seq_len` tokens); the training tokens per run stay this run's, because Δ and its spread at another training "
        "length are not measured (the power figure shows them at each checkpoint). Seeds are minimized first (a seed "
        "is a training run, a document one forward pass), up to the held-out documents available. The run to resolve "
        "an observed Δ treats it as the true difference: a planning figure, not a finding.",
        "",
        f"| strategy | Δ (% of {base}) | σ_seed | σ_doc | σ_res | MDE, this run (%) | run to resolve its Δ |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in [*rows, p]:
        name = f"{POOLED} → {_pct(p['target_rel'])} target" if r["strategy"] == POOLED else r["strategy"]
        delta = "—" if r["strategy"] == POOLED else f"{_signed(r['delta'])} ({_pct(r['delta_rel'])})"
        lines.append(f"| {name} | {delta} | {_fmt(r['sigma_seed'])} | {_fmt(r['sigma_doc'])} | {_fmt(r['sigma_res'])} | "
                     f"{_fmt(r['mde'])} ({_pct(r['mde_rel'])}) | {_plan(r)} |")
    return lines


def _shown(metric: str, max_depth: int) -> bool:
    return metric.count("/") < max_depth


def render_report(table: pl.DataFrame, max_depth: int = 3, strategies: list[str] | None = None, extra: str = "",
                  deltas: pl.DataFrame | None = None, diversity: pl.DataFrame | None = None,
                  power: pl.DataFrame | None = None, control: str = POSITIVE_CONTROL, baseline: str = "random",
                  claims: str = "") -> str:
    """Markdown: first the positive-control sentence (``control_sentence``), then ``claims`` (the
    papers' claims section, ``pipeline.reports.claims_section.claims_report_section``), then the power
    statement (``power_section``, when ``power`` is given), the mean ± std table (metrics as rows,
    strategies as columns, nothing bolded), the difference-to-baseline table with 95% intervals
    (bold only where the interval excludes zero and the control was detected or absent) and
    minimum detectable effects, and the consumed-stream diversity table. Rows nested deeper than
    ``max_depth`` parts (per subdomain) stay in DuckDB."""
    table = table.filter(pl.col("metric").str.count_matches("/") < max_depth)
    present = sorted(set(table["strategy"]))
    strategies = [s for s in (strategies or present) if s in present]
    n_seeds = int(table["n_seeds"].max()) if table.height else 0
    verdict = control_verdict(deltas if deltas is not None else pl.DataFrame(schema={"strategy": pl.String, "metric": pl.String,
                              "baseline": pl.String}), control, baseline)
    bold = verdict.status not in ("not_detected", "reversed")
    lines = [
        "# Strata ablation report",
        "",
        control_sentence(verdict),
        "",
        *([claims.strip(), ""] if claims.strip() else []),
        *(power_section(power, deltas, verdict) + [""] if power is not None else []),
        f"Mean{' ± std over ' + str(n_seeds) + ' seeds' if n_seeds > 1 else ''} per strategy "
        "(lower is better except accuracies and Core). `heldout_batch/loss` is the next-token loss "
        "(nats/token) on the same held-out documents for every run, at the last step.",
        "",
        *_mean_lines(table, strategies),
    ]
    if deltas is not None and deltas.height:
        lines += _delta_lines(deltas, strategies, max_depth, bold)
    if diversity is not None and diversity.height:
        lines += _diversity_lines(diversity, strategies)
    return "\n".join(lines) + "\n" + extra


def _mean_lines(table: pl.DataFrame, strategies: list[str]) -> list[str]:
    """The mean ± std table: one row per metric, one column per strategy, nothing bolded."""
    lines = [
        "| metric | " + " | ".join(strategies) + " |",
        "|---|" + "---:|" * len(strategies),
    ]
    for metric in table["metric"].unique().sort():
        rows = {r["strategy"]: r for r in table.filter(pl.col("metric") == metric).iter_rows(named=True)}
        cells = [_cell(rows[s]["mean"], rows[s]["std"], rows[s]["n_seeds"]) if s in rows else "" for s in strategies]
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    return lines


def _delta_lines(deltas: pl.DataFrame, strategies: list[str], max_depth: int, bold: bool) -> list[str]:
    """The difference-to-baseline section: each strategy's Δ with its 95% interval per metric
    (bold where the interval excludes zero, when ``bold``), the units and the MDEs."""
    d = deltas.filter(pl.col("metric").map_elements(lambda m: _shown(m, max_depth), return_dtype=pl.Boolean))
    base = d["baseline"][0] if d.height else "random"
    others = [s for s in strategies if s != base and s in set(d["strategy"])]
    n_boot = int(d["n_boot"].max()) if d.height else 0
    lines = [
        "",
        f"## Difference to `{base}` (paired bootstrap, 95% interval)",
        "",
        f"Δ = strategy − {base}, paired by seed and held-out unit; interval from {n_boot:,} two-way "
        "bootstrap replicates over seeds and units (metrics with 1 unit: paired t interval over seeds, "
        "none with one seed). **Bold** only where the interval excludes zero "
        + ("(nothing else is marked)" if bold else "— and here nothing is, because the positive control was not detected")
        + ". MDE: the smallest |Δ| detectable at 5% / 80% power, (z₀.₉₇₅ + z₀.₈)·√Var(Δ̂) with "
        "Var(Δ̂) = σ²_seed/n_seeds + σ²_doc/n_units + σ²_res/(n_seeds·n_units) from the spread of the paired "
        "differences (1 unit: σ²_seed/n_seeds). Units per metric: held-out documents "
        "(`heldout_batch/loss`, `*/doc_bits_per_byte`) or 1 (aggregate metrics: seeds only).",
        "",
        "| metric | " + " | ".join(f"{s} Δ [95% CI]" for s in others) + " | units | MDE (" + ", ".join(others) + ") |",
        "|---|" + "---:|" * len(others) + "---:|---:|",
    ]
    for metric in d["metric"].unique().sort():
        rows = {r["strategy"]: r for r in d.filter(pl.col("metric") == metric).iter_rows(named=True)}
        cells = [_delta_cell(rows[s], bold) if s in rows else "" for s in others]
        units = max(r["n_units"] for r in rows.values())
        mdes = ", ".join(_fmt(rows[s]["mde"]) if s in rows else "—" for s in others)
        lines.append(f"| {metric} | " + " | ".join(cells) + f" | {units} | {mdes} |")
    return lines


def _diversity_lines(diversity: pl.DataFrame, strategies: list[str]) -> list[str]:
    """The consumed stream's diversity section: per strategy the mean over seeds of each of
    :data:`DIVERSITY_METRICS`."""
    agg = diversity.group_by("strategy", "metric").agg(pl.col("value").mean())
    lines = [
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
    return lines
