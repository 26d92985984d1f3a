"""An export to object storage cut short: a reader never sees half of it.

The writing process is killed (SIGKILL, as a preempted job is) at two moments of the publish
(pipeline/storage/remote.py ``publish``): while it uploads under its temporary prefix, and once it
has taken the previous export's commit files away. Either way the destination holds the previous
export whole and committed, or no committed export at all (no ``meta.json``, no ``index.json``):
never a mixture. The rerun then publishes the new export, equal object for object to one written
without interruption, and removes what the killed run left under its temporary prefix. The server
going away mid-export ends the export with the clean error naming the URL and the fix."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from s3_server import Bucket, start_server

from pipeline.errors import StrataInputError

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"

pytestmark = pytest.mark.integration

EXPORT = textwrap.dedent("""
    import sys
    from test_export import _data
    from pipeline.export import export_stream
    stream = _data("concat", seed=int(sys.argv[2]))[0]
    export_stream(stream, "mds", sys.argv[1], global_batch=8)
""")


def _export(url: str, seed: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)])}
    return subprocess.Popen([sys.executable, "-c", EXPORT, url, str(seed)], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _objects(bucket: Bucket, prefix: str) -> dict[str, bytes]:
    fs = bucket.fs()
    fs.invalidate_cache()
    return {k[len(bucket.name) + len(prefix) + 2:]: fs.cat(k) for k in fs.find(f"{bucket.name}/{prefix}/")}


def _kill_when(proc: subprocess.Popen, log: Path, start: int, pattern: re.Pattern, timeout: float = 120) -> bool:
    """SIGKILL ``proc`` as soon as the server's log (past byte ``start``) shows ``pattern``;
    False when the export ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log, "rb") as fh:
            fh.seek(start)
            if pattern.search(fh.read().decode(errors="replace")):
                proc.kill()
                proc.wait()
                return True
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    proc.kill()
    raise AssertionError("the export neither reached the kill point nor ended")


@pytest.mark.parametrize("moment", ["uploading", "uncommitted"])
def test_a_killed_export_leaves_the_old_one_or_none_and_the_rerun_completes(moment, s3_server, s3_bucket):
    from test_export import _data

    from pipeline.export import export_stream

    prefix = f"exp-{moment}"
    url = f"{s3_bucket.url}/{prefix}"
    export_stream(_data("concat", seed=0)[0], "mds", url, global_batch=8)
    old = _objects(s3_bucket, prefix)
    assert "meta.json" in old and "index.json" in old

    start = s3_server.log.stat().st_size
    at = {
        # the first upload under the temporary prefix: nothing at the destination has changed yet
        "uploading": rf'"PUT /{s3_bucket.name}/{prefix}/\.strata-tmp-[0-9a-f]+/',
        # the marker is written right after the previous export's commit files were removed
        "uncommitted": rf'"PUT /{s3_bucket.name}/{prefix}/\.strata-export ',
    }[moment]
    second = _export(url, seed=1)
    assert _kill_when(second, s3_server.log, start, re.compile(at)), "the export ended before the kill point"

    left = _objects(s3_bucket, prefix)
    committed = {k: v for k, v in left.items() if not k.startswith(".strata-tmp-")}
    if "meta.json" in committed:  # still the previous export, whole
        assert committed == old
    else:  # no committed export: a reader finds neither commit file
        assert "index.json" not in committed
    if moment == "uploading":
        assert committed == old, "killed before the destination changed, yet it changed"
    else:
        assert "meta.json" not in committed and "index.json" not in committed
    assert any(k.startswith(".strata-tmp-") for k in left)  # the killed run's uploads are still there

    new = _data("concat", seed=1)[0]
    export_stream(new, "mds", url, global_batch=8)  # the rerun
    export_stream(new, "mds", f"{s3_bucket.url}/{prefix}-clean", global_batch=8)
    got, want = _objects(s3_bucket, prefix), _objects(s3_bucket, f"{prefix}-clean")
    assert got == want and got != old
    assert not any(k.startswith(".strata-tmp-") for k in got)


def test_the_server_going_away_mid_export_is_a_clean_error(s3_bucket, tmp_path, monkeypatch):
    """A server of this test's own, killed at the export's first upload."""
    import threading

    from test_export import _data

    from pipeline.export import export_stream

    server = start_server(tmp_path / "moto.log")
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("S3_ENDPOINT_URL", server.endpoint)
    bucket = Bucket(server, f"strata-{uuid.uuid4().hex[:12]}", s3_bucket.key_id, s3_bucket.secret)
    try:
        bucket.create()
        pattern = re.compile(rf'"PUT /{bucket.name}/exp/\.strata-tmp-')
        done = threading.Event()

        def kill() -> None:
            while not done.is_set():
                if pattern.search(server.log.read_text(errors="replace")):
                    server.process.kill()
                    server.process.wait()
                    return
                time.sleep(0.002)

        killer = threading.Thread(target=kill, daemon=True)
        killer.start()
        with pytest.raises(StrataInputError) as err:
            export_stream(_data("concat")[0], "mds", f"{bucket.url}/exp", global_batch=8)
        done.set()
        killer.join()
        assert server.process.returncode is not None, "the server was never killed"
        text = str(err.value)
        assert f"{bucket.url}/exp" in text and "cannot reach the object store" in text, text
        assert server.endpoint in text and err.value.fix
    finally:
        server.stop()
