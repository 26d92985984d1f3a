"""Resume = same stream: a killed run continues where it stopped and ends as an uninterrupted one.

Strata's own loop (``pipeline.training.checkpoint``): stopped after a checkpoint, then run again,
it gives the uninterrupted run's model, log, held-out curve and probe calls, with and without
the ODM sampler; a checkpoint of other settings is ignored. The ``training_runs`` asset is
SIGKILLed in a real process after a checkpoint and re-run: every output file's bytes and its
DuckDB rows equal those of an uninterrupted materialization. The HF Trainer on the ``hf`` export
(docs/training.md's recipe) is killed after a ``save_steps`` checkpoint and resumed with
``resume_from_checkpoint``: the batches after the resume are positions ``[N·G, …)`` of the stream.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from helpers import demo_slice
from test_training import EOS, PAD, VOCAB, make_store, repetitive_docs

from pipeline.errors import StrataInputError
from pipeline.ordering.odm import ODMSampler, sequence_clusters
from pipeline.packing.pack import SequenceStore
from pipeline.storage.atomic import is_sidecar, sidecar_of
from pipeline.storage.layout import Layout
from pipeline.training.checkpoint import Checkpointing, decode, encode
from pipeline.training.heldout import HeldoutBatch
from pipeline.training.loop import TrainSettings, train

REPO = Path(__file__).resolve().parents[1]
SEQ_LEN = 32
SETTINGS = TrainSettings(preset="tiny", batch_size=4, max_steps=10, lr=1e-2, warmup_steps=2, attention="dense",
                         heldout_every=3)


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(0)
    docs = repetitive_docs(60, rng)
    store, _, seg = make_store(docs, SEQ_LEN)
    return store, seg, np.arange(len(docs)) % 3


def _heldout() -> HeldoutBatch:
    """Five held-out documents of 12-20 tokens."""
    rng = np.random.default_rng(7)
    tokens, filled = np.full((5, SEQ_LEN), PAD), np.zeros((5, SEQ_LEN), dtype=bool)
    for i, n in enumerate((12, 20, 15, 18, 13)):
        tokens[i, :n], filled[i, :n] = np.append(rng.integers(2, VOCAB, n - 1), EOS), True
    return HeldoutBatch(tokens, filled, [f"d{i}" for i in range(5)])


class Recording:
    """What the callbacks of a run see, kept in its checkpoints as the asset keeps its curve and probes."""

    def __init__(self):
        self.curve: list[tuple] = []
        self.probes: list[tuple] = []

    def on_heldout(self, steps, tokens, losses):
        self.curve.append((steps, tokens, losses.copy()))

    def on_checkpoint(self, steps, model):
        self.probes.append((steps, float(sum(p.detach().double().sum() for p in model.parameters()))))

    def state(self) -> dict:
        return {"curve": self.curve, "probes": self.probes}

    def restore(self, state: dict) -> None:
        self.curve, self.probes = [tuple(c) for c in state["curve"]], [tuple(p) for p in state["probes"]]


def _run(store, order, sampler=None, ck_path=None, every=3, stop_after=None, settings=SETTINGS, key=None):
    rec = Recording()
    ck = None if ck_path is None else Checkpointing(ck_path, every, key=key or {}, state=rec.state, restore=rec.restore,
                                                     log=rec.__dict__.setdefault("messages", []).append)
    model, rows = train(store, order, VOCAB, EOS, PAD, settings, progress=False, sampler=sampler, checkpoints=[2, 10],
                        on_checkpoint=rec.on_checkpoint, heldout=_heldout(), on_heldout=rec.on_heldout,
                        stop_after=stop_after, checkpointing=ck)
    return model, [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in rows], rec, ck


def _same(a, b):
    (ma, ra, ca, _), (mb, rb, cb, _) = a, b
    assert ra == rb
    assert [(s, t) for s, t, _ in ca.curve] == [(s, t) for s, t, _ in cb.curve]
    assert all(np.array_equal(x, y) for (_, _, x), (_, _, y) in zip(ca.curve, cb.curve))
    assert ca.probes == cb.probes
    sa, sb = ma.state_dict(), mb.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_encode_round_trips_arrays_and_frames():
    import polars as pl

    obj = {"a": np.arange(6, dtype=np.uint32).reshape(2, 3), "f": pl.DataFrame({"x": [1, 2], "y": ["a", "b"]}).cast({"x": pl.Int16}),
           "l": [np.float64(1.5), (np.zeros(0, dtype=np.int64), "s")]}
    back = decode(encode(obj))
    assert back["a"].dtype == np.uint32 and np.array_equal(back["a"], obj["a"])
    assert back["f"].equals(obj["f"]) and back["f"].schema == obj["f"].schema
    assert back["l"][0] == 1.5 and back["l"][1][0].dtype == np.int64 and back["l"][1][1] == "s"


def test_stopped_and_resumed_run_equals_uninterrupted(corpus, tmp_path):
    store, _, _ = corpus
    order = np.random.default_rng(1).permutation(store.n_sequences)
    full = _run(store, order)
    ck_path = tmp_path / "ckpt.pt"
    _run(store, order, ck_path=ck_path, stop_after=7)  # checkpoints after steps 3 and 6; step 7 is lost
    assert ck_path.exists()
    resumed = _run(store, order, ck_path=ck_path)
    assert resumed[3].resumed_from == 6 and "at step 6 of 10" in resumed[2].messages[0]
    _same(full, resumed)
    assert ck_path.exists()  # the caller removes it once its outputs are written
    resumed[3].remove()
    assert not ck_path.exists()


def test_odm_sampler_resumes(corpus, tmp_path):
    store, seg, doc_cluster = corpus
    sc = sequence_clusters(seg, doc_cluster)
    full_sampler = ODMSampler(sc, SETTINGS.max_steps, seed=3, warmup_fraction=0.1)
    full = _run(store, None, sampler=full_sampler)
    ck_path = tmp_path / "ckpt.pt"
    _run(store, None, sampler=ODMSampler(sc, SETTINGS.max_steps, seed=3, warmup_fraction=0.1), ck_path=ck_path, every=4, stop_after=6)
    sampler = ODMSampler(sc, SETTINGS.max_steps, seed=3, warmup_fraction=0.1)
    resumed = _run(store, None, sampler=sampler, ck_path=ck_path, every=4)
    assert resumed[3].resumed_from == 4
    _same(full, resumed)
    assert np.array_equal(sampler.served_ids(), full_sampler.served_ids())
    assert sampler.mixture_rows().equals(full_sampler.mixture_rows())
    assert not np.allclose(sampler.rewards, 0)  # the rewards moved, and were restored


def test_checkpoint_of_other_settings_is_ignored(corpus, tmp_path):
    store, _, _ = corpus
    order = np.random.default_rng(1).permutation(store.n_sequences)
    ck_path = tmp_path / "ckpt.pt"
    _run(store, order, ck_path=ck_path, stop_after=4, key={"inputs": "v1"})
    other = TrainSettings(**{**SETTINGS.__dict__, "lr": 5e-3})
    fresh = _run(store, order, ck_path=ck_path, settings=other, key={"inputs": "v1"})
    assert fresh[3].resumed_from is None
    assert "other settings (differing: settings.lr)" in fresh[2].messages[0] and "training from step 0" in fresh[2].messages[0]
    _same(fresh, _run(store, order, settings=other))
    _run(store, order, ck_path=ck_path, stop_after=4, key={"inputs": "v1"})
    moved = _run(store, order, ck_path=ck_path, key={"inputs": "v2"})  # same settings, other input data
    assert moved[3].resumed_from is None and "differing: caller.inputs" in moved[2].messages[0]
    assert _run(store, order[::-1].copy(), ck_path=ck_path, stop_after=1)[2].messages[0].count("order_sha256") == 1


def test_sampler_without_state_is_refused(corpus, tmp_path):
    store, _, _ = corpus

    class Plain:
        def next_batch(self, b):
            return np.arange(b)

        def update(self, ids, losses):
            pass

    with pytest.raises(StrataInputError, match="cannot be checkpointed"):
        _run(store, None, sampler=Plain(), ck_path=tmp_path / "ckpt.pt")


# -- the training_runs asset, SIGKILLed in a real process ----------------------------------------
KILL_AT = 10  # the process kills itself during step 10, after the checkpoint of step 8
KILLING_RUN = """
import os, signal, sys
import pipeline.training.loop
from assets.cli import main

real, kill_odm = pipeline.training.loop.train, sys.argv[1] == "odm"


def train(*args, **kwargs):
    def on_step(row):
        if row["step"] + 1 == {kill_at} and (kwargs.get("sampler") is not None) == kill_odm:
            os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, on_step=on_step, **kwargs)


pipeline.training.loop.train = train  # before the run imports the training stage (pipeline/training/stage.py), which binds it
sys.exit(main(["run", "--config", sys.argv[2], "--select", "key:training_runs"]))
""".format(kill_at=KILL_AT)
TABLES = ("train_log", "heldout_curve", "consumed_metrics", "stable_rank", "epoch_jumps", "odm_mixture")


def _env() -> dict:
    return {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "STRATA_CONFIG": "", "PYTHONPATH": str(REPO)}


def _strata(cfg: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(cfg), *args], capture_output=True,
                          text=True, env=_env(), cwd=REPO, timeout=600)


def _killed(cfg: Path, strategy: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", KILLING_RUN, strategy, str(cfg)], capture_output=True, text=True,
                          env=_env(), cwd=REPO, timeout=600)


def _outputs(layout: Layout, strategy: str) -> dict:
    """Every file of the run directory (bytes) and the run's DuckDB rows (tokens_per_s, a wall-clock figure, left out)."""
    run_dir = layout.run_dir(strategy, 0)
    # digest records (pipeline/storage/atomic.py: sidecar) hold modification times, not artifact bytes
    files = {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file() and not is_sidecar(p)}
    rows = {}
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        present = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        for table in TABLES:
            if table in present:
                df = con.sql(f"SELECT * EXCLUDE (tokens_per_s) FROM {table}" if table == "train_log" else f"SELECT * FROM {table}")
                df = df.pl().filter((pl.col("strategy") == strategy) & (pl.col("seed") == 0))
                if df.height:
                    rows[table] = df.sort(df.columns)
    return {"files": files, "rows": rows}


def _assert_same(resumed: dict, reference: dict) -> None:
    assert resumed["files"].keys() == reference["files"].keys()
    differ = sorted(k for k in reference["files"] if resumed["files"][k] != reference["files"][k])
    assert not differ, f"files that differ from the uninterrupted run's: {differ}"
    assert resumed["rows"].keys() == reference["rows"].keys()
    for table, df in reference["rows"].items():
        assert resumed["rows"][table].equals(df), table


@pytest.fixture(scope="module")
def killed_runs(tmp_path_factory):
    """An uninterrupted materialization of training_runs (random, odm), then one killed per strategy and resumed.

    Returns (reference outputs, resumed outputs, the resuming processes' output, leftovers)."""
    tmp = tmp_path_factory.mktemp("resume")
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in demo_slice(70)))
    cfg = tmp / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({
        "data_root": str(tmp / "root"), "corpus": {"path": str(corpus), "source_field": "domain"}, "heldout_fraction": 0.1,
        "vocab_size": 300, "k": 3, "seq_len": 64, "length_bins": 4, "batch_size": 4, "embed_method": "shallow",
        "embed_max_tokens": 32, "strategies": ["random", "odm"], "max_steps": 16, "warmup_steps": 2, "heldout_docs": 8,
        "heldout_every": 3, "checkpoint_every": 4, "probe_batches": 1, "claims": {"probe_batches": 1}, "odm": {"warmup_fraction": 0.1},
    }))
    layout = Layout(tmp / "root")
    for args in (("--select", "*orderings"), ("--select", "key:training_runs")):
        proc = _strata(cfg, *args)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    reference = {s: _outputs(layout, s) for s in ("random", "odm")}
    shutil.rmtree(layout.inside("runs"))

    ckpt = {s: layout.run_dir(s, 0) / "ckpt.pt" for s in ("random", "odm")}
    first = _killed(cfg, "random")  # killed in random's step 10
    assert first.returncode == -signal.SIGKILL, first.stderr[-4000:]
    assert ckpt["random"].exists() and not (layout.run_dir("random", 0) / "model").exists()
    second = _killed(cfg, "odm")  # random resumes and finishes; killed in odm's step 10
    assert second.returncode == -signal.SIGKILL, second.stderr[-4000:]
    assert not ckpt["random"].exists() and ckpt["odm"].exists()
    resumed = {"random": _outputs(layout, "random")}
    third = _strata(cfg, "--select", "key:training_runs")  # random again from step 0, odm resumes
    assert third.returncode == 0, third.stdout[-2000:] + third.stderr[-4000:]
    resumed["odm"] = _outputs(layout, "odm")
    leftovers = sorted(str(p) for p in layout.inside("runs").rglob("*")
                       if (p.name.startswith(".") and not (is_sidecar(p) and sidecar_of(p).is_file())) or p.name == "ckpt.pt")
    return reference, resumed, {"random": second.stdout + second.stderr, "odm": third.stdout + third.stderr}, leftovers


@pytest.mark.integration
@pytest.mark.parametrize("strategy", ["random", "odm"])
def test_killed_training_run_resumes_to_identical_outputs(killed_runs, strategy):
    reference, resumed, logs, leftovers = killed_runs
    assert f"runs/{strategy}/seed0/ckpt.pt at step 8 of 16" in logs[strategy]
    assert logs[strategy].count("resuming from") == 1  # the other partition trained from step 0
    expected = {"train_log", "heldout_curve", "consumed_metrics", "stable_rank"} | ({"odm_mixture"} if strategy == "odm" else set())
    assert expected <= reference[strategy]["rows"].keys()
    _assert_same(resumed[strategy], reference[strategy])
    assert not leftovers


# -- the Hugging Face Trainer on the hf export ---------------------------------------------------
L, G, HF_VOCAB, MAX_STEPS, SAVE_STEPS, HF_KILL_AT = 32, 4, 500, 8, 3, 5
HF_SETUP = """
import os, signal, sys

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

EXPORT_DIR, OUTPUT_DIR, SEEN, KILL_AT = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
G, MAX_STEPS, SAVE_STEPS = {G}, {max_steps}, {save_steps}
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size={vocab}, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings={L}))
seen = []


def record(module, args, kwargs):  # the rows every forward pass sees; the process kills itself in forward KILL_AT
    seen.append(kwargs["input_ids"].cpu().numpy())
    np.save(SEEN, np.stack(seen))
    if len(seen) == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)


model.register_forward_pre_hook(record, with_kwargs=True)
""".format(G=G, max_steps=MAX_STEPS, save_steps=SAVE_STEPS, vocab=HF_VOCAB, L=L)


def docs_recipe() -> str:
    """docs/training.md's HF Trainer resume recipe: its python block that resumes from a checkpoint."""
    text = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "resume_from_checkpoint" in b]
    assert len(blocks) == 1, "docs/training.md holds one HF Trainer resume recipe"
    return blocks[0]


def test_hf_trainer_resumes_at_position_n_times_g(tmp_path):
    pytest.importorskip("datasets")
    from pipeline.export import export_stream, stream_from_arrays
    from pipeline.packing.pack import pack

    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 60, size=120)
    tokens = rng.integers(2, HF_VOCAB, size=int(lengths.sum())).astype(np.uint16)
    offsets = np.r_[0, np.cumsum(lengths)]
    tokens[offsets[1:] - 1] = EOS
    packing = pack("concat", np.arange(lengths.size), lengths, L, seed=0)
    order = rng.permutation(packing.n_sequences)
    assert order.size >= MAX_STEPS * G  # one epoch: the Trainer's step s reads rows [s·G, (s+1)·G)
    export = tmp_path / "hf"
    export_stream(stream_from_arrays(tokens, offsets, packing.segments, order, L, eos_id=EOS, pad_id=PAD), "hf", export, global_batch=G)
    want = SequenceStore(tokens, offsets, packing.segments, L, pad_id=PAD).batch(order[: MAX_STEPS * G])[0]

    script = HF_SETUP + docs_recipe()
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    out = tmp_path / "run"

    def run(seen: Path, kill_at: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", script, str(export), str(out), str(seen), str(kill_at)],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)

    killed = run(tmp_path / "killed.npy", HF_KILL_AT)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{SAVE_STEPS}"]
    before = np.load(tmp_path / "killed.npy")
    np.testing.assert_array_equal(before.reshape(-1, L), want[: HF_KILL_AT * G])

    resumed = run(tmp_path / "resumed.npy", 0)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    after = np.load(tmp_path / "resumed.npy")
    assert after.shape == (MAX_STEPS - SAVE_STEPS, G, L)
    np.testing.assert_array_equal(after.reshape(-1, L), want[SAVE_STEPS * G :])  # positions [N·G, MAX_STEPS·G)
    rows = np.array(pq.read_table(sorted((export / "data").glob("*.parquet"))[0])["input_ids"].to_pylist())
    np.testing.assert_array_equal(after.reshape(-1, L), rows[SAVE_STEPS * G : MAX_STEPS * G])
