"""Object storage behind one small layer: ``s3://`` (and any fsspec protocol, e.g. ``gs://``) URLs
for the corpus and for exports, local paths untouched.

Everything that reads a corpus shard or writes an export asks this module, so the local code paths
stay the only code paths: :func:`is_url` tells a URL from a path, :func:`list_objects` lists what a
URL, a prefix or a glob names (with each object's ETag, size and last-modified from the listing),
:func:`open_input` opens an object for streamed reading with a bounded buffer (every range request
pinned to the ETag it was opened at), :func:`publish` uploads a finished local export under a
temporary prefix and commits it with its index last.

Endpoint and credentials come from the standard chain of the client (botocore): the environment
(``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` and
``~/.aws``, an instance role), the endpoint from ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL`` or
``S3_ENDPOINT_URL`` (the one MosaicML streaming reads). Nothing here ever formats a credential
into a message, and a URL that carries credentials (``s3://key:secret@bucket``) is refused.
Transient errors (5xx, throttling, dropped connections) are retried with exponential backoff and
jitter (botocore's ``standard`` mode, ``STRATA_S3_MAX_ATTEMPTS`` attempts, default 5); every other
failure is a :class:`~pipeline.errors.StrataInputError` naming the URL and the fix.

A listing or a read that lasts longer than :data:`PROGRESS_DELAY_S` shows a progress bar (tqdm,
on stderr, like the project's other long work; ``TQDM_DISABLE=1`` turns every bar off): objects
listed so far, and bytes read of an object's size.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

from tqdm import tqdm

from pipeline.errors import StrataInputError
from pipeline.storage.atomic import is_sidecar

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
BLOCK_SIZE = 8 << 20  # bytes buffered per open object (one range request at a time): the bound on a shard read in flight
MAX_ATTEMPTS = 5  # requests tried per call on transient errors (STRATA_S3_MAX_ATTEMPTS)
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "S3_ENDPOINT_URL")
PROGRESS_DELAY_S = 2.0  # seconds a listing or read runs before its progress bar appears (short ones stay quiet)
CREDENTIALS_FIX = ("give credentials through the standard chain: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                   "(and AWS_SESSION_TOKEN), or AWS_PROFILE naming a profile in ~/.aws/credentials, or an instance role")


def is_url(path: object) -> bool:
    """Whether ``path`` is an object-store URL (``s3://…``, ``gs://…``; ``file://`` is a local path)."""
    m = _SCHEME.match(str(path))
    return m is not None and m.group(1).lower() != "file"


def protocol(url: str) -> str:
    return _SCHEME.match(url).group(1).lower()  # type: ignore[union-attr]


def strip(url: str) -> str:
    """``bucket/key`` of ``scheme://bucket/key``."""
    return _SCHEME.sub("", url, count=1)


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *(p.strip("/") for p in parts if p)])


def carries_credentials(url: str) -> bool:
    """Whether the object-store URL ``url`` carries credentials or parameters (``KEY:SECRET@`` before
    the bucket, ``?…``): such a URL is refused, and never echoed."""
    return "@" in strip(url).split("/", 1)[0] or "?" in url


def check_url(url: str) -> str:
    """``url`` if it names a bucket and carries no credentials, else a StrataInputError."""
    rest = strip(url)
    bucket = rest.split("/", 1)[0]
    if carries_credentials(url):
        raise StrataInputError(f"{_SCHEME.match(url).group(0)}…: the URL carries credentials or parameters",  # type: ignore[union-attr]
                               fix=f"write the URL as scheme://bucket/key and {CREDENTIALS_FIX}")
    if not bucket:
        raise StrataInputError("the URL names no bucket", path=url, fix="write it as s3://bucket/prefix/")
    return url


def endpoint() -> str | None:
    """The S3 endpoint the environment names (None: the client's default, AWS itself). One that
    carries credentials (``http://KEY:SECRET@host``) or is not an ``http(s)://host[:port]`` URL is a
    StrataInputError naming the variable; its value is shown only when it holds no credentials."""
    for name in ENDPOINT_VARIABLES:
        value = os.environ.get(name)
        if not value:
            continue
        try:
            parts = urlsplit(value)
            secret = "@" in parts.netloc or bool(parts.query)
            parts.port  # noqa: B018 - a port that is not a number raises here
        except ValueError:
            parts, secret = None, "@" in value
        if secret:
            raise StrataInputError(f"the endpoint in {name} carries credentials or parameters (not shown)",
                                   fix=f"set {name} to scheme://host[:port] only, e.g. http://localhost:9000, and {CREDENTIALS_FIX}")
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise StrataInputError(f"the endpoint in {name} ({value!r}) is not an http(s)://host[:port] URL",
                                   fix=f"set {name} to e.g. http://localhost:9000 or https://s3.example.com, or unset it for AWS")
        return value
    return None


def _attempts() -> int:
    try:
        return max(1, int(os.environ.get("STRATA_S3_MAX_ATTEMPTS", MAX_ATTEMPTS)))
    except ValueError:
        return MAX_ATTEMPTS


def _chain_state() -> str:
    """A digest of the environment the credential chain reads: a new filesystem when it changes
    (the digest, never the values, is what is kept)."""
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE",
             "AWS_CONFIG_FILE", "AWS_DEFAULT_REGION", "AWS_REGION", *ENDPOINT_VARIABLES, "STRATA_S3_MAX_ATTEMPTS")
    return hashlib.sha256("\0".join(os.environ.get(n, "") for n in names).encode()).hexdigest()


def filesystem(url: str):
    """The fsspec filesystem of ``url``'s protocol, configured from the environment."""
    return _filesystem(protocol(url), _chain_state(), os.getpid())


@lru_cache(maxsize=16)
def _filesystem(proto: str, _state: str, _pid: int):
    import fsspec

    if proto in ("s3", "s3a"):
        import s3fs

        fs = s3fs.S3FileSystem(
            endpoint_url=endpoint(), skip_instance_cache=True, use_listings_cache=False, default_block_size=BLOCK_SIZE,
            config_kwargs={"retries": {"max_attempts": _attempts(), "mode": "standard"}, "connect_timeout": 10, "read_timeout": 120},
        )
        fs.retries = 1  # one retry policy, botocore's (s3fs's own loop would multiply the attempts)
        return fs
    try:
        return fsspec.filesystem(proto, skip_instance_cache=True)
    except (ImportError, ValueError) as exc:
        raise StrataInputError(f"no filesystem for {proto}:// URLs ({exc})",
                               fix=f"install fsspec's package for {proto}:// (e.g. gcsfs for gs://)") from None


# --------------------------------------------------------------------------- errors


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]


def _code(exc: BaseException) -> str:
    for e in _chain(exc):
        resp = getattr(e, "response", None)
        if isinstance(resp, dict) and resp.get("Error", {}).get("Code"):
            return str(resp["Error"]["Code"])
    return ""


def translate(exc: BaseException, url: str, doing: str) -> StrataInputError | None:
    """The StrataInputError a failed request on ``url`` means (None: not a storage failure). The
    message names the URL, the endpoint and the error code, never a credential."""
    names = {type(e).__name__ for e in _chain(exc)}
    code = _code(exc)
    where = f" at {endpoint()}" if endpoint() else ""
    if names & {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "ProfileNotFound"}:
        return StrataInputError(f"no credentials to {doing}{where}", path=url, fix=CREDENTIALS_FIX)
    if names & {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError", "ServerDisconnectedError",
                "ConnectionClosedError", "ProxyConnectionError", "ReadTimeoutError", "ResponseStreamingError", "ClientPayloadError",
                "ClientOSError", "ServerTimeoutError", "IncompleteReadError"} or isinstance(exc, ConnectionError):
        return StrataInputError(f"cannot reach the object store{where or ' (the client default, AWS)'} to {doing}", path=url,
                                fix="check the endpoint (AWS_ENDPOINT_URL or S3_ENDPOINT_URL), that it is running, "
                                    "and the network; transient failures were already retried")
    if code == "NoSuchBucket" or (isinstance(exc, FileNotFoundError) and "bucket" in str(exc).lower()):
        bucket = strip(url).split("/", 1)[0]
        return StrataInputError(f"the bucket {bucket!r} does not exist{where}", path=url,
                                fix="create the bucket or correct the URL (and AWS_ENDPOINT_URL if it points at another store)")
    if isinstance(exc, PermissionError) or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403",
                                                     "ExpiredToken", "InvalidToken", "AllAccessDisabled"):
        what = f" ({code})" if code else ""
        need = ("s3:ListBucket and s3:GetObject" if doing.startswith(("read", "list"))
                else "s3:ListBucket, s3:GetObject, s3:PutObject and s3:DeleteObject")
        return StrataInputError(f"the object store denied the request to {doing}{what}{where}", path=url,
                                fix=f"grant {need} on the bucket to the credentials in use, or check the key id and secret "
                                    f"({CREDENTIALS_FIX})")
    if code in ("SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "ServiceUnavailable", "InternalError",
                "RequestTimeout", "500", "502", "503", "504"):
        return StrataInputError(f"the object store kept failing ({code}) to {doing}{where}, after {_attempts()} attempts with backoff",
                                path=url, fix="run again later, or allow more attempts with STRATA_S3_MAX_ATTEMPTS")
    if isinstance(exc, FileNotFoundError) or code in ("NoSuchKey", "404"):
        return StrataInputError(f"no object at the URL{where}", path=url, fix="correct the URL, or upload the object")
    return None


@contextlib.contextmanager
def errors(url: str, doing: str) -> Iterator[None]:
    """Storage failures inside the block as StrataInputErrors naming ``url`` and the fix."""
    try:
        yield
    except StrataInputError:
        raise
    except Exception as exc:
        err = translate(exc, url, doing)
        if err is None:
            raise
        raise err from None


# --------------------------------------------------------------------------- progress


def _bar(desc: str, unit: str, total: int | None = None):
    """A progress bar that appears only once the work has lasted :data:`PROGRESS_DELAY_S` (and
    then stays, with the final count, like the project's other bars)."""
    scaled = unit == "B"
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=scaled, unit_divisor=1024 if scaled else 1000,
                delay=PROGRESS_DELAY_S, mininterval=0.5)


class _Counted:
    """An open object that counts the bytes read on a progress bar (random access: Parquet)."""

    def __init__(self, fh, bar):
        self._fh, self._bar = fh, bar

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(n)
        self._bar.update(len(data))
        return data

    def readinto(self, b) -> int:
        n = self._fh.readinto(b)
        self._bar.update(n or 0)
        return n

    def __getattr__(self, name: str):
        return getattr(self._fh, name)


# --------------------------------------------------------------------------- listing and metadata


@dataclass(frozen=True)
class ObjectInfo:
    """What the store says about one object: its version's identity, from a listing or a HEAD."""

    url: str
    etag: str
    size: int
    modified: str  # last-modified, ISO 8601

    @property
    def md5(self) -> str | None:
        """The object's MD5 when its ETag is one (a single-part upload without KMS), else None."""
        tag = self.etag.strip('"')
        return tag if re.fullmatch(r"[0-9a-f]{32}", tag) else None


def _info(url: str, raw: dict) -> ObjectInfo:
    mod = raw.get("LastModified") or raw.get("last_modified") or raw.get("mtime") or raw.get("updated") or ""
    mod = mod.isoformat() if hasattr(mod, "isoformat") else str(mod)
    lfs = raw.get("lfs") if isinstance(raw.get("lfs"), dict) else {}  # hf:// (huggingface_hub): the LFS SHA-256, else the git blob id
    etag = str(raw.get("ETag") or raw.get("etag") or raw.get("md5Hash") or raw.get("crc32c") or lfs.get("sha256")
               or raw.get("blob_id") or "")
    return ObjectInfo(url, etag, int(raw.get("size") or raw.get("Size") or 0), mod)


_LISTED: dict[str, tuple[float, ObjectInfo]] = {}  # url -> (when listed, info): the fingerprints right after a listing need no HEAD
LISTING_FRESH_S = 30.0


def list_objects(url: str) -> list[ObjectInfo]:
    """Every object ``url`` names: the object itself, every object under it (a prefix or bucket),
    sorted by URL. Missing: an empty list."""
    check_url(url)
    fs, scheme = filesystem(url), _SCHEME.match(url).group(0)  # type: ignore[union-attr]
    path = strip(url)
    if not path.strip("/"):
        raise StrataInputError("the URL names no bucket", path=url, fix="write it as s3://bucket/prefix/")
    with errors(url, "list the corpus"):
        found = _find(fs, path.rstrip("/"), url)
    now = time.monotonic()
    out = []
    for name, raw in sorted(found.items()):
        if raw.get("type", "file") != "file":
            continue
        info = _info(scheme + name, raw)
        _LISTED[info.url] = (now, info)
        out.append(info)
    return out


def _find(fs, path: str, url: str) -> dict[str, dict]:
    """What ``fs.find(path, detail=True)`` gives, page by page with a progress bar of the objects
    listed where the filesystem lists in pages (s3fs: one flat listing of the prefix)."""
    pages = getattr(fs, "_iterdir", None)
    if pages is None or not hasattr(fs, "split_path") or getattr(fs, "version_aware", False):
        return fs.find(path, detail=True)
    from fsspec.asyn import sync

    bucket, key, _ = fs.split_path(path)

    async def listing() -> dict[str, dict]:
        found = {}
        with _bar(f"list {url}", "obj") as bar:
            async for raw in pages(bucket, delimiter="", prefix=key):
                name = raw["name"]
                if raw.get("type") == "file" and (not key or name == path or name.startswith(path + "/")):
                    found[name] = raw
                bar.update()
        return found

    return sync(fs.loop, listing)


def object_info(url: str) -> ObjectInfo:
    """The object's ETag, size and last-modified (from a listing of the last few seconds, else a HEAD)."""
    hit = _LISTED.get(url)
    if hit is not None and time.monotonic() - hit[0] < LISTING_FRESH_S:
        return hit[1]
    with errors(url, "read a corpus object"):
        raw = filesystem(url).info(strip(url))
    if raw.get("type") == "directory":
        raise StrataInputError("the URL is a prefix, not an object", path=url, fix="name an object, or the prefix with a trailing /")
    return _info(url, raw)


def fingerprint(url: str, opts: str) -> str:
    """Data version of an object (32 hex digits) from its metadata: its ETag and size, and its
    last-modified too when the ETag is not the MD5 of the bytes (multipart or encrypted uploads)."""
    info = object_info(url)
    ident = [info.etag, str(info.size)] + ([] if info.md5 else [info.modified])
    return hashlib.sha256("\0".join([opts, "object", *ident]).encode()).hexdigest()[:32]


# --------------------------------------------------------------------------- reading


class _Verified(io.RawIOBase):
    """A sequential reader that hashes what passes and, at the end, checks the MD5 against the ETag."""

    def __init__(self, fh, url: str, md5: str | None, bar=None):
        self._fh, self._url, self._want, self._bar = fh, url, md5, bar
        self._md5 = hashlib.md5(usedforsecurity=False)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self._fh.read(min(len(b), BLOCK_SIZE))  # at most a block a request: the buffer stays bounded
        n = len(data)
        b[:n] = data
        self._md5.update(data)
        if self._bar is not None:
            self._bar.update(n)
        if n == 0 and self._want is not None and self._md5.hexdigest() != self._want:
            raise StrataInputError("the bytes read differ from the object's ETag (MD5): changed or corrupted in transit",
                                   path=self._url, fix="rerun; if it repeats, check the object and the endpoint")
        return n


@contextlib.contextmanager
def open_input(url: str, *, expect: str | None = None, opts: str = "", sequential: bool = False):
    """``url`` open for reading through a bounded buffer (:data:`BLOCK_SIZE`), every range request
    pinned to the ETag seen at opening (a replaced object fails the read instead of mixing versions).

    ``expect``: the fingerprint the caller computed (the partition's data version); the object's
    version now must still have it. ``sequential``: the whole object is read once in order, and its
    MD5 is checked against the ETag at the end where the ETag is one."""
    check_url(url)
    fs = filesystem(url)
    with errors(url, "read a corpus object"):
        fh = fs.open(strip(url), "rb", block_size=BLOCK_SIZE, cache_type="readahead")
    try:
        details = getattr(fh, "details", None) or {}
        info = _info(url, details) if details else object_info(url)
        if expect is not None:
            ident = [info.etag, str(info.size)] + ([] if info.md5 else [info.modified])
            now = hashlib.sha256("\0".join([opts, "object", *ident]).encode()).hexdigest()[:32]
            if now != expect:
                raise StrataInputError(f"the object changed since it was listed (data version {expect}, now {now})", path=url,
                                       fix="run again: the new version is fingerprinted and its partitions rerun")
        with errors(url, "read a corpus object"), _bar(f"read {url.rsplit('/', 1)[-1]}", "B", info.size) as bar:
            yield _Verified(fh, url, info.md5, bar) if sequential else _Counted(fh, bar)
    finally:
        fh.close()


# --------------------------------------------------------------------------- writing (exports)


MARKERS = (".strata-export", ".strata-root")  # a prefix holding one is Strata's: corpus listing skips it


def prefix_contents(url: str) -> list[ObjectInfo]:
    """Objects under the prefix ``url`` (an export's destination), sorted."""
    check_url(url)
    fs = filesystem(url)
    scheme = _SCHEME.match(url).group(0)  # type: ignore[union-attr]
    with errors(url, "list the export destination"):
        bucket = strip(url).split("/", 1)[0]
        if not fs.exists(bucket):
            raise FileNotFoundError(f"bucket {bucket} does not exist")
        found = fs.find(strip(url).rstrip("/") + "/", detail=True)
    return [_info(scheme + n, r) for n, r in sorted(found.items()) if r.get("type", "file") == "file"]


def _local_md5(path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def publish(local_dir, url: str, *, last: tuple[str, ...], marker: str) -> dict:
    """Upload the finished export ``local_dir`` to the prefix ``url`` so that no reader sees a
    half-written one: every file (but the local digest records) goes first under a temporary prefix beside it
    (``<url>/.strata-tmp-<id>/``); then the commit markers of the previous export there (``last``,
    e.g. ``meta.json`` and an index) are removed, the data objects copied into place server-side
    (an object byte-identical to the one already there — same MD5 — is not rewritten), the
    ``marker`` object written, the ``last`` files copied in the order given (``meta.json`` last of
    all: the commit), objects of the previous export that the new one lacks deleted, and the
    temporary prefix removed, with those an interrupted earlier publish left there. Returns
    ``{"uploaded", "kept", "deleted"}`` counts."""
    local_dir = Path(local_dir)
    fs = filesystem(url)
    base = strip(url).rstrip("/")
    tmp = f"{base}/.strata-tmp-{uuid.uuid4().hex[:12]}"
    # the local digest records stay local: the object store keeps its own checksum of each object
    files = sorted(p.relative_to(local_dir).as_posix() for p in local_dir.rglob("*") if p.is_file() and not is_sidecar(p))
    listed = {strip(i.url)[len(base) + 1:]: i for i in prefix_contents(url)}
    before = {k: v for k, v in listed.items() if not k.startswith(".strata-tmp-")}
    orphans = [f"{base}/{k}" for k in listed if k.startswith(".strata-tmp-")]  # a killed publish's uploads
    kept = uploaded = 0
    with errors(url, "write the export"):
        try:
            todo = []
            for rel in files:
                old = before.get(rel)
                if rel == marker or (old is not None and old.md5 is not None and rel not in last
                                     and old.md5 == _local_md5(local_dir / rel)):
                    kept += rel != marker
                    continue
                todo.append(rel)
            if todo:
                fs.put([str(local_dir / r) for r in todo], [f"{tmp}/{r}" for r in todo])
            for rel in last:  # uncommit the previous export before anything of it changes
                if rel in before:
                    fs.rm(f"{base}/{rel}")
            fs.pipe(f"{base}/{marker}", (local_dir / marker).read_bytes())  # Strata's from now on, even if cut short
            for rel in [r for r in todo if r not in last and r != marker] + [r for r in last if r in todo]:
                fs.copy(f"{tmp}/{rel}", f"{base}/{rel}")
                uploaded += 1
            stale = [f"{base}/{k}" for k in before if k not in set(files)]
            if stale or orphans:
                fs.rm(stale + orphans)
        finally:
            with contextlib.suppress(Exception):
                leftovers = fs.find(tmp + "/")
                if leftovers:
                    fs.rm(leftovers)
    return {"uploaded": uploaded, "kept": kept, "deleted": len(stale)}
