"""engine: ray on a real two-node Ray cluster (two raylets on this machine, 1 CPU each): same bytes
as engine: local, a killed worker or driver changes nothing, bad input names its file and line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from helpers import demo_slice

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray", reason="install the ray extra: pip install -e '.[ray]'")

UPSTREAM = ["corpus", "tokenizer", "tokens", "embeddings", "clusters", "sequences"]
STRATEGIES = ["random", "greedy"]
N_DOCS, SHARD_DOCS = 120, 40  # three shards


# --------------------------------------------------------------------------- the cluster
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cluster_pids(temp_dir: Path) -> list[int]:
    """Every process of the cluster under ``temp_dir``: its daemons (named by the folder on their
    command line) and their children (agents, workers, actors)."""
    procs: dict[int, tuple[int, str]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            procs[int(d.name)] = (ppid, cmd)
    mine = {pid for pid, (_, cmd) in procs.items() if str(temp_dir) in cmd}
    grew = True
    while grew:
        kids = {pid for pid, (ppid, _) in procs.items() if ppid in mine} - mine
        grew = bool(kids)
        mine |= kids
    return sorted(mine)


def _stop_cluster(temp_dir: Path) -> None:
    """Stop exactly this cluster's processes (``ray stop --force`` would also stop every other
    Ray cluster of this user on the machine)."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        pids = _cluster_pids(temp_dir)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while _cluster_pids(temp_dir) and time.monotonic() < deadline:
            time.sleep(0.2)


@pytest.fixture(scope="module")
def ray_cluster():
    """A head node and a second node, separate raylets with 1 CPU each; yields (address, temp dir)."""
    temp_dir = Path(tempfile.mkdtemp(prefix="strata-ray-", dir="/tmp"))  # short: Ray's socket paths have a length limit
    exe = str(Path(sys.executable).with_name("ray"))
    port = _free_port()
    common = ["--num-cpus=1", "--num-gpus=0", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    try:
        for cmd in (
            [exe, "start", "--head", f"--port={port}", f"--temp-dir={temp_dir}", "--include-dashboard=false",
             f"--dashboard-port={_free_port()}", f"--ray-client-server-port={_free_port()}", *common],
            [exe, "start", f"--address=127.0.0.1:{port}", *common],
        ):
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        yield f"127.0.0.1:{port}", temp_dir
    finally:
        _stop_cluster(temp_dir)
        subprocess.run(["rm", "-rf", str(temp_dir)], check=False)


# --------------------------------------------------------------------------- graph runs
def _config(tmp: Path, name: str, engine: str, address: str = "") -> Path:
    corpus = tmp / "corpus.jsonl"
    if not corpus.exists():
        corpus.write_text("".join(json.dumps(r) + "\n" for r in demo_slice(N_DOCS)))
    cfg = {
        "data_root": str(tmp / name), "corpus": {"path": str(corpus), "source_field": "domain"},
        "heldout_fraction": 0.05, "vocab_size": 400, "k": 4, "seq_len": 64, "length_bins": 8, "batch_size": 8,
        "embed_max_tokens": 48, "strategies": STRATEGIES, "shard_docs": SHARD_DOCS,
        "engine": engine, "ray": {"address": address, "max_retries": 3},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def materialize(config: Path, selection: list[str], partition: str | None = None):
    """Materialize ``selection`` (one partition) in this process, as ``strata run`` does."""
    import dagster as dg
    from dagster_duckdb import DuckDBResource

    from assets import corpus, embeddings, orderings, sequences, tokens
    from assets.common import StrataSettings

    root = Path(yaml.safe_load(config.read_text())["data_root"])
    root.mkdir(parents=True, exist_ok=True)
    return dg.materialize(
        dg.load_assets_from_modules([corpus, tokens, embeddings, sequences, orderings]), selection=selection,
        partition_key=partition, raise_on_error=True,
        resources={"settings": StrataSettings(config_file=str(config)), "duckdb": DuckDBResource(database=str(root / "strata.duckdb"))},
    )


def _through_orderings(config: Path) -> None:
    materialize(config, UPSTREAM)
    for s in STRATEGIES:
        materialize(config, ["orderings"], s)


def _artifacts(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith("strata.duckdb")}


def _metadata(result, asset: str) -> dict:
    import dagster as dg

    mats = [e for e in result.get_asset_materialization_events() if e.asset_key == dg.AssetKey(asset)]
    return {k: v.value for k, v in mats[-1].materialization.metadata.items()}


@pytest.fixture(scope="module")
def local_root(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("local")
    _through_orderings(_config(tmp, "root", "local"))
    return tmp / "root"


# --------------------------------------------------------------------------- tests
def test_ray_engine_writes_the_local_bytes(ray_cluster, local_root, tmp_path):
    address, _ = ray_cluster
    config = _config(tmp_path, "root", "ray", address)
    _through_orderings(config)
    local, remote = _artifacts(local_root), _artifacts(tmp_path / "root")
    assert "embeddings/embeddings.npy" in local and "orderings/greedy.parquet" in local and "tokens/tokens.bin" in local
    assert sorted(remote) == sorted(local)
    assert [k for k in local if local[k] != remote[k]] == []
    import duckdb

    with duckdb.connect(str(tmp_path / "root" / "strata.duckdb"), read_only=True) as con:
        params = dict(con.execute("SELECT asset, parameters FROM lineage WHERE asset IN ('tokens', 'embeddings')").fetchall())
    assert all(json.loads(p)["engine"] == "ray" for p in params.values()) and len(params) == 2


def _actor_running_a_shard(temp_dir: Path) -> int | None:
    for pid in _cluster_pids(temp_dir):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if title.startswith("ray::ShardActor.run"):
            return pid
    return None


def test_worker_killed_during_embedding_gives_identical_artifacts(ray_cluster, local_root, tmp_path):
    address, temp_dir = ray_cluster
    config = _config(tmp_path, "root", "ray", address)
    materialize(config, ["corpus"])
    killed: list[int] = []
    running = threading.Event()
    running.set()

    def kill_first_busy_actor() -> None:
        while running.is_set() and not killed:
            pid = _actor_running_a_shard(temp_dir)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.02)

    watcher = threading.Thread(target=kill_first_busy_actor, daemon=True)
    watcher.start()
    try:
        result = materialize(config, ["embeddings"])
    finally:
        running.clear()
        watcher.join()
    assert killed, "no embedding actor was caught running a shard"
    assert _metadata(result, "embeddings")["shards"] == N_DOCS // SHARD_DOCS
    ours = (tmp_path / "root" / "embeddings" / "embeddings.npy").read_bytes()
    assert ours == (local_root / "embeddings" / "embeddings.npy").read_bytes()


_DRIVER = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from pipeline.offline import set_offline
set_offline()
from test_distributed import materialize
materialize(Path({config!r}), ["embeddings"])
"""


def test_driver_killed_midway_rerun_resumes_and_matches(ray_cluster, local_root, tmp_path):
    address, _ = ray_cluster
    config = _config(tmp_path, "root", "ray", address)
    materialize(config, ["corpus"])
    work = tmp_path / "root" / "work" / "embeddings"
    code = _DRIVER.format(tests=str(Path(__file__).parent), config=str(config))
    driver = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not list(work.glob("embeddings-*.npz")) and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(driver.pid, signal.SIGKILL)
    finally:
        driver.wait()
    written = len(list(work.glob("embeddings-*.npz")))
    assert 1 <= written < N_DOCS // SHARD_DOCS, f"{written} shards written when the driver was killed"
    assert not (tmp_path / "root" / "embeddings" / "embeddings.npy").exists()
    meta = _metadata(materialize(config, ["embeddings"]), "embeddings")
    assert meta["shards_resumed"] == written and meta["shards"] == N_DOCS // SHARD_DOCS
    ours = (tmp_path / "root" / "embeddings" / "embeddings.npy").read_bytes()
    assert ours == (local_root / "embeddings" / "embeddings.npy").read_bytes()
    assert not list(work.glob("*.npz"))  # shard files are removed once the artifact exists


def test_bad_record_in_one_shard_fails_with_its_file_and_line(ray_cluster, tmp_path):
    from pipeline.config import CorpusConfig, RayConfig
    from pipeline.data.corpus import read_corpus
    from pipeline.distributed.engine import Shard, map_shards
    from pipeline.errors import StrataInputError

    address, _ = ray_cluster
    records = demo_slice(9)
    shards = []
    for i in range(3):
        lines = [json.dumps(r) for r in records[3 * i : 3 * i + 3]]
        if i == 1:
            lines[1] = lines[1][:-5]  # a truncated JSON object on line 2 of shard 1
        path = tmp_path / f"shard-{i}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        shards.append(Shard(path.name, (CorpusConfig(path=str(path), source_field="domain"), 0)))
    messages = {}
    for engine in ("local", "ray"):
        saved: list[str] = []
        with pytest.raises(StrataInputError) as err:
            map_shards(read_corpus, shards, lambda s, r: saved.append(s.name), engine=engine, ray_cfg=RayConfig(address=address))
        messages[engine] = str(err.value)
        assert "shard-0.jsonl" in saved and "shard-1.jsonl" not in saved
    assert messages["ray"] == messages["local"]
    assert messages["ray"].startswith(f"{tmp_path / 'shard-1.jsonl'}, line 2: malformed JSON")
    assert "Traceback" not in messages["ray"] and "Ray" not in messages["ray"]
