"""The README's configuration example is a valid configuration, and its UI steps after `strata demo`
show the demo (keeps the README true)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import small_graph_config

from pipeline.config import config_from_dict

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def test_readme_config_example_is_valid():
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    example = next(b for b in blocks if b.startswith("# my.yaml"))
    cfg = config_from_dict(yaml.safe_load(example))
    assert cfg.corpus.path == "/data/corpus.jsonl.gz" and cfg.strategies[0] == "random"


def _ui_steps() -> list[str]:
    """The shell lines of the README's "In the Dagster UI" block."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### In the Dagster UI"):]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]


SENSOR_TICK = """
import dagster as dg
from assets.definitions import defs
with dg.DagsterInstance.get() as instance:
    tick = defs.get_sensor_def("strata_config")(dg.build_sensor_context(instance=instance, definitions=defs))
    print(tick.skip_message)
    # the up_to_date checks the tick evaluated (assets/sync.py; claim_runs, which the demo does not run, has none)
    for key in sorted(defs.resolve_asset_graph().asset_check_keys, key=str):
        if key.name == "up_to_date":
            last = instance.event_log_storage.get_asset_check_execution_history(key, limit=1)
            if not last:
                print("not evaluated:", key.asset_key.to_user_string())
            elif not last[0].event.dagster_event.event_specific_data.passed:
                print("not up to date:", key.asset_key.to_user_string())
"""


@pytest.mark.integration
def test_readme_ui_steps_after_the_demo_show_the_demo(tmp_path):
    """After `strata demo` (on a small built-in corpus), the README's UI steps load the demo's config: the sensor
    removes no partition, every training run is there and nothing the demo built is stale; the demo
    scored quality with the built-in scorer (docs/quality.md) and reports it."""
    steps = _ui_steps()
    assert steps == ['export DAGSTER_HOME=$PWD/.strata/dagster', 'mkdir -p "$DAGSTER_HOME"', "dagster dev -h 127.0.0.1"]
    small = {**small_graph_config(tmp_path / "unused.jsonl"), "corpus": {"builtin_max_docs": 200}}  # the README's corpus
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(small))
    env = {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "STRATA_CONFIG": "", "PYTHONPATH": str(REPO)}
    demo = subprocess.run([sys.executable, "-m", "assets.cli", "demo", "--config", "small.yaml"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=900)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    check_demo_quality((tmp_path / ".strata").resolve(), demo.stdout)

    # the steps, in the folder the demo ran in; dagster dev's code location loads assets.definitions from the checkout
    ui_env = {**env, "DAGSTER_HOME": steps[0].split("=", 1)[1].replace("$PWD", str(tmp_path))}
    Path(ui_env["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    tick = subprocess.run([sys.executable, "-c", SENSOR_TICK], capture_output=True, text=True, env=ui_env, cwd=REPO, timeout=300)
    assert tick.returncode == 0, tick.stderr[-3000:]
    message, *not_up_to_date = tick.stdout.strip().splitlines()
    assert message.startswith("partitions in sync; up_to_date changed for ['ablation_report',"), tick.stdout  # its first results
    # the optional asset the demo's config does not run (claims.full)
    assert not_up_to_date == ["not evaluated: claim_runs"], tick.stdout
    status = subprocess.run([sys.executable, "-m", "assets.cli", "status", "--json"], capture_output=True, text=True,
                            env=ui_env, cwd=REPO, timeout=300)
    assert status.returncode == 0, status.stderr[-3000:]
    rows = json.loads(status.stdout)
    runs = sorted(r["partition"] for r in rows if r["asset"] == "training_runs")
    assert runs == [f"{seed}|{s}" for seed in (0, 1, 2) for s in ("greedy", "random")]
    assert [(r["asset"], r["partition"], r["why"]) for r in rows if r["status"] != "fresh"] == []
    assert {"ablation_report", "claims", "diagnostics_report", "quality", "quality_shards"} <= {r["asset"] for r in rows}


def check_demo_quality(root: Path, stdout: str) -> None:
    """The demo root's quality section: the scores, the figures, DuckDB's tables, and the demo's line."""
    import duckdb
    import polars as pl

    scores = pl.read_parquet(root / "quality" / "documents.parquet")
    assert scores.height == pl.read_parquet(root / "documents.parquet").height and scores["removed"].null_count() == scores.height
    for png in (root / "quality" / "quality.png", root / "report" / "quality_along_stream.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    assert "quality_along_stream.png" in (root / "report" / "diagnostics.md").read_text(encoding="utf-8")
    with duckdb.connect(str(root / "strata.duckdb"), read_only=True) as con:
        windows = dict(con.sql("SELECT strategy, count(*) FROM quality_along_stream GROUP BY ALL").fetchall())
        sources = dict(con.sql("SELECT source, mean FROM quality_by_source").fetchall())
    assert windows == {"random": 50, "greedy": 50}
    assert sources["docs"] == max(sources.values())  # the positives' source scores highest
    line = next(x for x in stdout.splitlines() if x.startswith("quality: fasttext_trained, held-out AUC "))
    assert str(root / "report" / "quality_along_stream.png") in line


def test_ci_runs_the_readmes_test_command():
    """``.ci/run`` ends with the README's test command (quiet pip flags aside)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    command = re.search(r"Tests:\n\n```bash\n(.+?)\n```", readme).group(1)
    last = (REPO / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert last.replace(" -q", "") == command


def test_every_command_help_renders(capsys):
    """`strata --help` and `strata <command> --help` print and exit 0 (argparse expands `%` in help texts)."""
    import argparse

    from assets.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for argv in [[], *([name] for name in commands)]:
        with pytest.raises(SystemExit) as done:
            parser.parse_args([*argv, "--help"])
        assert done.value.code == 0, argv
        assert "usage: strata" in capsys.readouterr().out
