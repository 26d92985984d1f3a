"""Reliability of the whole tool: bad input through the CLI, kill-and-rerun, concurrent DuckDB
writers, byte-identical reruns, lineage, and the security rules.

The graph tests run ``python -m assets.cli run`` in subprocesses on a ~150-document slice of the
demo corpus with the smallest settings that still exercise every asset.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import polars as pl
import pytest
import yaml
from helpers import demo_slice

from pipeline.data.corpus import content_hashes, heldout_mask
from pipeline.errors import StrataInputError
from pipeline.storage.layout import Layout
from pipeline.storage.warehouse import replace_rows, write_lineage

REPO = Path(__file__).resolve().parents[1]
N_DOCS = 150
HUGE_BYTES = 2_000_000
# Artifacts compared byte for byte. Excluded: the DuckDB file (timestamps, run ids, wall times),
# the Dagster instance, and lm-eval's working caches.
EXCLUDE_TOP = {"strata.duckdb", "strata.duckdb.wal", "dagster", "lm_eval"}


def _cfg(root: Path, corpus_path: Path, **extra) -> dict:
    cfg = {
        "data_root": str(root),
        "corpus": {"path": str(corpus_path), "source_field": "domain"},
        "heldout_fraction": 0.05,
        "vocab_size": 300,
        "k": 4,
        "seq_len": 64,
        "length_bins": 4,
        "strategies": ["random"],
        "batch_size": 4,
        "max_steps": 2,
        "warmup_steps": 1,
        "eval_limit": 1,
        "embed_max_tokens": 32,
        # the 2 MB document is other documents' texts repeated: the clean stage would rightly take it
        # out (held-out overlap, a semantic duplicate); here it must reach the packing
        "dedup": {"enabled": False},
        "decontam": {"enabled": False},
    }
    for key, value in extra.items():
        if key == "corpus":
            cfg["corpus"].update(value)
        else:
            cfg[key] = value
    return cfg


def _write_cfg(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def _env(cfg_path: Path) -> dict:
    env = {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "PYTHONPATH": str(REPO)}
    env.pop("STRATA_CONFIG", None)  # the CLI's --config alone must configure everything
    return env


def _strata(args: list[str], cfg_path: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "assets.cli", *args], capture_output=True, text=True,
                          env=_env(cfg_path), cwd=REPO, timeout=timeout)


def _artifact_hashes(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and rel.parts[0] not in EXCLUDE_TOP and not any(part.startswith(".") for part in rel.parts):
            out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _huge_document(records: list[dict]) -> dict:
    """~2 MB of real text whose content hash puts it in the training split (not the held-out one)."""
    body = "\n\n".join(r["text"] for r in records)
    text = (body * (HUGE_BYTES // len(body) + 1))[:HUGE_BYTES]
    for salt in range(1000):
        candidate = f"{text}\n{salt}"
        if not heldout_mask(content_hashes(pl.Series([candidate])), 0.05, 0)[0]:
            return {"id": "huge", "text": candidate, "domain": "huge", "source": "huge"}
    raise AssertionError("no training-split salt found")


BAD_LINES = [  # (line, reason) — each must be skipped under on_error: skip
    '{"id": "bad-json", "text": "unterminated',
    json.dumps({"id": "no-text", "body": "the text is under another key"}),
    json.dumps({"id": "int-text", "text": 12345}),
    json.dumps({"id": "empty", "text": ""}),
    json.dumps({"id": "blank", "text": "   \n\t "}),
    "[1, 2, 3]",
]
INVALID_UTF8 = b'{"id": "latin1", "text": "caf\xe9 cr\xe8me"}'


@pytest.fixture(scope="module")
def corpus_with_bad_records(tmp_path_factory) -> tuple[Path, list[dict]]:
    """Demo documents + one 2 MB document, with every kind of bad record interleaved."""
    tmp = tmp_path_factory.mktemp("corpus")
    records = demo_slice(N_DOCS)
    path = tmp / "corpus.jsonl"
    with open(path, "wb") as fh:
        for i, rec in enumerate(records):
            fh.write((json.dumps(rec) + "\n").encode())
            if i % 20 == 3 and i // 20 < len(BAD_LINES):
                fh.write((BAD_LINES[i // 20] + "\n").encode())
        fh.write(INVALID_UTF8 + b"\n")
        fh.write((json.dumps(_huge_document(records[:40])) + "\n").encode())
    return path, records


# -- the real graph: skip policy, determinism, kill and rerun -------------------------------------
@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, corpus_with_bad_records):
    corpus, _ = corpus_with_bad_records
    tmp = tmp_path_factory.mktemp("ref")
    cfg_path = _write_cfg(tmp / "cfg.yaml", _cfg(tmp / "root", corpus, corpus={"on_error": "skip"}))
    proc = _strata(["run", "--config", str(cfg_path)], cfg_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return tmp / "root", cfg_path, proc


@pytest.mark.integration
def test_skip_policy_runs_and_reports_skipped(reference_run):
    root, _, proc = reference_run
    n_bad = len(BAD_LINES) + 1
    assert f"skipped {n_bad} bad records" in proc.stdout + proc.stderr
    with duckdb.connect(str(root / "strata.duckdb"), read_only=True) as con:
        counts = json.loads(con.execute("SELECT row_counts FROM lineage WHERE asset = 'corpus'").fetchone()[0])
    assert counts["skipped"] == n_bad
    assert counts["train_docs"] + counts["heldout_docs"] == N_DOCS + 1  # + the 2 MB document


@pytest.mark.integration
def test_enormous_document_is_packed_whole(reference_run):
    layout = Layout(reference_run[0])
    docs = pl.read_parquet(layout.documents)
    huge = docs.filter(pl.col("id") == "huge")
    assert huge.height == 1 and huge["n_bytes"][0] > HUGE_BYTES
    seg = pl.read_parquet(layout.segments)
    spans = seg.filter(pl.col("doc_id") == huge["doc_id"][0])
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        dropped = dict(con.execute("SELECT metric, value FROM packing_stats").fetchall())["tokens_dropped"]
    assert spans.height > huge["n_tokens"][0] // 64  # spread over as many sequences as it needs
    assert int(spans["n_tokens"].sum()) >= huge["n_tokens"][0] + 1 - dropped  # its whole stream, but a reported tail


@pytest.fixture(scope="module")
def killed_then_rerun(tmp_path_factory, reference_run):
    """A second data root: ``strata run`` SIGKILLed once the token store exists, then run again.

    Returns (root, hashes of the files visible right after the kill). The rerun re-materializes
    every asset, so its artifacts also answer "do two runs give identical bytes?" (one graph run
    fewer than a separate determinism run: these runs dominate the test time).
    """
    ref_root, ref_cfg, _ = reference_run
    tmp = tmp_path_factory.mktemp("killed")
    cfg = yaml.safe_load(ref_cfg.read_text())
    cfg["data_root"] = str(tmp / "root")
    cfg_path = _write_cfg(tmp / "cfg.yaml", cfg)
    layout = Layout(tmp / "root")
    proc = subprocess.Popen([sys.executable, "-m", "assets.cli", "run", "--config", str(cfg_path)], env=_env(cfg_path),
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while not layout.doc_offsets.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = _artifact_hashes(layout.root)
    rerun = _strata(["run", "--config", str(cfg_path)], cfg_path)
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    return layout.root, partial


@pytest.mark.integration
def test_sigkill_leaves_no_partial_artifact(reference_run, killed_then_rerun):
    _, partial = killed_then_rerun
    reference = _artifact_hashes(reference_run[0])
    assert partial and "report.md" not in partial
    # Every visible file the killed run left is complete: byte-identical to the finished run's.
    torn = sorted(k for k in partial if reference.get(k) != partial[k])
    assert not torn, f"partial files visible after SIGKILL: {torn}"


@pytest.mark.integration
def test_rerun_after_kill_and_second_run_give_identical_bytes(reference_run, killed_then_rerun):
    root, _ = killed_then_rerun
    reference, final = _artifact_hashes(reference_run[0]), _artifact_hashes(root)
    assert final.keys() == reference.keys()
    differ = sorted(k for k in final if final[k] != reference[k])
    assert not differ, f"nondeterministic artifacts: {differ}"
    # Hidden files left are temporaries (never a plausible artifact name), Strata's own markers of a
    # data root and an export, the run's log, or the digest records of files that are there and match them.
    from pipeline.storage.atomic import is_sidecar, record_mismatch, sidecar_of

    marks = (".strata-root", ".strata-export", ".strata-run.lock")
    leftovers = [p for p in root.rglob(".*") if "dagster" not in p.parts and ".logs" not in p.relative_to(root).parts
                 and p.name not in marks]
    records = [p for p in leftovers if is_sidecar(p)]
    assert records and all(sidecar_of(p).is_file() and record_mismatch(sidecar_of(p)) is None for p in records)
    assert all(p.name.endswith((".tmp", ".old")) for p in leftovers if p not in records), leftovers


# -- bad input through the CLI: exit code 2, file, line, fix -------------------------------------
# Every case fails before any heavy stage, so all of them run as concurrent subprocesses.
_DUP = json.dumps({"id": "placeholder", "text": "another text under a taken id"}).encode()
BAD_CASES: dict[str, tuple[list[bytes], dict]] = {
    "malformed-json": ([BAD_LINES[0].encode()], {}),
    "missing-text": ([BAD_LINES[1].encode()], {}),
    "non-string-text": ([BAD_LINES[2].encode()], {}),
    "empty": ([BAD_LINES[3].encode()], {}),
    "whitespace": ([BAD_LINES[4].encode()], {}),
    "not-an-object": ([BAD_LINES[5].encode()], {}),
    "invalid-utf8": ([INVALID_UTF8], {}),
    "duplicate-id": ([_DUP], {}),
    "duplicate-id-after-blank-lines": ([b"", b"", _DUP], {}),
    "seq_len-1": ([], {"seq_len": 1}),
    "unknown-strategy": ([], {"strategies": ["random", "sorted_by_vibes"]}),
    "k-too-large": ([], {"k": 500}),
    "truncated-gz": ([], {}),
    "directory": ([], {}),
}


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path, Path]]:
    import gzip

    records = demo_slice(12)
    good = [json.dumps(r).encode() for r in records]
    procs = {}
    for name, (lines, extra) in BAD_CASES.items():
        tmp = tmp_path_factory.mktemp(name)
        corpus = tmp / "corpus.jsonl"
        lines = [line.replace(b"placeholder", records[0]["id"].encode()) for line in lines]
        corpus.write_bytes(b"\n".join(good[:5] + lines + good[5:]) + b"\n")
        if name == "truncated-gz":
            corpus = tmp / "corpus.jsonl.gz"
            corpus.write_bytes(gzip.compress((b"\n".join(good) + b"\n") * 20)[:-200])
        elif name == "directory":  # a directory is a corpus of shards; one without any is an error
            corpus = tmp / "empty"
            corpus.mkdir()
        cfg_path = _write_cfg(tmp / "cfg.yaml", _cfg(tmp / "root", corpus, **extra))
        procs[name] = (subprocess.Popen([sys.executable, "-m", "assets.cli", "run", "--config", str(cfg_path)], env=_env(cfg_path),
                                        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), corpus, cfg_path)
    out = {}
    for name, (proc, corpus, cfg_path) in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        out[name] = (subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), corpus, cfg_path)
    return out


def _error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    msg = proc.stderr.strip().splitlines()[-1]
    assert msg.startswith("strata: error: ") and "Fix: " in msg, msg
    return msg


@pytest.mark.parametrize(
    "case, problem",
    [
        ("malformed-json", "malformed JSON"),
        ("missing-text", "missing text field 'text'"),
        ("non-string-text", "is int, not a string"),
        ("empty", "empty or whitespace"),
        ("whitespace", "empty or whitespace"),
        ("not-an-object", "not a JSON object"),
        ("invalid-utf8", "invalid UTF-8"),
    ],
)
@pytest.mark.integration
def test_bad_record_fails_with_file_line_and_fix(bad_runs, case, problem):
    proc, corpus, _ = bad_runs[case]
    msg = _error_line(proc)
    assert f"{corpus}, line 6: " in msg and problem in msg, msg


@pytest.mark.integration
def test_duplicate_ids_fail_naming_the_id(bad_runs):
    proc, corpus, _ = bad_runs["duplicate-id"]
    msg = _error_line(proc)
    assert str(corpus) in msg and "duplicate document id" in msg and "records [1, 6]" in msg, msg


@pytest.mark.integration
def test_duplicate_ids_name_file_lines(bad_runs):
    proc, _, _ = bad_runs["duplicate-id-after-blank-lines"]
    assert "[1, 8]" in _error_line(proc)  # lines 6 and 7 are blank


@pytest.mark.integration
@pytest.mark.parametrize("case, expected", [("truncated-gz", "cannot read the corpus file"), ("directory", "holds no shard files")])
def test_unreadable_corpus_fails_clearly(bad_runs, case, expected):
    proc, corpus, _ = bad_runs[case]
    msg = _error_line(proc)
    assert str(corpus) in msg and expected in msg, msg


@pytest.mark.parametrize("case, expected", [("seq_len-1", "seq_len=1"), ("unknown-strategy", "sorted_by_vibes"),
                                            ("k-too-large", "k=500 clusters for")])
@pytest.mark.integration
def test_impossible_parameters_fail_with_fix(bad_runs, case, expected):
    assert expected in _error_line(bad_runs[case][0])


@pytest.mark.integration
def test_impossible_config_names_the_file(bad_runs):
    proc, _, cfg_path = bad_runs["seq_len-1"]
    assert str(cfg_path) in _error_line(proc)


@pytest.mark.integration
def test_config_strategies_respected(tmp_path, reference_run):
    """--config alone decides the strategy partitions, and nothing is written outside the data root."""
    steps = [line for line in reference_run[2].stdout.splitlines() if line.startswith("==> materializing")]
    assert any("[random]" in line for line in steps) and not any("[greedy]" in line for line in steps)
    cfg_path = _write_cfg(tmp_path / "cfg.yaml", _cfg(tmp_path / "root", tmp_path / "c.jsonl", strategies=["greedy"]))
    probe = (
        "import dagster as dg, assets.cli; from assets.runner import prepare_environment; from assets.common import sync_partitions; "
        f"cfg = prepare_environment({str(cfg_path)!r}, None); from assets.definitions import defs; "
        "inst = dg.DagsterInstance.get(); sync_partitions(inst, cfg); "
        "print(defs.resolve_asset_graph().get(dg.AssetKey('orderings')).partitions_def.get_partition_keys(dynamic_partitions_store=inst))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=_env(cfg_path), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "['greedy']" and not (tmp_path / ".strata").exists(), proc.stdout


# -- DuckDB: two writer processes -----------------------------------------------------------------
_WRITER = textwrap.dedent(
    """
    import sys, polars as pl
    from pipeline.storage.duck import duck_connection
    from pipeline.storage.warehouse import replace_rows, write_lineage
    db, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    for i in range(n):
        with duck_connection(db) as con:
            write_lineage(con, asset=f"a_{who}", partition=str(i), run_id=who, code_version="1", data_version=f"{who}{i}",
                          input_versions={}, outputs={}, row_counts={"i": i}, parameters={}, wall_s=0.0)
        with duck_connection(db) as con:
            replace_rows(con, "stats", pl.DataFrame({"who": [who] * 50, "i": [i] * 50, "v": list(range(50))}), {"who": who})
    """
)


def test_two_processes_write_duckdb_without_loss(tmp_path):
    db = tmp_path / "strata.duckdb"
    n = 25
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(db), who, str(n)], cwd=REPO, stderr=subprocess.PIPE, text=True)
             for who in ("p", "q")]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
    with duckdb.connect(str(db), read_only=True) as con:
        per_writer = dict(con.execute("SELECT run_id, count(*) FROM lineage GROUP BY 1").fetchall())
        stats = con.execute("SELECT who, count(*), min(i), max(i) FROM stats GROUP BY 1 ORDER BY 1").fetchall()
        versions = con.execute("SELECT count(DISTINCT data_version) FROM lineage").fetchone()[0]
    assert per_writer == {"p": n, "q": n} and versions == 2 * n
    assert stats == [("p", 50, n - 1, n - 1), ("q", 50, n - 1, n - 1)]  # replace_rows kept exactly the last write


def test_replace_rows_replaces_the_key_or_the_whole_table_and_adds_new_columns():
    con = duckdb.connect()
    replace_rows(con, "t", pl.DataFrame({"s": ["a", "b"], "v": [1, 2]}), {})
    replace_rows(con, "t", pl.DataFrame({"s": ["a"], "v": [3]}), {"s": "a"})
    assert sorted(con.execute("SELECT s, v FROM t").fetchall()) == [("a", 3), ("b", 2)]
    replace_rows(con, "t", pl.DataFrame({"s": ["c"], "v": [4], "extra": [0.5]}), {})  # empty key: every row goes
    assert con.execute("SELECT s, v, extra FROM t").fetchall() == [("c", 4, 0.5)]
    replace_rows(con, "t", pl.DataFrame({"s": ["d"], "v": [5]}), {"s": "d"})
    assert sorted(con.execute("SELECT s, extra FROM t").fetchall()) == [("c", 0.5), ("d", None)]


def test_plain_connect_conflicts_while_another_process_writes(tmp_path):
    """Why connect_with_retry exists: DuckDB refuses a second process while one holds the file."""
    db = tmp_path / "x.duckdb"
    holder = subprocess.Popen([sys.executable, "-c",
                               f"import duckdb,time; c=duckdb.connect({str(db)!r}); print('held', flush=True); time.sleep(3)"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(duckdb.IOException, match="[Ll]ock"):
        duckdb.connect(str(db))
    from pipeline.storage.duck import connect_with_retry

    con = connect_with_retry(db)  # waits until the holder exits
    con.execute("CREATE TABLE t AS SELECT 1 AS x")
    con.close()
    holder.wait(timeout=30)


# -- lineage --------------------------------------------------------------------------------------
def _populate(con, corpus_version: str = "c1") -> None:
    def row(asset, version, inputs, partition=None, params=None):
        write_lineage(con, asset=asset, partition=partition, run_id=f"run-{asset}-{version}", code_version="1",
                      data_version=version, input_versions=inputs, outputs={f"/data/{asset}.parquet": "ab" * 32},
                      row_counts={"rows": 3}, parameters=params or {}, wall_s=0.5)
        time.sleep(0.002)  # distinct created_at

    row("corpus", corpus_version, {}, params={"corpus": "/data/c.jsonl"})
    row("tokenizer", "t1", {"corpus": corpus_version}, params={"vocab_size": 300})
    row("tokens", "k1", {"corpus": corpus_version, "tokenizer": "t1"})
    row("embeddings", "e1", {"corpus": corpus_version}, params={"model": "all-MiniLM-L6-v2"})
    row("clusters", "cl1", {"embeddings": "e1"}, params={"k": 4})
    row("sequences", "s1", {"tokens": "k1", "clusters": "cl1"}, params={"seq_len": 64})
    row("orderings", "o1", {"sequences": "s1"}, partition="greedy", params={"strategy": "greedy"})
    row("training_runs", "r1", {"orderings": "o1"}, partition="greedy")


def test_lineage_resolves_to_corpus_version_code_and_params(tmp_path):
    from pipeline.storage.lineage import lineage_of, upstream_summary

    with duckdb.connect(str(tmp_path / "s.duckdb")) as con:
        _populate(con)
        tree = lineage_of(con, "training_runs", "greedy")
    assert tree["data_version"] == "r1" and tree["run_id"] == "run-training_runs-r1"
    seq = tree["inputs"]["orderings"]["inputs"]["sequences"]
    assert seq["parameters"] == {"seq_len": 64} and set(seq["inputs"]) == {"tokens", "clusters"}
    corpus = seq["inputs"]["clusters"]["inputs"]["embeddings"]["inputs"]["corpus"]
    assert corpus["data_version"] == "c1" and corpus["parameters"] == {"corpus": "/data/c.jsonl"}
    summary = upstream_summary(tree)
    assert set(summary) == {"training_runs[greedy]", "orderings[greedy]", "sequences", "tokens", "tokenizer", "clusters",
                            "embeddings", "corpus"}
    assert not any(v["stale"] for v in summary.values())


def test_lineage_marks_stale_and_missing_inputs(tmp_path):
    from pipeline.storage.lineage import lineage_of

    with duckdb.connect(str(tmp_path / "s.duckdb")) as con:
        _populate(con)
        write_lineage(con, asset="corpus", partition=None, run_id="new", code_version="1", data_version="c2",
                      input_versions={}, outputs={}, row_counts={}, parameters={}, wall_s=0.1)
        write_lineage(con, asset="report", partition=None, run_id="x", code_version="2", data_version="z",
                      input_versions={"training_runs": "gone"}, outputs={}, row_counts={}, parameters={}, wall_s=0.1)
        emb = lineage_of(con, "embeddings")
        report = lineage_of(con, "report")
        with pytest.raises(StrataInputError, match="no lineage recorded for nothing.*clusters"):
            lineage_of(con, "nothing")
    assert emb["inputs"]["corpus"]["data_version"] == "c1" and emb["inputs"]["corpus"]["stale"] is True
    assert report["inputs"]["training_runs"] == {"asset": "training_runs", "data_version": "gone", "missing": True}


def test_lineage_command_prints_tree(tmp_path, capsys):
    import argparse

    from pipeline.cli import tools

    with duckdb.connect(str(tmp_path / "strata.duckdb")) as con:
        _populate(con)
    parser = argparse.ArgumentParser()
    tools.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["lineage", "training_runs", "--partition", "greedy", "--data-root", str(tmp_path)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    for needle in ("training_runs[greedy]", "orderings[greedy]", "corpus data c1", '"seq_len": 64', "/data/corpus.parquet"):
        assert needle in out, out
    args = parser.parse_args(["lineage", "clusters", "--data-root", str(tmp_path), "--json"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["embeddings"]["data_version"] == "e1"
    with pytest.raises(StrataInputError, match="no strata.duckdb"):
        args = parser.parse_args(["lineage", "clusters", "--data-root", str(tmp_path / "nowhere")])
        args.func(args)


@pytest.mark.integration
def test_lineage_of_a_real_run(reference_run):
    from pipeline.storage.lineage import lineage_of, upstream_summary

    root, _, _ = reference_run
    with duckdb.connect(str(root / "strata.duckdb"), read_only=True) as con:
        tree = lineage_of(con, "training_runs", "0|random")
    summary = upstream_summary(tree)
    assert {"corpus", "tokens", "embeddings", "centroids", "clusters", "sequences", "orderings[random]"} <= set(summary)
    assert any(k.startswith("token_shards[") for k in summary) and any(k.startswith("cluster_shards[") for k in summary), summary
    assert not any(v.get("missing") for v in summary.values()), summary
    assert summary["centroids"]["parameters"]["k"] == 4


# -- security -------------------------------------------------------------------------------------
def _python_sources() -> list[Path]:
    skip = {".git", ".strata", "__pycache__", ".venv"}
    return [p for p in REPO.rglob("*.py") if not skip & set(p.relative_to(REPO).parts)]


def test_no_pickle_loading():
    pattern = re.compile(r"allow_pickle\s*=\s*True|\bpickle\.loads?\(|torch\.load\((?![^)]*weights_only\s*=\s*True)")
    hits = [f"{p}:{i}" for p in _python_sources() for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits


def test_trust_remote_code_only_by_opt_in():
    pattern = re.compile(r"trust_remote_code\s*=\s*True")
    hits = [f"{p}:{i}" for p in _python_sources() for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits


@pytest.mark.parametrize("parts", [("..", "x"), ("orderings", "../../etc/passwd"), ("/etc", "passwd"), ("a/../../b",)])
def test_layout_refuses_escaping_paths(tmp_path, parts):
    layout = Layout(tmp_path / "root")
    with pytest.raises(StrataInputError, match="escapes the data root"):
        layout.inside(*parts)


def test_layout_refuses_symlink_escape_and_strategy_names(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "runs").symlink_to(tmp_path)
    layout = Layout(root)
    with pytest.raises(StrataInputError, match="escapes"):
        layout.run_dir("x", 0)
    for bad in ("../../evil", "/abs"):
        with pytest.raises(StrataInputError):
            layout.ordering(bad)
    assert layout.inside("orderings", "random.parquet") == (root / "orderings" / "random.parquet").resolve()


def test_ui_binds_localhost_by_default():
    text = (REPO / "README.md").read_text()
    assert re.findall(r"dagster dev\b[^\n]*", text) and all("-h 127.0.0.1" in c for c in re.findall(r"dagster dev\b[^\n`]*", text))


def test_two_runs_started_together_on_a_fresh_root_both_succeed(tmp_path):
    """Two ``strata run`` started at once on a new data root: one sets up the Dagster instance and
    materializes while the other says whom it waits for, then finds the artifacts fresh. Neither
    dies in SQLite, and no traceback reaches the terminal."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": r["text"], "domain": r["domain"]}) + "\n"
                              for i, r in enumerate(demo_slice(40))))
    root = tmp_path / "root"
    cfg = _write_cfg(tmp_path / "cfg.yaml", _cfg(root, corpus))
    cmd = [sys.executable, "-m", "assets.cli", "run", "--config", str(cfg), "--select", "corpus"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(cfg), cwd=REPO)
             for _ in range(3)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and "Traceback" not in err + out, err[-3000:]
    assert any("waiting for strata run" in err for _, err in outs)
    assert (root / "corpus.parquet").is_file()
