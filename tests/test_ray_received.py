"""The driver's tally of what it receives from Ray (``pipeline.distributed.ray_engine.received``):
a result carrying an array counts about the array's bytes, a result naming a path counts little,
and with ``STRATA_RAY_RECEIVED_LOG`` each mapping appends one JSON line."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from pipeline.config import RayConfig
from pipeline.distributed.ray_engine import RECEIVED_LOG, map_shards_ray, received, run_remote
from pipeline.distributed.shards import Shard

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray", reason="install the ray extra: pip install -e '.[ray]'")


def test_received_bytes_follow_what_the_workers_return(tmp_path, monkeypatch):
    log = tmp_path / "received.jsonl"
    monkeypatch.setenv(RECEIVED_LOG, str(log))
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR", configure_logging=False)
    try:
        before = received()
        saved = []
        n = 1_000_000  # an 8 MB array a shard: Ray stores it out of line
        map_shards_ray(np.ones, [Shard(f"big{i}", ((n,),)) for i in range(2)], lambda s, r: saved.append(r), RayConfig())
        paths = [Shard(f"path{i}", ("work", f"part-{i:05d}.npy")) for i in range(3)]
        map_shards_ray(os.path.join, paths, lambda s, r: saved.append(r), RayConfig())  # the task path: only a path comes back
        assert run_remote(np.arange, (1000,), RayConfig(), num_cpus=1, num_gpus=0).shape == (1000,)  # one task, counted alike
    finally:
        ray.shutdown()
    after = received()
    big = after["ones"]["bytes"] - before.get("ones", {}).get("bytes", 0)
    small = after["join"]["bytes"] - before.get("join", {}).get("bytes", 0)
    assert 2 * n * 8 <= big <= 2 * n * 8 * 1.01
    assert 0 < small < 3 * 200
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["fn"], r["results"]) for r in lines] == [("ones", 2), ("join", 3), ("arange", 1)]
    assert 8000 <= lines[2]["bytes"] < 9000
    assert lines[0]["bytes"] == big and lines[1]["bytes"] == small
    assert saved[2:] == [os.path.join("work", f"part-{i:05d}.npy") for i in range(3)]
