"""A real multi-node Ray cluster on one machine (one raylet per node), for tests and benchmarks.

``ray start --head`` plus ``ray start --address`` per extra node, each with its own resources.
Stopping kills exactly this cluster's processes — its daemons carry its private temp folder on
their command line, the agents and workers are their children — because ``ray stop --force``
would also stop every other Ray cluster of the same user on the machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import ray.util


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_pids(temp_dir: Path) -> list[int]:
    """Every live process of the cluster under ``temp_dir`` (daemons and their descendants)."""
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
    while kids := {pid for pid, (ppid, _) in procs.items() if ppid in mine} - mine:
        mine |= kids
    return sorted(mine)


def process_title(pid: int) -> str:
    """A Ray worker's title, e.g. ``ray::ShardActor.run`` while it runs a shard ("" when gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


def stop_cluster(temp_dir: Path) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        for pid in cluster_pids(temp_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while cluster_pids(temp_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
    shutil.rmtree(temp_dir, ignore_errors=True)


@contextlib.contextmanager
def local_cluster(node_cpus: list[int]) -> Iterator[tuple[str, Path]]:
    """Start one node per entry of ``node_cpus`` (the first is the head); yield (address, temp dir)."""
    temp_dir = Path(tempfile.mkdtemp(prefix="strata-ray-", dir="/tmp"))  # short: Ray's socket paths are length-limited
    exe = str(Path(sys.executable).with_name("ray"))
    port = _free_port()
    # the address a driver's ray.init resolves 127.0.0.1 to (the interface of the default route, when
    # there is one): the nodes bind there, so the address handed out is the one a driver connects to
    node_ip = ray.util.get_node_ip_address()
    common = ["--num-gpus=0", f"--node-ip-address={node_ip}", "--disable-usage-stats"]
    # no token authentication: `ray start` turns it on whenever ~/.ray/auth_token exists (any local
    # ray.init() writes one), and a driver connecting by address does not send the token
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    head = [exe, "start", "--head", f"--port={port}", f"--temp-dir={temp_dir}", "--include-dashboard=false",
            f"--dashboard-port={_free_port()}", f"--ray-client-server-port={_free_port()}"]
    try:
        for i, cpus in enumerate(node_cpus):
            cmd = head if i == 0 else [exe, "start", f"--address={node_ip}:{port}"]
            proc = subprocess.run([*cmd, f"--num-cpus={cpus}", *common], capture_output=True, text=True, timeout=180, env=env)
            if proc.returncode:
                raise RuntimeError(f"ray start failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        yield f"{node_ip}:{port}", temp_dir
    finally:
        stop_cluster(temp_dir)
