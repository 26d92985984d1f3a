"""Hostile but realistic input (issue 49): paths that would destroy what Strata did not write, bit
rot in artifacts, text and configs that crashed, values that cannot fit the machine. Each case runs
the library function or the CLI's ``main()`` in-process on a small input and asserts exit 2 (or the
right result), the message with its fix, and that every file that was there before survived.
docs/reliability.md ("Hostile input") lists the promises and the test of each."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from export_root import build_root, write_ordering

from pipeline.errors import StrataInputError

L = 32


def _snapshot(d: Path) -> dict[str, str]:
    """SHA-256 of every file under ``d`` (symlinks not followed)."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file() and not p.is_symlink()}


def _survived(before: dict[str, str], d: Path) -> None:
    after = _snapshot(d)
    lost = {k for k in before if after.get(k) != before[k]}
    assert not lost, f"files lost or changed: {sorted(lost)[:5]}"


@pytest.fixture(scope="module")
def export_root(tmp_path_factory) -> Path:
    """A small data root with a `greedy` ordering (a permutation of its sequences) and a config."""
    base = tmp_path_factory.mktemp("hostile")
    root = base / "root"
    _, segments, _ = build_root(root, L)
    n = int(segments["sequence_id"].max()) + 1
    write_ordering(root, "greedy", np.random.default_rng(0).permutation(n))
    (base / "cfg.yaml").write_text(f"seq_len: {L}\nbatch_size: 4\n")
    return root


def _export(root: Path, out, *extra: str, strategy: str = "greedy") -> list[str]:
    return ["export", "--data-root", str(root), "--config", str(root.parent / "cfg.yaml"), "--strategy", strategy,
            "--format", "numpy", "--out", str(out), *extra]


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    from assets.cli import main

    capsys.readouterr()
    rc = main(argv)
    return rc, capsys.readouterr().err


# --------------------------------------------------------------------------- 1. nothing lost


def test_export_refuses_a_foreign_directory_and_keeps_its_files(export_root, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("a user's notes\n")
    before = _snapshot(out)
    rc, err = _run(capsys, _export(export_root, out))
    assert rc == 2 and "not empty" in err and "notes.txt" in err and "Fix:" in err and "--force" in err
    assert "Traceback" not in err
    _survived(before, out)
    # --force is the user's explicit choice: then the folder becomes an export
    rc, _ = _run(capsys, _export(export_root, out, "--force"))
    assert rc == 0 and (out / "tokens.bin").is_file() and not (out / "notes.txt").exists()


def test_export_into_its_own_export_again_works(export_root, tmp_path, capsys):
    from pipeline.export.writer import EXPORT_MARKER

    out = tmp_path / "exp"
    assert _run(capsys, _export(export_root, out))[0] == 0
    assert (out / EXPORT_MARKER).is_file()
    first = (out / "tokens.bin").read_bytes()
    assert _run(capsys, _export(export_root, out))[0] == 0  # marked as Strata's own: replaced without --force
    assert (out / "tokens.bin").read_bytes() == first


@pytest.mark.parametrize("where", ["parent", "cwd", "store", "root", "file"])
def test_export_refuses_paths_it_would_destroy(export_root, tmp_path, capsys, monkeypatch, where):
    work = tmp_path / "work" / "sub"
    work.mkdir(parents=True)
    (tmp_path / "work" / "keep.txt").write_text("keep\n")
    (work / "existing-file.txt").write_text("mine\n")
    monkeypatch.chdir(work)
    out = {"parent": "..", "cwd": ".", "store": str(export_root / "tokens"), "root": str(export_root),
           "file": "existing-file.txt"}[where]
    before_work, before_root = _snapshot(tmp_path / "work"), _snapshot(export_root)
    rc, err = _run(capsys, _export(export_root, out, "--force"))  # not even with --force
    assert rc == 2 and "Fix:" in err and "Traceback" not in err
    assert {"parent": "folder above", "cwd": "current directory", "store": "data root's stores", "root": "data root",
            "file": "existing file"}[where] in err
    _survived(before_work, tmp_path / "work")
    _survived(before_root, export_root)
    assert (work / "existing-file.txt").read_text() == "mine\n"


def test_empty_data_root_and_a_file_as_data_root_are_refused(export_root, tmp_path, capsys):
    from pipeline.config import config_from_dict

    with pytest.raises(StrataInputError, match="data_root"):
        config_from_dict({"data_root": ""})
    (tmp_path / "cfg.yaml").write_text('data_root: ""\n')
    rc, err = _run(capsys, ["export", "--config", str(tmp_path / "cfg.yaml"), "--strategy", "greedy", "--format", "numpy",
                            "--out", str(tmp_path / "o")])
    assert rc == 2 and "data_root" in err and str(tmp_path / "cfg.yaml") in err
    a_file = tmp_path / "root.txt"
    a_file.write_text("not a folder\n")
    rc, err = _run(capsys, ["export", "--data-root", str(a_file), "--strategy", "greedy", "--format", "numpy",
                            "--out", str(tmp_path / "o")])
    assert rc == 2 and "is a file" in err and str(a_file) in err and a_file.read_text() == "not a folder\n"


def test_unwritable_data_root_is_a_clean_error(tmp_path):
    from pipeline.storage.layout import check_data_root

    (tmp_path / "f").write_text("x")
    with pytest.raises(StrataInputError, match="cannot be written"):
        check_data_root(tmp_path / "f" / "root")  # its parent is a file: nothing can be created there
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        probe = ro / "probe"
        try:
            probe.write_text("")
            probe.unlink()
            writable = True  # root ignores the mode bits
        except OSError:
            writable = False
        if not writable:
            with pytest.raises(StrataInputError, match="cannot be written"):
                check_data_root(ro)
    finally:
        ro.chmod(0o755)


def test_data_root_inside_the_corpus_is_never_read_as_corpus(tmp_path):
    import polars as pl

    from pipeline.data.shards import discover_shards
    from pipeline.storage.layout import check_data_root

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pl.DataFrame({"id": ["a"], "text": ["hello"]}).write_parquet(corpus / "part-0.parquet")
    for name in (".strata", "strata-root"):  # hidden or not, a data root below the corpus folder
        root = check_data_root(corpus / name)
        (root / "corpus" / "shards").mkdir(parents=True)
        pl.DataFrame({"id": ["b"], "text": ["validated"]}).write_parquet(root / "corpus" / "shards" / "x.parquet")
        (root / "report.jsonl").write_text('{"text": "a report"}\n')
    expected = [(corpus / "part-0.parquet").resolve()]
    assert discover_shards(str(corpus)) == expected
    assert discover_shards(str(corpus / "**" / "*.parquet")) == expected
    assert discover_shards(str(corpus / "**")) == expected
    with pytest.raises(StrataInputError, match="inside the Strata data root"):
        discover_shards(str(corpus / "strata-root" / "corpus" / "shards" / "x.parquet"))
    with pytest.raises(StrataInputError, match="data root"):
        discover_shards(str(corpus / "strata-root"))


# --------------------------------------------------------------------------- 2. nothing silently wrong


def _flip_byte(path: Path, at: int = -40) -> None:
    """One byte changed in place, the size and the modification time kept (what bit rot looks like)."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    with open(path, "r+b") as fh:
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


@pytest.fixture
def recorded_root(export_root, tmp_path) -> Path:
    """A copy of the export root whose segments and token store Strata wrote (their SHA-256 recorded)."""
    import shutil

    import polars as pl

    from pipeline.data.token_index import write_single_run
    from pipeline.storage.atomic import write_parquet
    from pipeline.storage.layout import Layout

    root = tmp_path / "root"
    shutil.copytree(export_root, root)
    (tmp_path / "cfg.yaml").write_text((export_root.parent / "cfg.yaml").read_text())
    lay = Layout(root)
    write_parquet(pl.read_parquet(lay.segments), lay.segments)
    tokens = np.fromfile(root / "tokens" / "store.bin", dtype=np.uint16)
    write_single_run(tokens, lay.tokens)
    return root


@pytest.mark.parametrize("victim", ["sequences/segments.parquet", "tokens/store.bin"])
def test_a_flipped_byte_in_an_input_stops_the_export(recorded_root, tmp_path, capsys, victim):
    out = tmp_path / "out"
    assert _run(capsys, _export(recorded_root, out))[0] == 0
    exported = _snapshot(out)
    _flip_byte(recorded_root / victim)
    rc, err = _run(capsys, _export(recorded_root, out))
    assert rc == 2 and victim.split("/")[-1] in err and "changed on disk" in err and "Fix:" in err
    _survived(exported, out)  # the previous export is left as it was


def test_a_corrupt_file_with_a_new_mtime_is_never_recorded_as_the_truth(recorded_root):
    from pipeline.storage.atomic import file_sha256, recorded_sha256
    from pipeline.storage.integrity import verify_ordering_inputs
    from pipeline.storage.layout import Layout

    seg = Layout(recorded_root).segments
    before = recorded_sha256(seg)
    data = bytearray(seg.read_bytes())
    data[-40] ^= 0x01
    with open(seg, "r+b") as fh:  # in place: the recorded digest stays with the file
        fh.write(data)
    os.utime(seg, ns=(seg.stat().st_atime_ns, seg.stat().st_mtime_ns + 10**9))
    with pytest.raises(StrataInputError, match="changed on disk"):
        file_sha256(seg)
    with pytest.raises(StrataInputError, match="segments.parquet"):
        verify_ordering_inputs(Layout(recorded_root))
    assert recorded_sha256(seg) == before


def test_an_ordering_that_is_not_a_permutation_is_not_exported(export_root, tmp_path, capsys):
    import shutil

    root = tmp_path / "root"
    shutil.copytree(export_root, root)
    (tmp_path / "cfg.yaml").write_text((export_root.parent / "cfg.yaml").read_text())
    import polars as pl

    order = pl.read_parquet(root / "orderings" / "greedy.parquet")["sequence_id"].to_numpy().copy()
    order[1] = order[0]  # valid Parquet, a repeated sequence and a missing one
    write_ordering(root, "greedy", order)
    rc, err = _run(capsys, _export(root, tmp_path / "out"))
    assert rc == 2 and "not a permutation" in err and "greedy.parquet" in err
    assert not (tmp_path / "out").exists()


def test_an_extended_export_reverifies_the_label_mask_it_keeps(tmp_path):
    from pipeline.export import export_stream, stream_from_arrays
    from pipeline.packing import frozen
    from pipeline.packing.pack import SequenceStore, pack

    rng = np.random.default_rng(4)
    lengths = rng.integers(5, 40, size=60)
    tokens = rng.integers(2, 900, size=int(lengths.sum())).astype(np.uint16)
    offsets = np.r_[0, np.cumsum(lengths)]
    tokens[offsets[1:] - 1] = 1
    seg = pack("concat", rng.permutation(lengths.size), lengths, 16).segments
    store = SequenceStore(tokens, offsets, seg, 16, pad_id=0)
    m, p = store.n_sequences, 10
    prefix = rng.permutation(m)[:p]
    rest = np.setdiff1d(np.arange(m), prefix)
    rec = {"sequences": p, "tokens_sha256": frozen.prefix_digest(store, prefix, np.dtype(np.uint16)), "version_chain": []}

    def export(order):
        stream = stream_from_arrays(tokens, offsets, seg, order, 16, eos_id=1, pad_id=0)
        return export_stream(stream, "numpy", tmp_path / "out", global_batch=2, meta={"strategy": "greedy", "frozen": rec})

    export(np.concatenate([prefix, rest[: rest.size // 2]]))
    mask = tmp_path / "out" / "label_mask.bin"
    data = bytearray(mask.read_bytes())
    data[3 * 16 + 5] ^= 0x01  # inside the kept prefix (position 3)
    mask.write_bytes(bytes(data))
    before = _snapshot(tmp_path / "out")
    with pytest.raises(StrataInputError, match="label mask") as err:
        export(np.concatenate([prefix, rest]))
    assert "position 3" in str(err.value) and "label_mask.bin" in str(err.value)
    _survived(before, tmp_path / "out")


def test_status_of_an_empty_root_is_not_another_roots_history(tmp_path):
    from pipeline.storage.duck import duck_connection
    from pipeline.storage.lineage import OnDisk

    empty = OnDisk(tmp_path / "empty")
    assert "not in this data root" in empty.problem("corpus", None)
    root = tmp_path / "root"
    root.mkdir()
    kept, gone = root / "corpus.parquet", root / "tokens.bin"
    kept.write_text("x")
    with duck_connection(root / "strata.duckdb") as con:
        con.execute("CREATE TABLE lineage (asset VARCHAR, partition VARCHAR, outputs VARCHAR, created_at TIMESTAMP)")
        con.execute("INSERT INTO lineage VALUES ('corpus', '', ?, now()), ('tokens', '', ?, now())",
                    [json.dumps({str(kept): "a"}), json.dumps({str(gone): "b"})])
    disk = OnDisk(root)
    assert disk.problem("corpus", None) == ""
    assert "not on disk" in disk.problem("tokens", None) and "tokens.bin" in disk.problem("tokens", None)
    assert disk.problem("clusters", None) == ""  # nothing recorded: Dagster's word


def test_a_reused_shard_artifact_is_rehashed_and_a_changed_one_rebuilt(tmp_path, caplog):
    """A token shard (and an embedding or cluster shard) is reused only while its bytes are those
    recorded when it was written: one flipped byte (size and mtime kept) is named in a warning and
    the shard is computed again, byte-identical to the first time."""
    import logging

    from helpers import three_shard_corpus

    from pipeline.config import config_from_dict
    from pipeline.data.shard_docs import manifest_shards
    from pipeline.data.token_shards import token_files, tokenize_shards, tokenizer_key
    from pipeline.data.tokenizer import train_bpe

    build, out, by_id = three_shard_corpus(tmp_path, 0)
    shards = [s for _, s in manifest_shards(build.manifest, out / "corpus" / "shards")]
    tok = train_bpe(list(by_id.values()), 400)
    cfg = config_from_dict({"data_root": str(out), "shard_docs": 16})
    shard_dir, work = out / "tokens" / "shards", out / "work"
    assert tokenize_shards(shards, tok, shard_dir, work, cfg)["shards_computed"] == 3
    victim = token_files(shard_dir, shards[1], tokenizer_key(tok))[0]
    first = victim.read_bytes()
    assert tokenize_shards(shards, tok, shard_dir, work, cfg)["shards_reused"] == 3
    _flip_byte(victim, at=len(first) // 2)
    with caplog.at_level(logging.WARNING, logger="pipeline.storage.integrity"):
        run = tokenize_shards(shards, tok, shard_dir, work, cfg)
    assert run["shards_computed"] == 1 and run["shards_reused"] == 2
    assert any(str(victim.resolve()) in r.getMessage() and "changed on disk" in r.getMessage() for r in caplog.records)
    assert victim.read_bytes() == first


# --------------------------------------------------------------------------- 3. crashes are input errors


HOSTILE_LINES = {
    "surrogate": '{"id": "s", "text": "half an emoji \\ud83d here"}',
    "deep": '{"id": "d", "text": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "huge-id": '{"id": ' + "7" * 5000 + ', "text": "a huge id"}',
}


@pytest.mark.parametrize("case, message", [("deep", "nested too deeply"), ("huge-id", "unreadable JSON value")])
def test_hostile_json_records_are_input_errors_or_skipped(write_jsonl, case, message):
    from pipeline.config import CorpusConfig
    from pipeline.data.shards import ShardReport, read_shard

    path = write_jsonl([{"id": "a", "text": "fine"}, HOSTILE_LINES[case], {"id": "b", "text": "fine too"}])
    with pytest.raises(StrataInputError, match=message) as err:
        list(read_shard(path, CorpusConfig(path=str(path))))
    assert err.value.line == 2 and err.value.path == path and "on_error: skip" in err.value.fix
    report = ShardReport(str(path))
    rows = pl_concat(read_shard(path, CorpusConfig(path=str(path), on_error="skip"), report))
    assert rows["id"].to_list() == ["a", "b"] and [line for line, _ in report.skipped] == [2]


def pl_concat(batches):
    import polars as pl

    return pl.concat(list(batches))


def test_lone_surrogates_are_replaced_and_counted(write_jsonl, tmp_path):
    from pipeline.config import CorpusConfig
    from pipeline.data.corpus import validate_unit

    path = write_jsonl([{"id": "a", "text": "fine"}, HOSTILE_LINES["surrogate"]])
    out = tmp_path / "shard.parquet"
    info = validate_unit(str(path), CorpusConfig(path=str(path)), 0.0, 0, out)
    assert info["surrogates_replaced"] == 1 and info["skipped"] == []
    import polars as pl

    assert "half an emoji \ufffd here" in pl.read_parquet(out)["text"].to_list()


def test_invalid_utf8_in_a_parquet_string_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.config import CorpusConfig
    from pipeline.data.shards import ShardReport, read_shard

    text = pa.array([b"ok text", b"bad \xff\xfe text", b"fine"], type=pa.binary()).view(pa.string())
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": text}), path)
    with pytest.raises(StrataInputError, match="invalid UTF-8") as err:
        list(read_shard(path, CorpusConfig(path=str(path))))
    assert err.value.line == 2 and "text" in str(err.value)
    report = ShardReport(str(path))
    rows = pl_concat(read_shard(path, CorpusConfig(path=str(path), on_error="skip"), report))
    assert rows["id"].to_list() == ["a", "c"] and rows["line"].to_list() == [1, 3]
    assert report.skipped == [(2, "invalid UTF-8 in a string column")] and report.n_read == 3


def test_bad_config_files_and_freeze_prefix_values(tmp_path, capsys):
    from pipeline.config import load_config
    from pipeline.packing.frozen import frozen_count

    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("seed: 1\n# caf\xe9\n".encode("latin-1"))
    with pytest.raises(StrataInputError, match="not UTF-8") as err:
        load_config(latin1)
    assert err.value.line == 2
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("seed: [1\n")
    for cfg in (latin1, malformed, tmp_path / "missing.yaml"):
        rc, err_text = _run(capsys, ["run", "--config", str(cfg), "--data-root", str(tmp_path / "root"), "--freeze-prefix", "5"])
        assert rc == 2 and str(cfg) in err_text and "Fix:" in err_text and "Traceback" not in err_text
    notes = tmp_path / "notes.txt"
    notes.write_text("not a stream\n")
    with pytest.raises(StrataInputError, match="not a training run's stream.parquet"):
        frozen_count(f"consumed:{notes}")
    assert notes.read_text() == "not a stream\n"


def test_a_failing_asset_prints_one_clean_error_and_logs_the_trace(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("STRATA_RUN_LOG", "")  # strata run sets it; unset again after the test
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "text": "hello"}\n{"id": "c" "text": "x"}\n')
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"corpus: {{path: {corpus}}}\n")
    rc, err = _run(capsys, ["run", "--config", str(cfg), "--data-root", str(tmp_path / "root"), "--select", "corpus_shards"])
    assert rc == 2 and "line 2: malformed JSON" in err
    assert "Stack Trace" not in err and "Traceback" not in err and 'File "' not in err
    logs = list((tmp_path / "root" / ".logs").glob("run-*.log"))
    assert len(logs) == 1 and str(logs[0]) in err.splitlines()[-1]
    assert "Stack Trace" in logs[0].read_text()


def test_an_unexpected_failure_in_an_asset_is_one_clean_line_naming_the_log(tmp_path):
    """Not an input error (an OSError inside ``token_shards``: its folder is a file): the real CLI
    prints Dagster's ERROR record's first line and one ``strata: error: ... Fix: ...`` line naming the
    log file, exit 1, no trace; the log file holds the trace."""
    import subprocess
    import sys

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": f"document number {i} says hello"}) + "\n" for i in range(20)))
    from pipeline.storage.layout import ROOT_MARKER

    root = tmp_path / "root"
    root.mkdir()
    (root / ROOT_MARKER).write_text("")  # a data root Strata made (a folder of the user's is refused before any step)
    (root / "tokens").write_text("a file where the token store's folder goes\n")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"corpus: {{path: {corpus}}}\nvocab_size: 300\nheldout_fraction: 0.0\n")
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(cfg), "--data-root", str(root),
                           "--select", "*token_shards"], cwd=repo, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(repo), "STRATA_RUN_LOG": ""})
    err = proc.stderr
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err and 'File "' not in err and "Stack Trace" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("strata: error: materialization failed: token_shards") and "Fix:" in last
    assert "FileExistsError" in last or "NotADirectoryError" in last
    logs = list((root / ".logs").glob("run-*.log"))
    assert len(logs) == 1 and str(logs[0]) in last
    assert "Traceback" in logs[0].read_text() and len(err.strip().splitlines()) < 30


# --------------------------------------------------------------------------- 4. nothing runs away


@pytest.mark.parametrize("values, key", [({"vocab_size": 10**9}, "vocab_size"), ({"batch_size": 10**9}, "batch_size"),
                                         ({"seq_len": 8192, "batch_size": 4096}, "seq_len x batch_size"),
                                         ({"lr": float("inf")}, "lr"), ({"lr": float("nan")}, "lr")])
def test_values_that_cannot_fit_the_machine_are_refused_at_load(tmp_path, values, key):
    import yaml

    from pipeline.config import load_config

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(values))
    with pytest.raises(StrataInputError, match="Fix:") as err:
        load_config(cfg)
    assert key in str(err.value) and str(cfg) in str(err.value)


def test_a_symlink_cycle_under_a_glob_is_refused_not_followed_forever(tmp_path):
    import polars as pl

    from pipeline.data.shards import discover_shards

    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    pl.DataFrame({"id": ["a"], "text": ["hello"]}).write_parquet(corpus / "sub" / "part-0.parquet")
    (corpus / "sub" / "loop").symlink_to(corpus)
    (corpus / "self").symlink_to(corpus)
    for spec in (str(corpus / "**" / "*.parquet"), str(corpus)):
        with pytest.raises(StrataInputError, match="symbolic link cycle") as err:
            discover_shards(spec)
        assert "Fix:" in str(err.value)


@pytest.mark.parametrize("spelling", [".", "./", "~", "--data-root ."])
def test_a_users_folder_as_data_root_is_refused_whatever_its_spelling(tmp_path, capsys, monkeypatch, spelling):
    """A data root that holds files and no Strata marker is another's folder: `strata run` refuses
    it before writing anything (exit 2, the path and the fix), however it is spelled; every file stays."""
    work = tmp_path / "w"
    (work / "heldout").mkdir(parents=True)
    (work / "heldout" / "keep.txt").write_text("x\n")
    (work / "tokenizer").mkdir()
    (work / "tokenizer" / "mine.json").write_text("{}\n")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": f"document number {i} says hello"}) + "\n" for i in range(20)))
    root_key = "" if spelling.startswith("--") else f"data_root: '{spelling}'\n"
    (work / "cfg.yaml").write_text(f"corpus: {{path: {corpus}}}\nvocab_size: 300\n{root_key}")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(work))
    monkeypatch.setenv("STRATA_RUN_LOG", "")
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.delenv("STRATA_HOME", raising=False)
    before = _snapshot(work)
    extra = ["--data-root", "."] if spelling.startswith("--") else []
    rc, err = _run(capsys, ["run", "--config", "cfg.yaml", *extra, "--select", "*tokenizer"])
    assert rc == 2 and "not a Strata data root" in err and str(work) in err and "Fix:" in err and "Traceback" not in err
    assert _snapshot(work) == before and sorted(p.name for p in work.iterdir()) == ["cfg.yaml", "heldout", "tokenizer"]
    for command in (["demo", "--data-root", "."], ["run", "--config", "cfg.yaml", "--data-root", ".", "--freeze-prefix", "0"]):
        rc, err = _run(capsys, command)
        assert rc == 2 and "not a Strata data root" in err, command
    assert _snapshot(work) == before


def test_prune_removes_only_files_strata_wrote(tmp_path):
    """A stage's pruning removes the stale artifacts Strata wrote (their digest record with them) and
    leaves a file it did not write, a hidden file and a kept artifact."""
    from pipeline.data.shard_docs import prune
    from pipeline.storage.atomic import write_bin

    d = tmp_path / "shards"
    write_bin(np.arange(4), d / "kept.bin")
    write_bin(np.arange(5), d / "stale.bin")
    (d / "mine.bin").write_bytes(b"a user's file\n")
    (d / ".notes").write_text("hidden\n")
    assert prune(d, {"kept.bin"}) == 1
    assert sorted(p.name for p in d.iterdir()) == [".kept.bin.sha256", ".notes", "kept.bin", "mine.bin"]
    assert (d / ".kept.bin.sha256").is_file()


def _copy_without_attributes(src: Path, dst: Path) -> Path:
    """What ``cp -r``, ``rsync -a`` without ``-X``, tar or an object store leave: bytes, no extended attributes."""
    import shutil

    shutil.copytree(src, dst, copy_function=shutil.copyfile)
    from pipeline.storage import atomic

    atomic._DIGESTS.clear()  # another process, on the copy
    atomic._VERIFIED.clear()
    return dst


def test_bit_rot_in_a_copied_root_is_named_by_status_and_stops_the_export(recorded_root, tmp_path, capsys, monkeypatch):
    from pipeline.storage.layout import ROOT_MARKER

    (recorded_root / ROOT_MARKER).write_text("")
    copy = _copy_without_attributes(recorded_root, tmp_path / "copy")
    (copy.parent / "cfg.yaml").write_text((recorded_root.parent / "cfg.yaml").read_text())
    out = tmp_path / "out"
    assert _run(capsys, _export(copy, out))[0] == 0  # intact after the copy
    _flip_byte(copy / "sequences" / "segments.parquet")
    rc, err = _run(capsys, _export(copy, tmp_path / "out2"))
    assert rc == 2 and "segments.parquet" in err and "changed on disk" in err and "Fix:" in err
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "a", "text": "one document"}) + "\n")
    (tmp_path / "status.yaml").write_text(f"corpus: {{path: {corpus}}}\n")
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.delenv("STRATA_CONFIG", raising=False)
    capsys.readouterr()
    from assets.cli import main

    assert main(["status", "--config", str(tmp_path / "status.yaml"), "--data-root", str(copy)]) == 0
    shown = capsys.readouterr().out
    assert "corrupt" in shown and "sequences/segments.parquet" in shown.replace("\n", "")
    assert "tokens/" not in shown.split("corrupt", 1)[1]  # only the file that changed


def test_a_flipped_token_shard_in_a_copied_root_is_rebuilt_never_taken_as_the_truth(tmp_path, caplog):
    """After a copy that drops extended attributes, a token shard's flipped byte is still caught (the
    record lies beside the file): the shard is computed again, byte-identical, never reused with its new digest."""
    import logging

    from helpers import three_shard_corpus

    from pipeline.config import config_from_dict
    from pipeline.data.shard_docs import manifest_shards
    from pipeline.data.token_shards import token_files, tokenize_shards, tokenizer_key
    from pipeline.data.tokenizer import train_bpe
    from pipeline.storage.atomic import recorded_sha256

    build, out, by_id = three_shard_corpus(tmp_path, 0)
    tok = train_bpe(list(by_id.values()), 400)
    cfg = config_from_dict({"data_root": str(out), "shard_docs": 16})
    shards = [s for _, s in manifest_shards(build.manifest, out / "corpus" / "shards")]
    assert tokenize_shards(shards, tok, out / "tokens" / "shards", out / "work", cfg)["shards_computed"] == 3
    copy = _copy_without_attributes(out, tmp_path / "copy")
    shards = [s for _, s in manifest_shards(build.manifest, copy / "corpus" / "shards")]
    shard_dir = copy / "tokens" / "shards"
    victim = token_files(shard_dir, shards[1], tokenizer_key(tok))[0]
    first, recorded = victim.read_bytes(), recorded_sha256(victim)
    assert recorded == hashlib.sha256(first).hexdigest()
    _flip_byte(victim, at=len(first) // 2)
    with caplog.at_level(logging.WARNING, logger="pipeline.storage.integrity"):
        run = tokenize_shards(shards, tok, shard_dir, copy / "work", cfg)
    assert run["shards_computed"] == 1 and run["shards_reused"] == 2
    assert any("changed on disk" in r.getMessage() for r in caplog.records)
    assert victim.read_bytes() == first and recorded_sha256(victim) == recorded


def test_a_dangling_shard_symlink_is_refused_not_dropped(tmp_path):
    """A shard that is a symlink to a disk not mounted stops discovery (exit 2 naming it): its documents
    would be dropped and its shard's artifacts pruned without a word."""
    import polars as pl

    from pipeline.data.shards import discover_shards

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pl.DataFrame({"id": ["a"], "text": ["hello"]}).write_parquet(corpus / "part-0.parquet")
    (corpus / "part-1.parquet").symlink_to(tmp_path / "unmounted" / "part-1.parquet")
    (corpus / "README.link").symlink_to(tmp_path / "unmounted" / "README")  # not a shard's name: not corpus
    for spec in (str(corpus), str(corpus / "*.parquet")):
        with pytest.raises(StrataInputError, match="symbolic link") as err:
            discover_shards(spec)
        assert "part-1.parquet" in str(err.value) and "Fix:" in str(err.value)
    assert discover_shards(str(corpus / "part-0.parquet")) == [(corpus / "part-0.parquet").resolve()]


def test_credentials_in_a_url_never_reach_the_data_root(tmp_path, capsys, monkeypatch):
    """``s3://KEY:SECRET@bucket/…`` is refused at load, before strata_config.yaml (world-readable) is written."""
    monkeypatch.setenv("STRATA_RUN_LOG", "")
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.setenv("STRATA_CONFIG", "")  # the run sets it: recorded, so that it is unset again after this test
    monkeypatch.delenv("STRATA_CONFIG")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("corpus: {path: 's3://AKIAEXAMPLE:SeCrEtKeY@bucket/corpus/'}\nexport_dir: ''\n")
    root = tmp_path / "root"
    rc, err = _run(capsys, ["run", "--config", str(cfg), "--data-root", str(root), "--select", "corpus_shards"])
    assert rc == 2 and "corpus.path" in err and "credentials" in err and "Fix:" in err and "Traceback" not in err
    assert "SeCrEt" not in err and "AKIAEXAMPLE" not in err
    assert not root.exists() or not any("SeCrEt" in p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


def test_credentials_in_the_endpoint_url_are_a_clean_error_never_echoed(monkeypatch):
    from pipeline.data.shards import discover_shards
    from pipeline.storage import remote

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://AKIAEXAMPLE:SeCrEtKeY@127.0.0.1:9")
    with pytest.raises(StrataInputError, match="AWS_ENDPOINT_URL") as err:
        discover_shards("s3://bucket/corpus/")
    assert "SeCrEt" not in str(err.value) and "AKIAEXAMPLE" not in str(err.value) and "Fix:" in str(err.value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "localhost:9000")
    with pytest.raises(StrataInputError, match="not an http"):
        remote.endpoint()


def test_heldout_fraction_zero_is_refused_before_it_reaches_the_evaluations(tmp_path, capsys, monkeypatch):
    """Without a held-out split and no other eval suite, the evaluations (and gradient_analyses) cannot
    run: `strata run` of a selection holding them stops before any step, naming heldout_fraction."""
    from evals.suites import check_heldout
    from pipeline.config import config_from_dict

    monkeypatch.setenv("STRATA_RUN_LOG", "")
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": f"document number {i} says hello"}) + "\n" for i in range(20)))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"corpus: {{path: {corpus}}}\nvocab_size: 300\nheldout_fraction: 0\n")
    rc, err = _run(capsys, ["run", "--config", str(cfg), "--data-root", str(tmp_path / "root"), "--select", "evaluations"])
    assert rc == 2 and "heldout_fraction" in err and "evaluations" in err and "Fix:" in err and "Traceback" not in err
    assert not (tmp_path / "root" / "corpus").exists()  # nothing ran
    with pytest.raises(StrataInputError, match="gradient_analyses"):
        check_heldout(config_from_dict({"heldout_fraction": 0.0, "wikitext_path": str(corpus)}), {"evaluations", "gradient_analyses"})
    check_heldout(config_from_dict({"heldout_fraction": 0.0, "wikitext_path": str(corpus)}), {"evaluations"})  # another suite: fine
    check_heldout(config_from_dict({"heldout_fraction": 0.0}), {"corpus", "orderings", "exports"})  # nothing needs it
# --------------------------------------------------------------------------- storage that refuses a write (issue 58)


def test_a_full_disk_during_an_export_is_exit_2_naming_the_path_and_the_old_export_stays(export_root, tmp_path, capsys):
    """The file-size limit (``ulimit -f``, what a full volume looks like to a writer) hit while an
    export replaces an earlier one: exit 2 naming the folder and the fix, no traceback, and the
    earlier export byte for byte as it was."""
    import resource
    import subprocess
    import sys

    out = tmp_path / "exp"
    assert _run(capsys, _export(export_root, out))[0] == 0
    before = _snapshot(out)
    limit = max(512, (out / "tokens.bin").stat().st_size // 4)

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-m", "assets.cli", *_export(export_root, out)], capture_output=True, text=True,
                          preexec_fn=small_files, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and str(out) in proc.stderr and "ulimit -f" in proc.stderr and "Fix:" in proc.stderr
    _survived(before, out)
    assert set(_snapshot(out)) == set(before)


def test_out_a_symlink_to_a_users_directory_is_refused(export_root, tmp_path, capsys):
    """``--out`` a symbolic link (to an empty folder or to an earlier export): exit 2 naming the link
    and its target; the link and every file behind it stay."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (tmp_path / "exp").mkdir()
    assert _run(capsys, _export(export_root, tmp_path / "exp"))[0] == 0
    for target in (mine, tmp_path / "exp"):
        link = tmp_path / f"link-{target.name}"
        link.symlink_to(target)
        before = _snapshot(target)
        rc, err = _run(capsys, _export(export_root, link))
        assert rc == 2 and "symbolic link" in err and str(target) in err and "Fix:" in err and "Traceback" not in err, err
        assert link.is_symlink() and link.resolve() == target.resolve()
        _survived(before, target)
        assert set(_snapshot(target)) == set(before)


def test_a_config_key_given_twice_names_the_file_line_and_key(tmp_path, capsys, monkeypatch):
    """YAML and JSON keep the last of a key given twice, silently: the config is refused instead."""
    monkeypatch.setenv("STRATA_CONFIG", "")  # the run sets it: recorded, so that it is unset again after this test
    monkeypatch.delenv("STRATA_CONFIG")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("seed: 1\ndedup:\n  near_threshold: 0.8\n  near_threshold: 0.7\n")
    rc, err = _run(capsys, ["run", "--config", str(cfg), "--data-root", str(tmp_path / "root"), "--select", "no_such_asset"])
    assert rc == 2 and f"{cfg}, line 4" in err and "'near_threshold' is given twice" in err and "Fix:" in err, err
    cfg.write_text("seed: 1\nvocab_size: 512\nseed: 2\n")
    rc, err = _run(capsys, ["run", "--config", str(cfg), "--data-root", str(tmp_path / "root"), "--select", "no_such_asset"])
    assert rc == 2 and f"{cfg}, line 3" in err and "'seed' is given twice" in err, err
    (tmp_path / "cfg.json").write_text('{"seed": 1, "seed": 2}')
    rc, err = _run(capsys, ["run", "--config", str(tmp_path / "cfg.json"), "--data-root", str(tmp_path / "root"),
                            "--select", "no_such_asset"])
    assert rc == 2 and "'seed' is given twice" in err, err


def test_storage_refusals_name_the_path_and_the_fix(tmp_path, capsys):
    """Each way the storage refuses a write maps to exit 2 with the path and a fix (a read-only root
    cannot be made here: the tests run as root, which ignores mode bits, and cannot mount)."""
    import errno

    from pipeline.errors import storage_error

    for code, words in ((errno.ENOSPC, "no space"), (errno.EROFS, "read-only"), (errno.EACCES, "permission"),
                        (errno.EFBIG, "ulimit -f"), (errno.EDQUOT, "quota")):
        err = storage_error(OSError(code, os.strerror(code), str(tmp_path / "report" / "a.png")))
        assert err is not None and str(tmp_path / "report" / "a.png") in str(err) and words in str(err) and "Fix:" in str(err)
    short = OSError("4992 requested and 1248 written")
    short.filename = str(tmp_path / "exp")
    assert "ulimit -f" in str(storage_error(short)) and str(tmp_path / "exp") in str(storage_error(short))
    assert storage_error(OSError(errno.ENOENT, "No such file")) is None and storage_error(ValueError("x")) is None
