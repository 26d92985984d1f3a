"""The ablation report's power figure (PNG): what this run can resolve and what the next one needs.

Left: the minimum detectable effect (as % of the baseline's held-out loss) against the number of
seeds, from the pooled variance components of ``pipeline.reports.stats.power_table`` (eq. 1 there),
at this run's held-out documents and at the planned run's; the 0.5% target and every strategy's
observed |Δ| as horizontal lines. Right: the measured |Δ| and MDE of each strategy at each
held-out checkpoint against the training tokens seen (``stats.mde_by_checkpoint``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.heavy import lazy
from pipeline.render.figures import DPI, cluster_colors, new_figure, save_png
from pipeline.reports.stats import POOLED, Z_MDE

ticker = lazy("matplotlib.ticker")  # imported when the first figure is drawn (pipeline/heavy.py)


def _mde_rel(r: dict, seeds: np.ndarray, units: int) -> np.ndarray:
    var = r["sigma_seed"] ** 2 / seeds + r["sigma_doc"] ** 2 / units + r["sigma_res"] ** 2 / (seeds * units)
    return 100 * Z_MDE * np.sqrt(var) / r["baseline_mean"]


def plot_power(power: pl.DataFrame, checkpoints: pl.DataFrame, path: str | os.PathLike) -> Path:
    """Power curves (left) and the measured Δ / MDE per checkpoint (right); see the module docstring."""
    p = power.filter(pl.col("strategy") == POOLED).row(0, named=True)
    rows = power.filter(pl.col("strategy") != POOLED).to_dicts()
    fig = new_figure(figsize=(12, 4.6), dpi=DPI)
    ax, bx = fig.subplots(1, 2)
    top = max(64, 2 * (p["seeds_needed"] or 0))
    seeds = np.unique(np.geomspace(2, top, 60).round()).astype(np.int64)
    ax.plot(seeds, _mde_rel(p, seeds, p["n_units"]), color="black", lw=1.8, label=f"{POOLED}, {p['n_units']} held-out docs (this run)")
    if p["units_needed"] and p["units_needed"] != p["n_units"]:
        ax.plot(seeds, _mde_rel(p, seeds, p["units_needed"]), color="black", lw=1.4, ls="--",
                label=f"{POOLED}, {p['units_needed']:,} held-out docs (planned)")
    ax.axhline(100 * p["target_rel"], color="tab:red", lw=1.2, ls=":", label=f"target {100 * p['target_rel']:.1f}%")
    ax.plot([p["n_seeds"]], [100 * p["mde_rel"]], "o", color="black", ms=7, label="this run")
    if p["seeds_needed"]:
        ax.plot([p["seeds_needed"]], [100 * p["target_rel"]], "*", color="tab:red", ms=13, label=f"planned: {p['seeds_needed']} seeds")
    colors = cluster_colors(max(len(rows), 1))
    for color, r in zip(colors, rows):
        ax.axhline(100 * abs(r["delta_rel"]), color=color, lw=1.0, alpha=0.8, label=f"|Δ| {r['strategy']}")
    ax.set_xscale("log")
    ticks = [t for t in (2, 3, 5, 10, 20, 50, 100, 200, 500, 1000, 2000) if t <= seeds[-1]]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_yscale("log")
    ax.set_xlabel("seeds per strategy")
    ax.set_ylabel(f"minimum detectable |Δ|, % of {p['baseline']}'s loss")
    ax.set_title("MDE (80% power, two-sided 5%) vs seeds")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="lower left")
    if checkpoints.height:
        for color, r in zip(colors, rows):
            c = checkpoints.filter(pl.col("strategy") == r["strategy"]).sort("tokens_seen")
            if c.is_empty():
                continue
            x = c["tokens_seen"].to_numpy()
            base = c["baseline_mean"].to_numpy()
            bx.plot(x, 100 * c["mde"].to_numpy() / base, color=color, lw=1.5, label=f"MDE {r['strategy']}")
            bx.plot(x, 100 * np.abs(c["delta"].to_numpy()) / base, color=color, lw=0, marker="o", ms=5, label=f"|Δ| {r['strategy']}")
        bx.axhline(100 * p["target_rel"], color="tab:red", lw=1.2, ls=":")
        bx.set_yscale("log")
        bx.legend(fontsize=7, ncol=2)
    bx.set_xlabel("training tokens seen")
    bx.set_ylabel(f"% of {p['baseline']}'s held-out loss")
    bx.set_title(f"Measured at each checkpoint ({p['n_seeds']} seeds × {p['n_units']} docs)")
    bx.grid(True, which="both", alpha=0.25)
    fig.tight_layout()
    return save_png(fig, path)
