"""What the clean stage removed, for people: a figure (duplicates and contamination by source and by
cluster), the report's section (what was removed, what the evaluations were checked against) and
the one-line summary ``strata demo`` prints. Reads DuckDB ``duplicates``, ``contamination`` and
``clean_removed``."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from pipeline.render.figures import DPI, new_figure, save_png
from pipeline.render.markdown import frame_table
from pipeline.stage import Connect

TABLES = ("duplicates", "contamination", "clean_removed")
_COLORS = {"exact": "tab:blue", "near": "tab:orange", "semantic": "tab:green", "contaminated": "tab:red"}


def read_tables(connect: Connect) -> dict[str, pl.DataFrame]:
    """The clean stage's tables present in the warehouse (none before it ran)."""
    with connect() as con:
        have = {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        return {t: con.sql(f"SELECT * FROM {t}").pl() for t in TABLES if t in have}


def _counts(tables: dict[str, pl.DataFrame], by: str) -> pl.DataFrame:
    """Documents per ``by`` value (source or cluster) and kind: exact / near / semantic duplicates
    (group members) and contaminated documents."""
    parts = []
    dups = tables.get("duplicates")
    if dups is not None and dups.height:
        parts.append(dups.select(pl.col(by).cast(pl.String), kind=pl.col("dup_kind")))
    contam = tables.get("contamination")
    if contam is not None and contam.height:
        parts.append(contam.unique("doc_id").select(pl.col(by).cast(pl.String), kind=pl.lit("contaminated")))
    if not parts:
        return pl.DataFrame(schema={by: pl.String, "kind": pl.String, "documents": pl.UInt32})
    return pl.concat(parts).group_by(by, "kind").agg(documents=pl.len()).sort(by, "kind")


MAX_CLUSTERS = 30  # bars of the cluster panel: the clusters with the most flagged documents


def plot_clean(tables: dict[str, pl.DataFrame], path: str | os.PathLike) -> Path:
    """Stacked bars of duplicate and contaminated documents by source (left) and by cluster (right:
    the :data:`MAX_CLUSTERS` clusters with the most, when there are more)."""
    fig = new_figure(figsize=(11, 4.2), dpi=DPI)
    for ax, by in zip(fig.subplots(1, 2), ("source", "cluster")):
        counts = _counts(tables, by)
        keys = sorted(counts[by].unique().to_list(), key=lambda k: (len(k), k)) if counts.height else []
        title = f"duplicates and contamination by {by}"
        if by == "cluster" and len(keys) > MAX_CLUSTERS:
            totals = dict(counts.group_by(by).agg(pl.col("documents").sum()).iter_rows())
            top = set(sorted(keys, key=lambda k: -totals[k])[:MAX_CLUSTERS])
            title += f"\n(the {MAX_CLUSTERS} of {len(keys)} clusters with the most)"
            keys = [k for k in keys if k in top]
        bottom = [0] * len(keys)
        for kind, color in _COLORS.items():
            got = dict(counts.filter(pl.col("kind") == kind).select(by, "documents").iter_rows())
            heights = [int(got.get(k, 0)) for k in keys]
            if any(heights):
                ax.bar(range(len(keys)), heights, bottom=bottom, color=color, label=kind)
                bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_xticks(range(len(keys)), keys, rotation=45 if by == "source" else (90 if len(keys) > 15 else 0),
                      ha="right" if by == "source" else "center", fontsize=8)
        ax.set_xlabel(by)
        ax.yaxis.get_major_locator().set_params(integer=True)  # whole documents
        ax.set_ylabel("documents")
        ax.set_title(title, fontsize=10)
        if not keys:
            ax.text(0.5, 0.5, "nothing flagged", ha="center", va="center", transform=ax.transAxes)
        elif by == "source":
            ax.legend(fontsize=8)
    return save_png(fig, path)


def summary_line(tables: dict[str, pl.DataFrame]) -> str | None:
    """``clean: ... duplicates (exact, near, semantic), ... contaminated (per set), ... tokens removed``, or None before the stage ran."""
    removed = tables.get("clean_removed")
    if removed is None:
        return None
    dups, contam = tables.get("duplicates"), tables.get("contamination")
    kinds = dict(dups.group_by("dup_kind").len().iter_rows()) if dups is not None and dups.height else {}
    per_set = dict(contam.group_by("eval_set").len().sort("eval_set").iter_rows()) if contam is not None and contam.height else {}
    gone = {r["reason"]: r for r in removed.to_dicts()}
    sets = ", ".join(f"{s} {n}" for s, n in per_set.items()) or "none flagged"
    return (f"clean: duplicates exact {kinds.get('exact', 0)}, near {kinds.get('near', 0)}, semantic {kinds.get('semantic', 0)} "
            f"documents; contaminated: {sets}; removed from training: "
            + ", ".join(f"{r} {int(gone[r]['documents'])} docs / {int(gone[r]['tokens']):,} tokens" for r in gone))


def clean_section(tables: dict[str, pl.DataFrame], checked_against: str) -> str:
    """The report's section: what left training by reason, contaminated documents per evaluation set
    and source, and the sets the corpus was checked against."""
    if "clean_removed" not in tables:
        return ""
    lines = ["## Cleaning (duplicates and benchmark contamination)", "",
             f"Checked against: {checked_against or 'no evaluation set'}. {summary_line(tables)}.", "",
             frame_table(tables["clean_removed"].rename({"reason": "removed because", "tokens": "stream tokens"})), ""]
    contam = tables.get("contamination")
    if contam is not None and contam.height:
        per = contam.group_by("eval_set", "source").agg(documents=pl.len(), tokens=pl.col("n_tokens").sum()).sort("eval_set", "source")
        lines += ["Contaminated documents per evaluation set and source:", "", frame_table(per), ""]
    return "\n".join(lines)
