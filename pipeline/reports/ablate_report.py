"""The ablation campaign's section of the report: each strategy's confidence sequence round by
round (a figure) and the verdicts, grids and compute spent (``ablation_campaign`` rows)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl

from pipeline.render.figures import save_png


def plot_campaign(rows: pl.DataFrame, out: Path) -> Path:
    """One panel per strategy: Δ and its anytime-valid interval at each round, ±margin shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strategies = rows["strategy"].unique(maintain_order=True).to_list()
    fig, axes = plt.subplots(1, max(1, len(strategies)), figsize=(4.2 * max(1, len(strategies)), 3.4), squeeze=False)
    for ax, s in zip(axes[0], strategies):
        r = rows.filter(pl.col("strategy") == s).sort("round")
        x = r["round"].to_numpy()
        lo, hi, d = r["ci_low"].to_numpy(), r["ci_high"].to_numpy(), r["delta"].to_numpy()
        m = float(r["margin"][0])
        ax.axhspan(-m, m, color="0.9", label=f"±margin ({m:.4g})")
        ax.axhline(0, color="0.4", lw=0.8)
        ylo, yhi = _limits(lo, hi, d, m)
        ax.set_ylim(ylo, yhi)
        # an early round's interval (the pilot's, on few degrees of freedom) can be far wider than
        # the last: it is drawn to the panel's edge with an arrowhead, so the narrowing stays visible
        top = [min(b, yhi) if math.isfinite(b) else yhi for b in hi]
        bottom = [max(a, ylo) if math.isfinite(a) else ylo for a in lo]
        ax.vlines(x, bottom, top, color="C0", lw=2)
        for xi, a, b in zip(x, lo, hi):
            if not (math.isfinite(b) and b <= yhi):
                ax.plot(xi, yhi, "^", color="C0", ms=6, clip_on=False)
            if not (math.isfinite(a) and a >= ylo):
                ax.plot(xi, ylo, "v", color="C0", ms=6, clip_on=False)
        ax.plot(x, d, "o", color="C1", label="Δ")
        for xi, n_s, n_u in zip(x, r["n_seeds"], r["n_units"]):
            ax.annotate(f"{n_s}×{n_u}", (xi, ylo), xytext=(0, 3), textcoords="offset points", fontsize=7, ha="center",
                        va="bottom", color="0.3")
        ax.set_title(f"{s}: {r['verdict'][-1]}")
        ax.set_xlabel("round (0 = pilot); seeds × documents")
        ax.set_xticks(x)
    axes[0][0].set_ylabel(f"Δ vs {rows['baseline'][0]} ({rows['metric'][0]})")
    axes[0][0].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    save_png(fig, out, tight=False)  # at most MAX_WIDTH_PX wide: one panel per strategy grows it
    plt.close(fig)
    return out


def _limits(lo, hi, d, margin: float) -> tuple[float, float]:
    """The y range of one panel: ±margin, every Δ and the last round's interval, padded by half
    that span (wider intervals of earlier rounds are cut at the edge)."""
    vals = [-margin, margin, *(v for v in d if math.isfinite(v))]
    vals += [v for v in (lo[-1], hi[-1]) if math.isfinite(v)]
    low, high = min(vals), max(vals)
    pad = 0.5 * (high - low)
    return low - pad, high + pad


def campaign_markdown(rows: pl.DataFrame, figure: str | None = "ablation_campaign.png") -> str:
    """The campaign's section: one line per strategy (verdict, last interval, grid), what an
    unresolved strategy would need, the rounds and the compute spent, and the figure."""
    if rows.is_empty():
        return ""
    last_round = rows.filter(pl.col("round") == rows["round"].max())
    first = last_round.row(0, named=True)
    budget = (f"{first['budget_s'] / 60:.0f} min" if first["budget_s"] is not None and not math.isnan(first["budget_s"])
              else f"{first['budget_tokens']:,} training tokens")
    lines = [f"## Ablation campaign (`strata ablate`, {first['campaign']})", "",
             (f"Δ = strategy − {first['baseline']} on `{first['metric']}`, anytime-valid {1 - first['alpha']:.0%} confidence "
             f"sequences (valid at every round), margin ±{first['margin']:.4g} ({first['effect_rel']:.2%} of {first['baseline']}'s "
             f"{first['baseline_mean']:.4f}); {int(rows['round'].max()) + 1} look(s) (round 0 is the pilot); spent "
             f"{first['spent_s'] / 60:.1f} min and {first['spent_tokens']:,} training tokens of a {budget} budget."), "",
             "| strategy | verdict | Δ | interval | seeds × documents | σ_seed | σ_doc | σ_res |", "|---|---|---:|---|---|---:|---:|---:|"]
    for r in last_round.iter_rows(named=True):
        lines.append(f"| {r['strategy']} | **{r['verdict']}** | {r['delta']:+.4f} | [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] | "
                     f"{r['n_seeds']} × {r['n_units']} | {r['sigma_seed']:.4f} | {r['sigma_doc']:.4f} | {r['sigma_res']:.4f} |")
    plan = json.loads(first["next_plan"])
    if plan.get("stop"):
        lines += ["", f"Stopped: {plan['stop']}."]
    for r in last_round.filter(pl.col("verdict") == "unresolved").iter_rows(named=True):
        need = json.loads(r["needed"] or "{}")
        if need.get("feasible"):
            lines.append(f"- {r['strategy']} unresolved within the budget: the next step needs {need['seeds']} seeds × "
                         f"{need['units']} documents (about {need['cost']:.4g} more in the budget's unit).")
        elif need:
            lines.append(f"- {r['strategy']} unresolved: {need.get('reason')}; ≥ {need.get('units_floor')} held-out documents "
                         "would be needed (raise heldout_fraction).")
    if figure:
        lines += ["", f"![ablation campaign](report/{figure})"]
    return "\n".join(lines) + "\n"
