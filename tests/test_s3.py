"""Corpora and exports on object storage, against a real S3-protocol server (moto's standalone
server, a process on 127.0.0.1: tests/s3_server.py); the code under test uses its ordinary client."""

from __future__ import annotations

import gzip
import http.server
import json
import threading
import urllib.request

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from helpers import demo_slice

from pipeline.config import CorpusConfig
from pipeline.data.corpus import build_corpus, corpus_units, shard_key, unit_fingerprints, validate_unit
from pipeline.data.shards import discover_shards
from pipeline.errors import StrataInputError
from pipeline.storage import remote
from pipeline.storage.atomic import is_sidecar


def _lines(records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def _shards(recs) -> dict[str, bytes]:
    """The same four shards in four formats, as bytes by relative path."""
    import io

    buf = io.BytesIO()
    pl.DataFrame(recs[:20]).write_parquet(buf)
    zst = pa.BufferOutputStream()
    with pa.CompressedOutputStream(zst, "zstd") as fh:
        fh.write(_lines(recs[40:60]))
    return {"a.parquet": buf.getvalue(), "b.jsonl.gz": gzip.compress(_lines(recs[20:40])),
            "sub/c.jsonl.zst": zst.getvalue().to_pybytes(), "d.jsonl": _lines(recs[60:])}


@pytest.fixture
def corpus(tmp_path, s3_bucket):
    """The same corpus on disk and in the bucket under ``shards/``, beside things that are not corpus."""
    recs = [{"id": r["id"], "text": r["text"], "source": r["domain"]} for r in demo_slice(80)]
    local = tmp_path / "shards"
    for rel, data in _shards(recs).items():
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(data)
        s3_bucket.put(f"shards/{rel}", data)
    s3_bucket.put("shards/notes.txt", b"not a shard")
    s3_bucket.put("shards/.hidden/x.jsonl", _lines(recs[:1]))
    s3_bucket.put("shards/old-export/.strata-export", b"an export")  # an export below the prefix is never corpus
    s3_bucket.put("shards/old-export/data/train-00000-of-00001.parquet", _shards(recs)["a.parquet"])
    return local, f"{s3_bucket.url}/shards/", recs


def test_a_corpus_in_a_bucket_reads_like_the_same_corpus_on_disk(corpus, tmp_path, s3_bucket):
    local, url, recs = corpus
    found = discover_shards(url)
    assert found == [f"{url}{n}" for n in ("a.parquet", "b.jsonl.gz", "d.jsonl", "sub/c.jsonl.zst")]
    assert discover_shards(f"{url}**/*.jsonl*") == [f"{url}{n}" for n in ("b.jsonl.gz", "d.jsonl", "sub/c.jsonl.zst")]
    assert discover_shards([f"{url}d.jsonl", f"{url}a.parquet"]) == [f"{url}a.parquet", f"{url}d.jsonl"]

    def build(path, root):
        built = build_corpus(CorpusConfig(path=path), 0, 0.1, root / "shards", root / "corpus.parquet")
        return built, pl.read_parquet(root / "corpus.parquet")

    (tmp_path / "r1").mkdir(), (tmp_path / "r2").mkdir()
    on_disk, disk_rows = build(str(local), tmp_path / "r1")
    in_bucket, bucket_rows = build(url, tmp_path / "r2")
    assert bucket_rows.drop("shard").equals(disk_rows.drop("shard"))  # same documents, ids, hashes, split
    assert in_bucket.manifest["n_docs"].to_list() == on_disk.manifest["n_docs"].to_list()
    assert in_bucket.n_heldout == on_disk.n_heldout and in_bucket.report.n_read == 80
    assert [shard_key(u).split("@")[0] for u in in_bucket.manifest["path"]] == ["a.parquet", "b.jsonl.gz", "d.jsonl", "c.jsonl.zst"]


def test_fingerprints_follow_object_versions(corpus, s3_bucket):
    _, url, recs = corpus
    cfg = CorpusConfig(path=url)
    before = unit_fingerprints(cfg)
    assert unit_fingerprints(cfg) == before  # unchanged objects: the same data versions
    s3_bucket.put("shards/d.jsonl", _lines(recs[60:79]))  # an edit changes its own version only
    s3_bucket.put("shards/e.jsonl", _lines([{"id": "new", "text": "an appended shard"}]))  # an append adds one
    remote._LISTED.clear()
    after = unit_fingerprints(cfg)
    assert sorted(after) == sorted([*before, f"{url}e.jsonl"])
    assert [u for u in before if after[u] != before[u]] == [f"{url}d.jsonl"]
    assert CorpusConfig(path=url, on_error="skip") != cfg
    assert unit_fingerprints(CorpusConfig(path=url, on_error="skip"))[f"{url}a.parquet"] != after[f"{url}a.parquet"]


def test_an_object_replaced_after_listing_is_not_read_as_its_old_version(corpus, s3_bucket, tmp_path):
    _, url, recs = corpus
    cfg = CorpusConfig(path=url)
    fp = unit_fingerprints(cfg)[f"{url}d.jsonl"]
    s3_bucket.put("shards/d.jsonl", _lines(recs[61:]))
    remote._LISTED.clear()
    with pytest.raises(StrataInputError, match="changed since it was listed"):
        validate_unit(f"{url}d.jsonl", cfg, 0.1, 0, tmp_path / "v.parquet", 8192, fp)
    assert not (tmp_path / "v.parquet").exists()


def test_a_large_object_streams_in_bounded_ranges(s3_bucket, tmp_path, monkeypatch):
    """Reading never buffers more than one block: the server sees several ranged GETs of the object."""
    monkeypatch.setattr(remote, "BLOCK_SIZE", 1 << 18)
    text = "x" * 2000
    data = _lines([{"id": str(i), "text": f"{i} {text}"} for i in range(600)])  # about 1.2 MB
    url = s3_bucket.put("big/big.jsonl", data)
    log = s3_bucket.server.log
    start = log.stat().st_size
    info = validate_unit(url, CorpusConfig(path=url), 0.0, 0, tmp_path / "v.parquet", 100,
                         unit_fingerprints(CorpusConfig(path=url))[url])
    assert info["n_read"] == 600
    gets = [line for line in log.read_text().splitlines()[-400:] if "GET /" + s3_bucket.name + "/big/big.jsonl" in line]
    assert len(gets) >= 2 and all(" 206 " in g for g in gets), gets[:3]  # ranges, never the whole object at once
    assert start < log.stat().st_size


@pytest.mark.parametrize("case", ["missing bucket", "denied", "no credentials", "unreachable", "no objects"])
def test_storage_failures_are_input_errors_naming_the_url_and_the_fix(case, s3_bucket, monkeypatch, tmp_path):
    s3_bucket.put("c/a.jsonl", _lines([{"id": "1", "text": "hello"}]))
    spec, want = f"{s3_bucket.url}/c/", ""
    if case == "missing bucket":
        spec, want = "s3://strata-no-such-bucket/c/", "does not exist"
    elif case == "no credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        want = "no credentials"
    elif case == "unreachable":
        from s3_server import free_port

        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
        monkeypatch.setenv("STRATA_S3_MAX_ATTEMPTS", "1")
        want = "cannot reach"
    elif case == "no objects":
        spec, want = f"{s3_bucket.url}/nothing/", "no objects"
    if case == "denied":
        import boto3

        iam = boto3.client("iam", endpoint_url=s3_bucket.server.endpoint)
        iam.create_user(UserName=f"u-{s3_bucket.name}")
        key = iam.create_access_key(UserName=f"u-{s3_bucket.name}")["AccessKey"]  # a user no policy allows anything
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        s3_bucket.server.set_auth(True)
        want = "denied"
    try:
        with pytest.raises(StrataInputError) as err:
            corpus_units(CorpusConfig(path=spec))
    finally:
        if case == "denied":
            s3_bucket.server.set_auth(False)
    msg = str(err.value)
    assert want in msg and spec.rstrip("/") in msg and "Fix:" in msg, msg
    for secret in (s3_bucket.secret, s3_bucket.key_id):
        assert secret not in msg
    if case == "denied":
        assert "AccessDenied" in msg and "s3:ListBucket" in msg


def test_credentials_in_a_url_are_refused_and_never_echoed():
    from pydantic import ValidationError

    from pipeline.config import config_from_dict

    url = "s3://AKIAXX:topsecretvalue@bucket/data/"
    with pytest.raises(StrataInputError) as err:  # at load, before anything is written (tests/test_hostile.py)
        config_from_dict({"corpus": {"path": url}})
    with pytest.raises(ValidationError) as invalid:
        CorpusConfig(path=url)
    with pytest.raises(StrataInputError) as found:  # and at discovery, for a config built without validation
        corpus_units(CorpusConfig.model_construct(path=url))
    for shown in (str(err.value), str(invalid.value), str(found.value)):
        assert "topsecretvalue" not in shown and "AKIAXX" not in shown


class _Flaky(http.server.BaseHTTPRequestHandler):
    """A proxy in front of the server that answers the first ``fail`` requests 503 SlowDown."""

    fail = 0
    upstream = ""
    seen: list[int] = []

    def _relay(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
        if _Flaky.fail > 0:
            _Flaky.fail -= 1
            _Flaky.seen.append(503)
            payload = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        req = urllib.request.Request(_Flaky.upstream + self.path, data=body, method=self.command,
                                     headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
        try:
            resp = urllib.request.urlopen(req, timeout=30)
        except urllib.error.HTTPError as e:
            resp = e
        data = resp.read()
        _Flaky.seen.append(resp.status if hasattr(resp, "status") else resp.code)
        self.send_response(resp.status if hasattr(resp, "status") else resp.code)
        for k, v in resp.headers.items():
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _relay

    def log_message(self, *args):
        pass


def test_transient_errors_are_retried_with_backoff(s3_bucket, monkeypatch):
    url = s3_bucket.put("r/a.jsonl", _lines([{"id": "1", "text": "hello"}]))
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        _Flaky.upstream, _Flaky.seen = s3_bucket.server.endpoint, []
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.server_address[1]}")
        monkeypatch.setenv("STRATA_S3_MAX_ATTEMPTS", "4")
        _Flaky.fail = 2
        assert corpus_units(CorpusConfig(path=url)) == [url]  # two 503s, then the answer
        assert _Flaky.seen[:3] == [503, 503, 200]
        monkeypatch.setenv("STRATA_S3_MAX_ATTEMPTS", "2")
        _Flaky.fail, _Flaky.seen = 10, []
        with pytest.raises(StrataInputError, match="kept failing .SlowDown. .* after 2 attempts") as err:
            corpus_units(CorpusConfig(path=f"{s3_bucket.url}/r/"))
        assert 2 <= len(_Flaky.seen) <= 4 and set(_Flaky.seen) == {503}  # gives up after its attempts (per request)
        assert "STRATA_S3_MAX_ATTEMPTS" in str(err.value)
    finally:
        proxy.shutdown()


# --------------------------------------------------------------------------- exports


def _stream():
    from test_export import _data

    stream, store, order = _data("concat")
    return stream, store, order


def _objects(bucket, prefix: str) -> dict[str, dict]:
    fs = bucket.fs()
    return {k[len(bucket.name) + len(prefix) + 2:]: v for k, v in fs.find(f"{bucket.name}/{prefix}/", detail=True).items()}


def test_exports_to_a_bucket_equal_the_disk_export_and_megatron_reads_them(s3_bucket, tmp_path):
    """All four formats under s3:// prefixes: every object equals the same export written to disk,
    and megatron-core's IndexedDataset reads the megatron one through its own S3 reader.
    (MosaicML streaming and HF datasets read an export from the endpoint in tests/test_s3_graph.py.)"""
    from test_export import G, expected_batches

    from pipeline.export import export_stream
    from pipeline.export.writer import EXPORT_MARKER

    stream, store, order = _stream()
    n = order.size // G * G
    want = expected_batches(store, order).reshape(n, -1)
    for fmt in ("numpy", "megatron", "mds", "hf"):
        url = f"{s3_bucket.url}/exports/{fmt}"
        info = export_stream(stream, fmt, url, global_batch=G, data_root=tmp_path / "root")
        local = tmp_path / fmt
        export_stream(stream, fmt, local, global_batch=G)
        objs = _objects(s3_bucket, f"exports/{fmt}")
        # the local digest records (pipeline/storage/atomic.py: sidecar) stay local: the store keeps its own checksums
        on_disk = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file() and not is_sidecar(p))
        assert sorted(objs) == on_disk and EXPORT_MARKER in objs and "meta.json" in objs
        for rel in (r for r in on_disk if r != EXPORT_MARKER):
            assert s3_bucket.fs().cat(f"{s3_bucket.name}/exports/{fmt}/{rel}") == (local / rel).read_bytes(), rel
        assert info["files"][0].startswith(url + "/") and not any(".strata-tmp-" in k for k in objs)
        assert not list((tmp_path / "root").glob(".export-*"))  # the local staging is gone
    # megatron-core's own S3 reader of the indexed dataset
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.object_storage_utils import ObjectStorageConfig

    idx = IndexedDataset(f"{s3_bucket.url}/exports/megatron/tokens", mmap=False,
                         object_storage_config=ObjectStorageConfig(path_to_idx_cache=str(tmp_path / "idx"), bin_chunk_nbytes=4096))
    np.testing.assert_array_equal(np.stack([idx[i][: want.shape[1]] for i in range(n)]), want)


def test_an_export_replaces_only_what_strata_wrote_under_a_prefix(s3_bucket, tmp_path):
    from pipeline.export import export_stream

    stream, _, _ = _stream()
    foreign = s3_bucket.put("theirs/model.safetensors", b"weights")
    with pytest.raises(StrataInputError, match="not an export Strata wrote") as err:
        export_stream(stream, "hf", f"{s3_bucket.url}/theirs", global_batch=8)
    assert "--force" in err.value.fix and s3_bucket.fs().cat(remote.strip(foreign)) == b"weights"
    with pytest.raises(StrataInputError, match="bucket's root"):
        export_stream(stream, "hf", s3_bucket.url, global_batch=8, force=True)
    url = f"{s3_bucket.url}/mine"
    export_stream(stream, "mds", url, global_batch=8)
    first = _objects(s3_bucket, "mine")
    export_stream(stream, "mds", url, global_batch=8)  # again: its own export is replaced without --force
    again = _objects(s3_bucket, "mine")
    assert sorted(again) == sorted(first)
    shards = [k for k in first if k.startswith("shard.")]
    assert shards and all(again[k]["LastModified"] == first[k]["LastModified"] for k in shards)  # unchanged objects not rewritten
    export_stream(stream, "hf", f"{s3_bucket.url}/theirs", global_batch=8, force=True)
    assert "model.safetensors" not in _objects(s3_bucket, "theirs")  # --force replaces everything under the prefix


def test_listings_and_reads_show_progress_once_they_last(s3_bucket, tmp_path, monkeypatch, capfd):
    """tqdm bars on stderr: objects listed, bytes read of each object's size (Parquet's random
    access counted too); work shorter than PROGRESS_DELAY_S shows none."""
    import io

    body = "".join(json.dumps({"id": str(i), "text": f"word {i} " * 200}) + "\n" for i in range(1000)).encode()
    s3_bucket.put("p/big.jsonl", body)
    buf = io.BytesIO()
    pl.DataFrame({"id": ["x", "y"], "text": ["one text", "another"]}).write_parquet(buf)
    s3_bucket.put("p/t.parquet", buf.getvalue())
    for i in range(3):
        s3_bucket.put(f"p/s{i}.jsonl", _lines([{"id": f"s{i}", "text": "small"}]))
    url = f"{s3_bucket.url}/p/"
    monkeypatch.setattr(remote, "PROGRESS_DELAY_S", 60.0)
    capfd.readouterr()
    build_corpus(CorpusConfig(path=url), 0, 0.0, tmp_path / "q" / "shards", tmp_path / "q" / "c.parquet")
    quiet = capfd.readouterr().err
    assert "list s3://" not in quiet and "read big.jsonl" not in quiet

    monkeypatch.setattr(remote, "PROGRESS_DELAY_S", 0.0)
    capfd.readouterr()
    assert len(discover_shards(url)) == 5
    listed = capfd.readouterr().err
    assert f"list {s3_bucket.url}/p: 5obj" in listed, listed
    build_corpus(CorpusConfig(path=url), 0, 0.0, tmp_path / "shards", tmp_path / "c.parquet")
    read = capfd.readouterr().err
    assert "read big.jsonl: 100%" in read and f"{len(body) / 1024 ** 2:.2f}M/{len(body) / 1024 ** 2:.2f}M" in read, read[-2000:]
    assert "read t.parquet:" in read and "read s2.jsonl: 100%" in read


def test_objects_whose_key_has_a_dot_component_are_refused_not_skipped(s3_bucket):
    """``a/./b.jsonl`` and ``a/../b.jsonl`` are distinct objects to the store, but paths and tools
    normalize them into other names: refused naming one and the fix, never silently dropped."""
    s3_bucket.put("c/ok.jsonl", _lines([{"id": "1", "text": "hello"}]))
    for key in ("c/./dot.jsonl", "c/sub/../up.jsonl"):
        s3_bucket.put(key, _lines([{"id": "2", "text": "lost?"}]))
        listed = [o.url for o in remote.list_objects(f"{s3_bucket.url}/c")]
        if not any(key.split("/")[-1] in u and ("/./" in u or "/../" in u) for u in listed):
            pytest.skip(f"the server normalizes {key!r} itself")
        with pytest.raises(StrataInputError, match="'.' or '..' component") as err:
            discover_shards(f"{s3_bucket.url}/c/")
        assert key.split("/", 1)[1] in str(err.value) and "Fix:" in str(err.value)
        s3_bucket.fs().rm(f"{s3_bucket.name}/{key}")
    assert discover_shards(f"{s3_bucket.url}/c/") == [f"{s3_bucket.url}/c/ok.jsonl"]
