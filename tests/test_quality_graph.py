"""The quality stage in the graph: ``strata run`` with a scorer Strata trains scores every document,
the filter's removed tokens are accounted in the packing (token conservation passes), the greedy
balances the quality bins and greedy_blend anneals into the top bins."""

from __future__ import annotations

import json
import subprocess
import sys

import duckdb
import numpy as np
import polars as pl
import yaml
from helpers import demo_domains, small_graph_config


def test_strata_run_scores_filters_balances_and_anneals(tmp_path, monkeypatch, capsys):
    from pipeline.storage.layout import Layout

    docs = demo_domains(("web", "code", "technical_docs", "quotes_humor", "literature"), 30)
    rows = [{"id": f"d{i}", "text": d["text"], "domain": d["domain"]} for i, d in enumerate(docs)]
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    labelled = demo_domains(("technical_docs", "quotes_humor"), 90)
    labelled = labelled[30:90] + labelled[120:]  # 60 of each, none of them in the corpus (its first 30 of each)
    for name, domain in (("pos", "technical_docs"), ("neg", "quotes_humor")):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps({"text": d["text"]}) for d in labelled if d["domain"] == domain))
    anneal = {"0": 0.0, "1": 0.0, "2": 0.4, "3": 0.6}
    cfg = small_graph_config(tmp_path / "corpus.jsonl") | {
        "data_root": str(tmp_path / "root"), "heldout_fraction": 0.0, "strategies": ["random", "greedy", "greedy_blend"],
        "objective": "custom", "families": ["cluster", "length_bin", "quality_bin:0.5"], "dedup": {"semantic": False},
        "quality": {"enabled": True, "scorer": "fasttext_trained", "positives": str(tmp_path / "pos.jsonl"),
                    "negatives": str(tmp_path / "neg.jsonl"), "epochs": 20, "lr": 0.5,
                    "filter": {"keep_top": 0.85}},
        "mixture": {"column": "quality", "bins": 4, "max_repetition": {"2": 3, "3": 3},
                    "stages": [{"until_tokens": 0.8, "weights": {"0": 0.25, "1": 0.25, "2": 0.25, "3": 0.25}}, {"weights": anneal}]},
        "mixture_tolerance": 0.15}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(tmp_path / "cfg.yaml"),
                           "--select", "*diagnostics_report"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]  # token_conservation (blocking) passed with the filter's removals
    layout = Layout(tmp_path / "root")
    table = pl.read_parquet(layout.quality)
    stream = np.diff(np.load(layout.doc_offsets))
    assert table.height == stream.size and table["quality"].is_finite().all()
    gone = table.filter(pl.col("removed") == "quality")["doc_id"].to_numpy()
    assert 0 < stream[gone].sum() <= 0.15 * stream.sum() + stream.max()  # keep_top 0.85 of the tokens
    assert table.filter(pl.col("removed").is_null())["quality"].min() >= table.filter(pl.col("removed") == "quality")["quality"].max()
    assert not set(gone) & set(pl.read_parquet(layout.segments)["doc_id"].to_list())
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        stats = dict(con.execute("SELECT metric, value FROM packing_stats").fetchall())
        by_source = con.execute("SELECT source, documents FROM quality_by_source").fetchall()
        stages = con.sql("SELECT * FROM blend_stages WHERE strategy = 'greedy_blend'").pl()
        along = con.sql("SELECT * FROM quality_along_stream ORDER BY strategy, window_index").pl()
    assert stats["tokens_removed_quality"] == stream[gone].sum()
    assert sum(n for _, n in by_source) == stream.size
    assert (layout.root / "quality" / "quality.png").stat().st_size > 10_000
    means = dict(pl.DataFrame(by_source, schema=["source", "documents"], orient="row").join(
        pl.read_parquet(layout.documents, columns=["doc_id", "source"]).join(table, on="doc_id").group_by("source")
        .agg(pl.col("quality").mean()), on="source").select("source", "quality").iter_rows())
    assert means["technical_docs"] > means["quotes_humor"]  # the classifier's positives outscore its negatives' kind
    last = stages.filter(pl.col("stage") == stages["stage"].max())
    top = last.filter(pl.col("group").is_in(["2", "3"]))["realized_share"].sum()
    assert top >= 0.85, last  # the anneal: the last 20% of the tokens from the top two quality bins
    check_quality_along_stream(layout, table, along)
    check_strata_report(layout, monkeypatch, capsys)


def check_strata_report(layout, monkeypatch, capsys) -> None:
    """``strata report`` on a root that scored quality (its recorded config read): the quality line, and the
    quality along the stream redrawn beside the other figures."""
    import argparse

    from pipeline.cli.report import cmd_report

    monkeypatch.delenv("STRATA_CONFIG", raising=False)
    monkeypatch.delenv("STRATA_HOME", raising=False)
    figure = layout.root / "report" / "quality_along_stream.png"
    figure.unlink()
    capsys.readouterr()
    assert cmd_report(argparse.Namespace(data_root=str(layout.root), length_bins=None)) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "quality: fasttext_trained, held-out AUC" in out and str(figure) in out
    assert figure.read_bytes()[:4] == b"\x89PNG" and "quality_along_stream.png" in (layout.root / "report" / "diagnostics.md").read_text()


def check_quality_along_stream(layout, table: pl.DataFrame, along: pl.DataFrame) -> None:
    """DuckDB ``quality_along_stream`` against the streams walked here: every ordering's sequences in
    position order, each sequence's segments, a segment in the window of equal tokens holding its first token."""
    score = dict(zip(table["doc_id"].to_list(), table["quality"].to_list()))
    assert sorted(set(along["strategy"])) == ["greedy", "greedy_blend", "random"]
    for strategy in ("random", "greedy", "greedy_blend"):
        own = layout.root / "orderings" / f"{strategy}.segments.parquet"
        segs = pl.read_parquet(own if own.exists() else layout.segments, columns=["sequence_id", "doc_id", "n_tokens"])
        by_seq: dict[int, list[tuple[int, int]]] = {}
        for sid, doc, n in segs.iter_rows():
            by_seq.setdefault(sid, []).append((doc, n))
        order = pl.read_parquet(layout.ordering(strategy)).sort("position")["sequence_id"].to_list()
        stream = [seg for sid in order for seg in by_seq[sid]]
        total = sum(n for _, n in stream)
        got = along.filter(pl.col("strategy") == strategy)
        assert got.height == 50 and got["tokens"].sum() == total
        tokens, weighted, at = [0] * 50, [0.0] * 50, 0
        for doc, n in stream:
            w = min(at * 50 // total, 49)
            tokens[w] += n
            weighted[w] += n * score[doc]
            at += n
        assert got["tokens"].to_list() == tokens
        want = [x / t if t else float("nan") for x, t in zip(weighted, tokens)]
        np.testing.assert_allclose(got["mean_quality"].to_numpy(), want, rtol=1e-9, equal_nan=True)
    last = along.filter(pl.col("strategy") == "greedy_blend", pl.col("window_index") >= 42)["mean_quality"].mean()
    assert last > along.filter(pl.col("strategy") == "random")["mean_quality"].mean()  # the anneal: the top bins at the end
    assert (layout.root / "report" / "quality_along_stream.png").stat().st_size > 10_000
