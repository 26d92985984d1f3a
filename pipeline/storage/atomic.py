"""Atomic, deterministic artifact writes (temp file + fsync + rename) and content hashes.

Every artifact under the data root is written through these helpers, so a reader never sees a
partial file: either the previous complete version or the new complete version exists.

Content hashes are taken while writing: :func:`atomic_writer` (and every ``write_*`` helper
here) feeds each byte to SHA-256 as it goes to the file and remembers the digest for the
renamed file, keyed by its inode, size and change times, so :func:`file_sha256` of an artifact
this process wrote never reads it back. The digest also goes into a hidden sidecar file beside
it, ``.<name>.sha256`` (:func:`sidecar`), with the size and modification time it holds for, so
another process (a later run, a Dagster step of its own) takes it from there while the file is
unchanged. The record lies in the folder, not in the file's metadata, so it travels with every
copy of the data root (``cp -r``, ``rsync -a``, tar, an object store drop extended attributes):
a copied file whose bytes no longer match its record is corrupt, never a new truth. Only
:func:`atomic_writer` writes a record, for the bytes it just wrote; replacing a file through
:func:`atomic_path` drops its record first. Roots written before sidecars carried the record in
the extended attribute ``user.strata.sha256``, which is still read where there is no sidecar. A
file written otherwise is read once and then remembered in this process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np
from numpy.lib import format as npy

from pipeline.errors import StrataInputError

if TYPE_CHECKING:  # polars is only needed by callers that hand in a frame
    import polars as pl


_UMASK = os.umask(0o022)
_FLOAT32 = np.dtype(np.float32)  # write_rows's default row dtype
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; artifacts are ordinary files
        forget_sha256(path)  # the record of the bytes replaced; atomic_writer records the new ones
        os.replace(tmp_path, path)
    except OSError as exc:
        if exc.filename is None:  # a write to an open file names none: name the artifact (a full disk says where)
            exc.filename = str(path)
        raise
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


_DIGESTS: dict[str, tuple[tuple[int, int, int, int], str]] = {}


def _stat_key(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


XATTR = "user.strata.sha256"  # where roots written before sidecars keep the record
SIDECAR_SUFFIX = ".sha256"


def sidecar(path: str | os.PathLike) -> Path:
    """The hidden file beside ``path`` that holds the SHA-256 Strata recorded when it wrote it:
    ``.<name>.sha256``, one line ``<sha256> <size> <mtime_ns>``."""
    path = Path(path)
    return path.with_name(f".{path.name}{SIDECAR_SUFFIX}")


def is_sidecar(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a digest record (:func:`sidecar`), which goes with its file and is never an artifact."""
    name = Path(path).name
    return name.startswith(".") and name.endswith(SIDECAR_SUFFIX) and len(name) > len(SIDECAR_SUFFIX) + 1


def sidecar_of(record: str | os.PathLike) -> Path:
    """The file a digest record (:func:`is_sidecar`) belongs to."""
    record = Path(record)
    return record.with_name(record.name[1:-len(SIDECAR_SUFFIX)])


def remember_sha256(path: str | os.PathLike, digest: str) -> None:
    """Record ``digest`` as the SHA-256 of ``path`` as it is now (until it changes on disk), in this
    process and in its sidecar (written atomically). Called for bytes this process just wrote, never
    for a file it only read."""
    path = Path(path).resolve()
    st = path.stat()
    record = sidecar(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f"{record.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as fh:
                fh.write(f"{digest} {st.st_size} {st.st_mtime_ns}\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o666 & ~_UMASK)
            os.replace(tmp, record)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:  # a folder that takes no new file: this process remembers it
        pass
    _DIGESTS[str(path)] = (_stat_key(path), digest)


def forget_sha256(path: str | os.PathLike) -> None:
    """Drop the record of ``path`` (its sidecar, and this process's memory): its bytes are about to be
    replaced, or it is being removed."""
    path = Path(path)
    sidecar(path).unlink(missing_ok=True)
    _DIGESTS.pop(str(path.resolve()), None)


def _record(path: Path) -> tuple[str, int, int] | None:
    """``(sha256, size, mtime_ns)`` Strata recorded for ``path``: its sidecar, else (a root written
    before sidecars) its extended attribute; None when there is none or it cannot be read."""
    try:
        text = sidecar(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        try:
            text = os.getxattr(path, XATTR).decode()
        except (AttributeError, OSError, UnicodeDecodeError):
            return None
    try:
        digest, size, mtime = text.split()
        int(digest, 16)
        return digest, int(size), int(mtime)
    except ValueError:
        return None


def _attribute_sha256(path: Path) -> str | None:
    """The digest recorded for ``path`` (:func:`_record`), if it was taken for the file as it is now."""
    rec = _record(path)
    if rec is None:
        return None
    st = path.stat()
    return rec[0] if (rec[1], rec[2]) == (st.st_size, st.st_mtime_ns) else None


class HashingWriter:
    """A binary file that hashes (SHA-256) every byte written through it, in order."""

    def __init__(self, fh) -> None:
        self._fh, self._h, self._n = fh, hashlib.sha256(), 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self._h.update(view)
        self._n += view.nbytes
        return self._fh.write(view)

    def tell(self) -> int:
        return self._n

    def flush(self) -> None:
        self._fh.flush()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return self._fh.closed

    def hexdigest(self) -> str:
        return self._h.hexdigest()


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[HashingWriter]:
    """Yield a :class:`HashingWriter` onto a temporary file that replaces ``path`` if the block
    succeeds; the digest of the bytes written is remembered for ``path`` (see :func:`file_sha256`)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            out = HashingWriter(fh)
            yield out
    remember_sha256(path, out.hexdigest())


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary directory; swap it into ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        try:
            yield tmp
        except OSError as exc:
            if exc.filename is None:  # name the directory being written (a full disk says where)
                exc.filename = str(path)
            raise
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        old = path.with_name(f".{path.name}.old")
        if old.exists():
            shutil.rmtree(old)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        if old.exists():
            shutil.rmtree(old)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def write_parquet(df: pl.DataFrame, path: str | os.PathLike) -> Path:
    """Write ``df`` atomically; no statistics timestamps, so equal frames give equal bytes."""
    with atomic_writer(path) as fh:
        df.write_parquet(fh, compression="zstd", statistics=False)
    return Path(path)


def write_npy(arr: np.ndarray, path: str | os.PathLike) -> Path:
    """Write a plain (non-object) array atomically as .npy."""
    if arr.dtype == object:
        raise TypeError("object arrays are not written (they would need pickle)")
    with atomic_writer(path) as fh:
        np.save(fh, arr, allow_pickle=False)
    return Path(path)


def write_rows(blocks: Iterable[np.ndarray], n_rows: int, path: str | os.PathLike, dtype: np.dtype = _FLOAT32) -> Path:
    """Write ``n_rows`` rows, given as consecutive 2-D blocks, atomically as one ``.npy``, the bytes
    ``np.save`` writes (memory: one block)."""
    with atomic_writer(path) as fh:
        at = width = 0
        for block in blocks:
            block = np.ascontiguousarray(block, dtype=dtype)
            if not at and not width:
                width = block.shape[1]
                npy.write_array_header_1_0(fh, npy.header_data_from_array_1_0(np.empty((n_rows, width), dtype)))
            if block.ndim != 2 or block.shape[1] != width or at + block.shape[0] > n_rows:
                raise ValueError(f"{path}: block of shape {block.shape} after {at} of {n_rows} rows of width {width}")
            fh.write(block)
            at += block.shape[0]
        if not width or at != n_rows:
            raise ValueError(f"{path}: got {at} rows for {n_rows}")
    return Path(path)


def write_bin(arr: np.ndarray, path: str | os.PathLike) -> Path:
    """Write the raw bytes of a contiguous array atomically (read back with ``np.memmap``)."""
    with atomic_writer(path) as fh:
        fh.write(np.ascontiguousarray(arr))
    return Path(path)


def write_text(text: str, path: str | os.PathLike) -> Path:
    with atomic_writer(path) as fh:
        fh.write(text.encode("utf-8"))
    return Path(path)


def write_json(obj: object, path: str | os.PathLike) -> Path:
    return write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", path)


def recorded_sha256(path: str | os.PathLike) -> str | None:
    """The SHA-256 Strata recorded for ``path`` when it wrote it (its sidecar, :func:`sidecar`), whatever
    the file's size and modification time are now; None when nothing was recorded."""
    rec = _record(Path(path))
    return None if rec is None else rec[0]


def record_mismatch(path: str | os.PathLike) -> tuple[str, str] | None:
    """``(recorded, now)`` SHA-256 digests when the bytes of ``path`` (read again: size and modification time
    are no evidence) are not those Strata recorded when it wrote it; None when they are, or when
    nothing was recorded. Never records anything."""
    want = recorded_sha256(path)
    if want is None:
        return None
    now = _read_sha256(Path(path))
    return None if now == want else (want, now)


def corrupted(path: Path, recorded: str, now: str, fix: str | None = None) -> "Exception":
    return StrataInputError(
        f"the file changed on disk since Strata wrote it (recorded SHA-256 {recorded[:16]}..., its bytes now {now[:16]}...): "
        "it is corrupt or was edited, and is not used", path=path,
        fix=fix or "rematerialize the asset that writes it (strata run; `strata status` names it), or restore the file")


def _read_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


_VERIFIED: dict[str, tuple[int, int, int, int]] = {}


def verify_sha256(path: str | os.PathLike, expected: str | None = None, fix: str | None = None) -> str:
    """The SHA-256 of ``path``, read from its bytes (size and modification time are no evidence: a
    flipped byte keeps both) and compared with ``expected``, else with the digest recorded when
    Strata wrote it; a mismatch is a StrataInputError naming the file (never the new truth). Once
    verified, a file is not read again by this process while its stat is unchanged."""
    path = Path(path).resolve()
    key = _stat_key(path)
    want = expected or recorded_sha256(path)
    known = _DIGESTS.get(str(path))
    if _VERIFIED.get(str(path)) == key and known is not None and known[0] == key and (want is None or want == known[1]):
        return known[1]
    now = _read_sha256(path)
    if want is not None and now != want:
        raise corrupted(path, want, now, fix)
    if _stat_key(path) == key:
        _DIGESTS[str(path)] = (key, now)
        _VERIFIED[str(path)] = key
    return now


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes: the digest taken while it was written (this process's memory,
    else the file's extended attribute), if the file has not changed since; else read (streams;
    any size) and remembered. A file whose size or modification time changed since Strata recorded
    its digest and whose bytes no longer match it is a StrataInputError (:func:`corrupted`): its new
    digest is never recorded as the truth."""
    path = Path(path).resolve()
    known = _DIGESTS.get(str(path))
    if known is not None and known[0] == _stat_key(path):
        return known[1]
    key = _stat_key(path)
    stored = _attribute_sha256(path)
    if stored is not None:
        _DIGESTS[str(path)] = (key, stored)
        return stored
    now = _read_sha256(path, chunk)
    recorded = recorded_sha256(path)
    if recorded is not None and recorded != now:
        raise corrupted(path, recorded, now)
    if _stat_key(path) == key:
        _DIGESTS[str(path)] = (key, now)
    return now
