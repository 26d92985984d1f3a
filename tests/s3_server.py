"""A real S3-protocol server for the tests: moto's standalone server (``moto.server``, a Flask app
speaking the S3 REST API over HTTP) started as its own process on 127.0.0.1 at a free port. The
code under test talks to it through its ordinary client (s3fs / botocore, MosaicML streaming's
boto3, datasets' fsspec) exactly as to any S3 endpoint; nothing in the client is patched."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen
    log: Path

    def set_auth(self, enforced: bool) -> None:
        """Turn the server's request authentication (IAM) on or off (moto's ``/moto-api/reset-auth``)."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset-auth", data=b"0" if enforced else b"inf", method="POST",
                                     headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(req, timeout=10).read()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_server(log: Path, port: int | None = None) -> S3Server:
    """The server on ``port`` (a free one when None; the port of a stopped server restarts it at
    the same endpoint, empty: moto keeps its objects in memory)."""
    port = port or free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    fh = open(log, "ab")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=fh, stderr=subprocess.STDOUT, env=env)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).read()
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto server did not answer on {endpoint}: {log.read_text()[-2000:]}") from None
            time.sleep(0.1)
    return S3Server(endpoint, proc, log)


@dataclass
class Bucket:
    """A fresh bucket on the server, with the environment (endpoint, credentials) pointing at it."""

    server: S3Server
    name: str
    key_id: str
    secret: str
    _fs: object = None

    def create(self) -> None:
        self.fs().mkdir(self.name)

    @property
    def url(self) -> str:
        return f"s3://{self.name}"

    def fs(self):
        import s3fs

        if self._fs is None:
            self._fs = s3fs.S3FileSystem(endpoint_url=self.server.endpoint, key=self.key_id, secret=self.secret,
                                         skip_instance_cache=True, use_listings_cache=False)
        return self._fs

    def put(self, key: str, data: bytes | Path) -> str:
        self.fs().pipe(f"{self.name}/{key}", data if isinstance(data, bytes) else Path(data).read_bytes())
        return f"s3://{self.name}/{key}"


def s3_environment(monkeypatch, server: S3Server, tmp_path: Path) -> tuple[str, str]:
    """Point the standard credential chain at ``server`` with a fresh key pair (returned), and no
    profile or instance role to fall back on."""
    key_id = "AKIA" + uuid.uuid4().hex[:16].upper()
    secret = "strata-secret-" + uuid.uuid4().hex
    for name in list(os.environ):
        if name.startswith("AWS_") or name in ("S3_ENDPOINT_URL",):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("S3_ENDPOINT_URL", server.endpoint)  # MosaicML streaming's variable
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("STRATA_S3_MAX_ATTEMPTS", "2")
    return key_id, secret
