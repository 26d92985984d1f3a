"""A run launched from definitions loaded before a config edit stops with the fix (assets/loaded.py).

A parent process loads ``assets.definitions`` (as Dagster's code server does), the config file is
edited, and a child process it starts loads them again (as a run's process does): the child keeps
the parent's code versions, and an asset whose version they no longer match refuses to run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from assets import loaded

REPO = Path(__file__).resolve().parents[1]

PARENT = """
import json, os, subprocess, sys
import yaml
import assets.definitions as d
path = os.environ["STRATA_CONFIG"]
cfg = yaml.safe_load(open(path))
cfg["k"] = 8  # edited after the definitions were loaded, before a reload
yaml.safe_dump(cfg, open(path, "w"))
child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=os.environ)
print(json.dumps({"parent": d.defs.resources["settings"].loaded_versions, "child": child.stdout.strip().splitlines()[-1]}))
"""
CHILD = """
import json
import assets.definitions as d
from assets.loaded import code_versions
print(json.dumps({"loaded": d.defs.resources["settings"].loaded_versions, "own": code_versions(d.defs)}))
"""


def test_a_child_process_keeps_the_versions_its_parent_loaded(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"data_root": str(tmp_path / "root"), "k": 4}))
    env = {**os.environ, "STRATA_CONFIG": str(path), "STRATA_HOME": "", "DAGSTER_HOME": "", "PYTHONPATH": str(REPO)}
    env.pop(loaded.LOADED_ENV, None)
    proc = subprocess.run([sys.executable, "-c", f"CHILD = {CHILD!r}\n" + PARENT], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["parent"] == ""  # the first to load: nothing inherited, nothing to compare
    child = json.loads(out["child"])
    parents = json.loads(child["loaded"])
    # the child built centroids' version from k=8, the parent (the UI) from k=4: they differ, so centroids stops
    assert parents["centroids"] != child["own"]["centroids"]
    assert parents["tokenizer"] == child["own"]["tokenizer"]  # k is not among its parameters: it runs


def test_a_record_from_another_source_or_no_ancestor_is_ignored():
    source = loaded.source_id("cfg.yaml", "/data")
    record = {"pid": os.getppid(), "source": source, "versions": {"centroids": "1+abc"}}
    assert loaded.inherited_versions(source, {loaded.LOADED_ENV: json.dumps(record)}) == {"centroids": "1+abc"}
    assert loaded.inherited_versions(loaded.source_id("other.yaml", "/data"), {loaded.LOADED_ENV: json.dumps(record)}) is None
    if Path("/proc/self/stat").is_file():  # a process that is not an ancestor (this one) did not launch it
        assert loaded.inherited_versions(source, {loaded.LOADED_ENV: json.dumps({**record, "pid": os.getpid()})}) is None
    assert loaded.inherited_versions(source, {loaded.LOADED_ENV: "not json"}) is None
    assert loaded.inherited_versions(source, {}) is None
