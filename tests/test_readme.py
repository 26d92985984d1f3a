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
from helpers import demo_slice, small_graph_config

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
    # the up_to_date checks the tick evaluated (assets/sync.py; claim_runs and the quality stage, which the demo does not run, have none)
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
    """After `strata demo` (on a small corpus), the README's UI steps load the demo's config: the sensor
    removes no partition, every training run is there and nothing the demo built is stale."""
    steps = _ui_steps()
    assert steps == ['export DAGSTER_HOME=$PWD/.strata/dagster', 'mkdir -p "$DAGSTER_HOME"', "dagster dev -h 127.0.0.1"]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in demo_slice(200)))
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(small_graph_config(corpus)))
    env = {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "STRATA_CONFIG": "", "PYTHONPATH": str(REPO)}
    demo = subprocess.run([sys.executable, "-m", "assets.cli", "demo", "--config", "small.yaml"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=900)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]

    # the steps, in the folder the demo ran in; dagster dev's code location loads assets.definitions from the checkout
    ui_env = {**env, "DAGSTER_HOME": steps[0].split("=", 1)[1].replace("$PWD", str(tmp_path))}
    Path(ui_env["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    tick = subprocess.run([sys.executable, "-c", SENSOR_TICK], capture_output=True, text=True, env=ui_env, cwd=REPO, timeout=300)
    assert tick.returncode == 0, tick.stderr[-3000:]
    message, *not_up_to_date = tick.stdout.strip().splitlines()
    assert message.startswith("partitions in sync; up_to_date changed for ['ablation_report',"), tick.stdout  # its first results
    # the optional assets the demo's config does not run (claims.full, quality.enabled)
    assert not_up_to_date == ["not evaluated: claim_runs", "not evaluated: quality", "not evaluated: quality_shards"], tick.stdout
    status = subprocess.run([sys.executable, "-m", "assets.cli", "status", "--json"], capture_output=True, text=True,
                            env=ui_env, cwd=REPO, timeout=300)
    assert status.returncode == 0, status.stderr[-3000:]
    rows = json.loads(status.stdout)
    runs = sorted(r["partition"] for r in rows if r["asset"] == "training_runs")
    assert runs == [f"{seed}|{s}" for seed in (0, 1, 2) for s in ("greedy", "random")]
    assert [(r["asset"], r["partition"], r["why"]) for r in rows if r["status"] != "fresh"] == []
    assert {"ablation_report", "claims", "diagnostics_report"} <= {r["asset"] for r in rows}


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
