"""The papers' claims as a section of the ablation report (``report.md``) and of
``report/claims/claims.md``, rendered from the warehouse tables the claims stage writes
(``pipeline.claims.stage.measure_claims``: ``claims``, ``claims_diversity``, ``claims_epoch_jumps``,
``claims_not_measured``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Mapping

import polars as pl

from pipeline.render.markdown import table_lines


def fmt(v: float, digits: int = 3) -> str:
    """A figure to ``digits`` significant digits; a dash for a missing one (None or NaN)."""
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}g}"


def _interval(r: dict) -> str:
    return f"{fmt(r['value'], 4)} [{fmt(r['ci_low'], 4)}, {fmt(r['ci_high'], 4)}]"


def claims_section(claims: pl.DataFrame | None, diversity: pl.DataFrame | None = None, jumps: pl.DataFrame | None = None,
                   missing: Mapping[str, str] | None = None, base: Path | None = None,
                   root: Path | None = None) -> tuple[str, dict[str, Path]]:
    """The ablation report's claims section: ``(markdown, {figure name: PNG path})``.

    ``claims``: the ``claims`` table; ``diversity``: ``claims_diversity``; ``jumps``:
    ``claims_epoch_jumps``; ``missing``: claims not measured and why. Image links are relative to
    ``base`` (the report's folder) when given, else absolute; the figures dict is for the UI.
    """
    lines = ["## Claims of the papers, reproduced on this corpus", ""]
    if claims is None or claims.height == 0:
        lines.append("No claim was measured (materialize `claims`, or run `strata claims`).")
        return "\n".join(lines) + "\n", {}
    lines += [
        "Each row: the paper's claim, its own figure (quoted), Strata's figure with a 95% interval, and the verdict "
        "the interval decides — *reproduced* when it lies wholly on the claimed side of the threshold, *not reproduced* "
        "when wholly on the other, else *inconclusive*. `strata claims` prints the same table; DuckDB `claims` holds it "
        "with the interval's method, the units and the details.",
        "",
    ]
    lines += table_lines(["paper", "claim", "paper's figure", "Strata [95% CI]", "claimed", "verdict"],
                         [[r["paper"], r["claim"], r["paper_figure"].split(" (\"")[0].split(": \"")[0], _interval(r),
                           f"{r['side']} {fmt(r['threshold'])}", f"**{r['verdict']}**"] for r in claims.iter_rows(named=True)])
    if missing:
        lines += ["", "Not measured here: " + "; ".join(f"`{k}` ({v})" for k, v in missing.items()) + "."]
    if diversity is not None and diversity.height:
        k = int(diversity["k"][0])
        lines += [
            "", f"### Diversity-ordered training's table on this corpus (k={k})", "",
            "Distinct clusters per sequence (the paper's table, its values in brackets: 131K-token sequences, k=30) and, "
            "beside it, the per-batch token-share deviation max_k |share in the batch − global share|: stratified "
            "balances document *counts*, so with many short and few long documents its batches miss the token shares.",
            "",
        ]
        rows = []
        for r in diversity.iter_rows(named=True):
            p = ((f" [{r['paper_mean']:g}]", f" [{r['paper_min']:g}]", f" [{r['paper_std']:g}]")
                 if r["paper_mean"] is not None else ("", "", ""))
            rows.append([r["strategy"], str(r["sequences"]), f"{r['clusters_per_seq_mean']:.3f}{p[0]}",
                         f"{r['clusters_per_seq_min']:.0f}{p[1]}",
                         f"{r['clusters_per_seq_std']:.3f}{p[2]}", f"{r['batch_token_share_dev_mean']:.4f}",
                         f"{r['batch_token_share_dev_max']:.4f}"])
        lines += table_lines(["strategy", "sequences", "mean", "min", "std", "batch token-share dev. (mean)", "(max)"], rows, "lrrrrrr")
    if jumps is not None and jumps.height:
        lines += ["", "### Epoch-boundary jump ratio per order (mean over seeds x boundaries, 95% interval)", ""]
        lines += table_lines(["order", "metric", "jump ratio [95% CI]", "seeds", "boundaries"],
                             [[r["arm"], r["metric"], f"{fmt(r['ratio'], 4)} [{fmt(r['ci_low'], 4)}, {fmt(r['ci_high'], 4)}]",
                               str(r["seeds"]), str(r["boundaries"])] for r in jumps.iter_rows(named=True)], "lllrr")
    figures: dict[str, Path] = {}
    for f in claims["figure"].unique(maintain_order=True).to_list():
        if f:  # stored relative to the data root (``root``; default ``base``)
            p = Path(f)
            figures[p.stem] = p if p.is_absolute() or (root or base) is None else (root or base) / p
    lines += [""]
    for name, p in figures.items():
        shown = p.relative_to(base) if base is not None and p.is_relative_to(base) else p
        lines.append(f"![{name}]({shown})")
    return "\n".join(lines) + "\n", figures


CLAIM_TABLES = ("claims", "claims_diversity", "claims_epoch_jumps", "claims_not_measured")


def claims_report_section(read: Callable[[str], pl.DataFrame | None], base: Path | None = None) -> tuple[str, dict[str, Path]]:
    """:func:`claims_section` from the warehouse: ``read(name)`` returns a DuckDB table (None when
    absent) among :data:`CLAIM_TABLES`. The one call the ablation report makes."""
    missing = read("claims_not_measured")
    return claims_section(read("claims"), read("claims_diversity"), read("claims_epoch_jumps"),
                          dict(missing.select("claim", "reason").iter_rows()) if missing is not None else None, base)
