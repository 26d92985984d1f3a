"""One table across data roots (``strata compare-runs``), e.g. one root per packing variant.

Packing & shuffling compares packings (concat vs padding, atom sizes) by the final perplexity of the same
model. Packing is a property of a data root (``packing:`` in its config), so the comparison reads
each root's ``strata.duckdb``: its packing statistics (``packing_stats``: tokens kept, padding
fraction, documents cut, sequences) beside its ablation rows (``ablation``), one row per root
and strategy.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pipeline.errors import StrataInputError
from pipeline.storage.duck import duck_connection

PACKING_COLUMNS = ("sequences", "tokens_kept", "padding_fraction", "docs_cut")
DEFAULT_METRICS = ("heldout_batch/loss", "heldout/mean/bits_per_byte")


def compare_runs(roots: list[Path], metrics: tuple[str, ...] = DEFAULT_METRICS) -> pl.DataFrame:
    """One row per (root, strategy): packing statistics and the mean of each ablation metric."""
    rows = []
    for root in roots:
        db = Path(root) / "strata.duckdb"
        if not db.exists():
            raise StrataInputError("no strata.duckdb here", path=root, fix="pass data roots of finished `strata run`s")
        with duck_connection(db, read_only=True) as con:
            stats = dict(con.execute("SELECT metric, value FROM packing_stats").fetchall())
            packing = con.execute(
                "SELECT json_extract_string(parameters, '$.packing') FROM lineage WHERE asset = 'sequences' ORDER BY created_at DESC LIMIT "
                "1"
            ).fetchall()
            ablation = con.sql("SELECT strategy, metric, mean FROM ablation").pl()
        for strategy in ablation["strategy"].unique().sort():
            mine = ablation.filter(pl.col("strategy") == strategy)
            row = {"root": str(root), "packing": packing[0][0] if packing else "", "strategy": strategy}
            row |= {c: stats.get(c) for c in PACKING_COLUMNS}
            for m in metrics:
                v = mine.filter(pl.col("metric") == m)["mean"]
                row[m] = float(v[0]) if v.len() else None
            rows.append(row)
    return pl.DataFrame(rows)
