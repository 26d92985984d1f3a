"""The CPU dry run of benchmarks/gpu_check.py (the prepared GPU run), at tiny size, so it never rots.

The input is what benchmarks/gpu_data.py writes, made with its own function from the small data
root of tests/export_root.py: real random / greedy / cluster_sorted orderings, exported with
Strata's numpy exporter. The script runs in a subprocess where dagster, polars, duckdb and faiss
cannot be imported, as on the GPU machine.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from export_root import EOS, PAD, VOCAB, build_root, cluster_tokens, write_ordering

REPO = Path(__file__).resolve().parents[1]
STRATEGIES = ("random", "greedy", "cluster_sorted")
BLOCKED = ("dagster", "polars", "duckdb", "faiss", "scipy", "sklearn", "pydantic")  # absent from the GPU image
SEQ_LEN = 64


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpu_data(tmp_path_factory) -> Path:
    from pipeline.ordering.engine import OrderParams, run_strategy
    from pipeline.storage.layout import Layout
    from pipeline.training.heldout import HeldoutBatch

    root = tmp_path_factory.mktemp("root")
    docs, segments, store = build_root(root, SEQ_LEN)
    for strategy in STRATEGIES:
        result = run_strategy(strategy, docs, segments, SEQ_LEN, OrderParams(length_bins=4), 0)
        write_ordering(root, strategy, result.order["sequence_id"].to_numpy())
    rng = np.random.default_rng(7)
    n_docs = 6  # held-out documents: fresh ones of the root's clusters, each its own padded row
    tokens = np.full((n_docs, SEQ_LEN), PAD, np.int64)
    filled = np.zeros((n_docs, SEQ_LEN), bool)
    for i in range(n_docs):
        n = int(rng.integers(10, SEQ_LEN))
        tokens[i, :n] = np.r_[cluster_tokens(rng, i % 3, n - 1), EOS]
        filled[i, :n] = True
    out = tmp_path_factory.mktemp("gpu_data")
    heldout = HeldoutBatch(tokens, filled, [f"h{i}" for i in range(n_docs)])
    manifest = load("gpu_data").write_gpu_data(Layout(root), STRATEGIES, out, heldout, VOCAB, {"fixture": "tests/export_root.py"})
    assert manifest["bytes"] > 0 and manifest["strategies"] == list(STRATEGIES)
    return out


def test_dry_run_without_the_stack(gpu_data, tmp_path):
    out = tmp_path / "gpu_check.json"
    code = (f"import runpy, sys\nfor name in {BLOCKED!r}:\n    sys.modules[name] = None\n"
            f"sys.argv = ['gpu_check.py', '--tiny', '--data', {str(gpu_data)!r}, '--out', {str(out)!r}]\n"
            f"runpy.run_path({str(REPO / 'benchmarks' / 'gpu_check.py')!r}, run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["tiny"] and not result["gpu_run"]
    assert result["stack_modules_loaded"] == [] and result["torch"] and result["device_name"]
    assert result["phases"] == {"correctness": "done", "speed": "done", "ablation": "done"}

    check = result["correctness"]
    assert check["passed"] and check["reference"] == "sdpa_dense" and check["precision"] == "float32"
    assert check["positions"]["restart_at_every_document"]
    assert check["positions"]["documents"] > check["rows"]  # several documents per sequence
    loop = check["paths"]["per_document_loop"]
    assert loop["gradients_compared"] and loop["grad_max_rel_diff"] <= check["tolerances"]["grad_rel"]
    flex = check["paths"]["flex"]
    assert flex["loss_rel_diff"] <= check["tolerances"]["loss_rel"]
    if not check["flex_backward_on_device"]:  # torch has no FlexAttention backward on a CPU: loss only, said so
        assert not flex["gradients_compared"] and "no gradients" in flex["note"]
    else:
        assert flex["grad_max_rel_diff"] <= check["tolerances"]["grad_rel"]
    assert "flex_compiled" not in check["paths"]  # --tiny runs compile off

    (run,) = result["speed"]["runs"]
    assert run["preset"] == "tiny" and run["tokens_per_s"] > 0 and run["mfu"] is None
    assert run["step_s_p90"] >= run["step_s_p50"] > 0 and run["measured_steps"] == 2

    abl = result["ablation"]
    assert abl["seeds_done"] == 2 and abl["stopped"] is None
    n_units = len(abl["heldout_units"])
    for strategy in STRATEGIES:
        per_seed = {r["seed"]: r["heldout_losses"] for r in abl["runs"] if r["strategy"] == strategy}
        assert sorted(per_seed) == [0, 1]
        assert all(len(v) == n_units and all(x is not None and x > 0 for x in v) for v in per_seed.values())
    rows = {r["strategy"]: r for r in abl["intervals"]}
    assert sorted(rows) == ["cluster_sorted", "greedy"]
    for r in rows.values():
        assert (r["n_seeds"], r["n_units"], r["interval"]) == (2, n_units, "bootstrap")
        assert r["ci_low"] <= r["delta"] <= r["ci_high"]


def test_the_check_catches_a_mask_that_crosses_documents(gpu_data):
    """The correctness comparison has teeth: attention across documents fails it."""
    check = load("gpu_check")
    data = check.Data(gpu_data)
    ds = data.sets["random"]
    positions = np.arange(2)
    toks = ds.masked_batch(positions)[0]
    pieces = check.document_pieces(ds, positions)
    amp = check.autocast("cpu")
    leaky = check.batch_tensors(ds, positions, True, "cpu", "dense")
    ref = check.run_per_document(data, "tiny", toks, pieces, "cpu", amp)
    row = check.compare(ref, check.run_path(data, "tiny", "dense", False, leaky, "cpu", amp), check.TOLERANCES["float32"])
    assert not row["passed"] and row["loss_rel_diff"] > check.TOLERANCES["float32"]["loss_rel"]
    wrong = leaky["position_ids"].numpy()  # positions run 0..L-1 across documents there
    assert not check.position_check(wrong, pieces)["restart_at_every_document"]
