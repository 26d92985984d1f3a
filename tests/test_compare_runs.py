"""``strata compare-runs``: packing statistics beside ablation metrics across data roots."""

from __future__ import annotations

import duckdb
import polars as pl

from assets.cli import main
from pipeline.reports.compare_runs import compare_runs
from pipeline.storage.warehouse import replace_rows, write_lineage


def _root(tmp_path, name: str, packing: str, padding: float, loss: dict[str, float]):
    root = tmp_path / name
    root.mkdir()
    with duckdb.connect(str(root / "strata.duckdb")) as con:
        stats = {"sequences": 10.0, "tokens_kept": 1000.0, "padding_fraction": padding, "docs_cut": 3.0}
        replace_rows(con, "packing_stats", pl.DataFrame({"metric": list(stats), "value": list(stats.values())}), {})
        replace_rows(con, "ablation", pl.DataFrame({"strategy": list(loss), "metric": ["train/final_loss"] * len(loss),
                                                     "mean": list(loss.values()), "std": [None] * len(loss), "n_seeds": [1] * len(loss)}),
                     {})
        write_lineage(con, asset="sequences", partition=None, run_id="r", code_version="1", data_version="v",
                      input_versions={}, outputs={}, row_counts={}, parameters={"packing": packing}, wall_s=0.1)
    return root


def test_compare_runs_joins_packing_and_ablation(tmp_path, capsys):
    a = _root(tmp_path, "a", "concat", 0.0, {"greedy": 3.0, "random": 3.5})
    b = _root(tmp_path, "b", "padding-x0.5", 0.25, {"random": 4.0})
    df = compare_runs([a, b], ("train/final_loss", "heldout/mean/bits_per_byte"))
    assert df.select("packing", "strategy", "padding_fraction", "train/final_loss").rows() == [
        ("concat", "greedy", 0.0, 3.0), ("concat", "random", 0.0, 3.5), ("padding-x0.5", "random", 0.25, 4.0)]
    assert df["heldout/mean/bits_per_byte"].null_count() == 3
    assert main(["compare-runs", str(a), str(b), "--out", str(tmp_path / "t.md")]) == 0
    assert "padding-x0.5" in (tmp_path / "t.md").read_text()


def test_compare_runs_needs_a_finished_run(tmp_path, capsys):
    assert main(["compare-runs", str(tmp_path)]) == 2
    assert "no strata.duckdb here" in capsys.readouterr().err
