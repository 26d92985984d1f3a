"""Shared fixtures; plain helpers live in tests/helpers.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.offline import set_offline

set_offline()

# numba's on-disk cache numbers a kernel's specializations by the index it reads: two processes
# compiling different specializations of one kernel at once can pair one's index entry with the
# other's machine code, and the next process to load it crashes. The two xdist workers (and the
# processes they start, which inherit this) each keep a cache of their own.
if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("NUMBA_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".pytest_cache" / "numba" / worker))


def pytest_collection_modifyitems(config, items):
    """Files holding an integration test first, each file's tests kept together and in order: with
    two xdist workers taking a file at a time (pyproject.toml), the long files start early and the
    short ones fill the gaps, so neither worker idles at the end behind one long file."""
    files = {}
    for item in items:
        slow = files.get(item.path, False) or item.get_closest_marker("integration") is not None
        files[item.path] = slow
    rank = {path: (not slow, i) for i, (path, slow) in enumerate(files.items())}
    items.sort(key=lambda item: rank[item.path])


@pytest.fixture
def write_jsonl(tmp_path):
    def _write(records: list, name: str = "corpus.jsonl") -> Path:
        path = tmp_path / name
        with open(path, "w", encoding="utf-8") as fh:
            for r in records:
                fh.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
        return path

    return _write


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's standalone S3 server, a process on 127.0.0.1 at a free port, for the whole session."""
    from s3_server import start_server

    server = start_server(tmp_path_factory.mktemp("s3") / "moto.log")
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server, monkeypatch, tmp_path):
    """A new bucket on the test server; the environment's credential chain and endpoint point at it."""
    import uuid

    from s3_server import Bucket, s3_environment

    key_id, secret = s3_environment(monkeypatch, s3_server, tmp_path)
    bucket = Bucket(s3_server, f"strata-{uuid.uuid4().hex[:12]}", key_id, secret)
    bucket.fs().mkdir(bucket.name)
    return bucket
