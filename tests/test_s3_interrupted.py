"""A run whose object store goes away mid-shard: `strata run` reading a corpus from the test S3
server (tests/s3_server.py) while the server process is killed after the first ranged read of a
shard ends with a clean input error (exit 2, the shard's URL, the fix, no traceback) and no
partial artifact; with the server restarted on the same data the rerun completes, and its
artifacts equal byte for byte those of a run never interrupted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers import demo_slice
from s3_server import Bucket, start_server

from pipeline.storage.layout import artifact_digests

REPO = Path(__file__).resolve().parents[1]
BIG_BYTES = 20 << 20  # the shard read when the server dies: three of remote.BLOCK_SIZE's ranged reads

pytestmark = pytest.mark.integration


def _corpus() -> dict[str, bytes]:
    recs = demo_slice(400)
    big, i = [], 0
    size = 0
    while size < BIG_BYTES:
        r = recs[i % len(recs)]
        line = json.dumps({"id": f"big-{i}", "text": f"{r['text']} [{i}]", "domain": r["domain"]}) + "\n"
        big.append(line)
        size += len(line)
        i += 1
    small = "".join(json.dumps({"id": f"small-{j}", "text": r["text"], "domain": r["domain"]}) + "\n" for j, r in enumerate(recs[:50]))
    return {"corpus/a-small.jsonl": small.encode(), "corpus/b-big.jsonl": "".join(big).encode()}


def _strata(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "STRATA_CONFIG": "", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "assets.cli", *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=600, check=False)


def _config(path: Path, root: Path, url: str) -> Path:
    cfg = {"data_root": str(root), "corpus": {"path": url, "source_field": "domain"}, "heldout_fraction": 0.05}
    path.write_text(yaml.safe_dump(cfg))
    return path


def _kill_after_first_range(server, key: str, done: threading.Event) -> None:
    """SIGKILL the server once its log shows a ranged GET of ``key`` (the shard is being read)."""
    pattern = re.compile(rf'"GET /[^ ]*/{re.escape(key)}[^ ]* HTTP/1\.1" 206')
    while not done.is_set():
        if pattern.search(server.log.read_text(errors="replace")):
            server.process.kill()
            server.process.wait()
            return
        time.sleep(0.005)


def test_a_server_killed_mid_shard_fails_cleanly_and_the_rerun_is_identical(s3_bucket, tmp_path, monkeypatch):
    """The bucket fixture's environment (endpoint, credentials, two attempts) points at a server
    of this test's own, on a port of its own, so killing it leaves the session's server alone."""
    import uuid

    server = start_server(tmp_path / "moto.log")
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("S3_ENDPOINT_URL", server.endpoint)
    bucket = Bucket(server, f"strata-{uuid.uuid4().hex[:12]}", s3_bucket.key_id, s3_bucket.secret)
    objects = _corpus()
    try:
        bucket.create()
        for key, data in objects.items():
            bucket.put(key, data)
        url = f"{bucket.url}/corpus/"
        root = tmp_path / "interrupted"
        cfg = _config(tmp_path / "interrupted.yaml", root, url)

        done = threading.Event()
        killer = threading.Thread(target=_kill_after_first_range, args=(server, "corpus/b-big.jsonl", done), daemon=True)
        killer.start()
        failed = _strata("run", "--config", str(cfg), "--select", "*corpus")
        done.set()
        killer.join()
        assert server.process.returncode is not None, "the server was never killed: the shard was not read"
        assert failed.returncode == 2, failed.stdout[-3000:] + failed.stderr[-3000:]
        assert "Traceback" not in failed.stderr, failed.stderr[-3000:]
        last = failed.stderr.strip().splitlines()[-1]
        assert last.startswith("strata: error: ") and f"{url}b-big.jsonl" in last and "cannot reach the object store" in last, last
        assert server.endpoint in last and "Fix: " in last
        assert not (root / "corpus.parquet").exists()
        shards = root / "corpus" / "shards"
        left = sorted(p.name for p in shards.iterdir() if not p.name.startswith(".")) if shards.is_dir() else []  # not digest records
        stems = {n.rsplit(".", 1)[0] for n in left}
        assert left == sorted(f"{s}.{x}" for s in stems for x in ("json", "parquet"))  # whole validated shards only, no partial file
        assert len(stems) <= 1  # at most the small shard's: the big one never completed

        port = int(server.endpoint.rsplit(":", 1)[1])
        server = start_server(tmp_path / "moto.log", port=port)  # the same endpoint, and the same objects put back
        bucket.server = server
        bucket.create()
        for key, data in objects.items():
            bucket.put(key, data)
        rerun = _strata("run", "--config", str(cfg), "--select", "*corpus")
        assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]

        reference = _strata("run", "--config", str(_config(tmp_path / "reference.yaml", tmp_path / "reference", url)), "--select",
                            "*corpus")
        assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]
        want, got = artifact_digests(tmp_path / "reference"), artifact_digests(root)
        assert "corpus.parquet" in want and len([k for k in want if k.startswith("corpus/shards/")]) == 4
        assert got == want
    finally:
        server.stop()
