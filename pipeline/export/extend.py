"""An export of a stream with a frozen prefix (``pipeline/packing/frozen.py``) extends the previous
export in its directory instead of rewriting it.

The previous export qualifies when its ``meta.json`` has the same format, strategy, dtype,
sequence length and batching, and records the same frozen prefix (P sequences, the same
``tokens_sha256``) within its written stream; for the flat token files the SHA-256 of their first
P x L tokens is checked against that digest too. Then the new export, built in the temporary
directory of ``atomic_dir`` like every export:

- copies the first P x L tokens of the flat token files (numpy ``tokens.bin`` and
  ``label_mask.bin``, megatron ``tokens.bin``) from the previous files with
  ``os.copy_file_range`` (on copy-on-write file systems, btrfs and XFS, the extents are shared:
  no data is copied) and writes only the suffix after them; the megatron ``.idx`` and index cache
  and the ``segments.parquet`` are rewritten (they are small);
- writes the other files (hf Parquet shards, mds shards, indexes) and replaces each that is
  byte-identical to the previous file of the same name by a hard link to it: the shards wholly
  inside the prefix keep their inode and modification time.

Guarantees: the result is byte-identical to a fresh export of the same stream; the previous
export is never written to (the copies and links only read it), so a crash before the swap leaves
it whole, and the swap is ``atomic_dir``'s; a trainer that holds the previous files open keeps
reading them unchanged, and the first P sequences are the same bytes in both versions.
"""

from __future__ import annotations

import filecmp
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

from pipeline.storage.atomic import is_sidecar

FLAT = {"numpy": "tokens.bin", "megatron": "tokens.bin"}  # formats whose token file starts with the prefix's rows


@dataclass(frozen=True)
class Previous:
    """The previous export in ``dir`` whose first ``sequences`` positions the new one keeps."""

    dir: Path
    sequences: int
    seq_len: int
    dtype: np.dtype

    def rows(self, name: str, chunk_rows: int = 4096) -> Iterator[tuple[int, np.ndarray]]:
        """``(first position, tokens (n, L))`` of the kept prefix, read from the previous file ``name``."""
        tokens = np.memmap(self.dir / name, dtype=self.dtype, mode="r", shape=(self.sequences, self.seq_len))
        for lo in range(0, self.sequences, chunk_rows):
            yield lo, np.asarray(tokens[lo : lo + chunk_rows])


def _prefix_sha256(path: Path, n_bytes: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while n_bytes > 0:
            block = fh.read(min(n_bytes, 1 << 22))
            if not block:
                break
            h.update(block)
            n_bytes -= len(block)
    return h.hexdigest() if n_bytes == 0 else ""


def previous_export(out: Path, fmt: str, info: dict, seq_len: int, dtype: np.dtype) -> Previous | None:
    """The export in ``out`` the new one (format ``fmt``, ``meta.json`` content ``info``) may
    extend, or None (no previous export, another prefix, another layout: rewrite it whole)."""
    frozen = info.get("frozen") or {}
    p = int(frozen.get("sequences") or 0)
    if p <= 0 or not (out / "meta.json").is_file():
        return None
    try:
        old = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    was = old.get("frozen") or {}
    dtype = np.dtype(dtype)
    same = (old.get("format") == fmt and old.get("strategy") == info.get("strategy") and old.get("dtype") == dtype.name
            and old.get("seq_len") == seq_len and old.get("global_batch") == info.get("global_batch")
            and old.get("world_size") == info.get("world_size"))
    if not same or was.get("sequences") != p or not was.get("tokens_sha256") or was.get("tokens_sha256") != frozen.get("tokens_sha256"):
        return None
    if int(old.get("n_sequences", 0)) < p:
        return None
    if fmt in FLAT and _prefix_sha256(out / FLAT[fmt], p * seq_len * dtype.itemsize) != was["tokens_sha256"]:
        return None
    return Previous(out, p, seq_len, dtype)


def copy_prefix(src: Path, dst: BinaryIO, n_bytes: int) -> None:
    """Append the first ``n_bytes`` of ``src`` to the open file ``dst`` (shared extents where the
    file system supports it)."""
    dst.flush()
    with open(src, "rb") as fh:
        off = 0
        while off < n_bytes:
            try:
                n = os.copy_file_range(fh.fileno(), dst.fileno(), n_bytes - off, off)
            except OSError:  # no copy_file_range across these file systems: copy through memory
                fh.seek(off)
                n = dst.write(fh.read(min(n_bytes - off, 1 << 22)))
                dst.flush()
            if n <= 0:
                raise OSError(f"{src} ends before its kept prefix ({off} of {n_bytes} bytes)")
            off += n
    dst.seek(0, os.SEEK_END)


def _listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.is_file() and not p.is_symlink() and not is_sidecar(p)) if d.is_dir() else []


def link_identical(previous: Path, tmp: Path) -> list[Path]:
    """Replace every file under ``tmp`` that is byte-identical to its previous version by a hard
    link to that file; the linked paths (relative). A file's previous version is the file of the
    same path under ``previous``, else the one of the same rank in its folder's sorted listing
    (hf shards are named ``train-XXXXX-of-YYYYY``: the count changes when shards are added)."""
    linked = []
    for sub in sorted({p.parent for p in tmp.rglob("*") if p.is_file()}):
        rel_dir = sub.relative_to(tmp)
        old_names = _listing(previous / rel_dir)
        for rank, name in enumerate(_listing(sub)):
            f = sub / name
            candidates = [name] if name in old_names else old_names[rank : rank + 1]
            for cand in candidates:
                old = previous / rel_dir / cand
                if old.stat().st_size == f.stat().st_size and filecmp.cmp(old, f, shallow=False):
                    link = f.with_name(f".{name}.link")
                    os.link(old, link)
                    os.replace(link, f)
                    linked.append(rel_dir / name)
    return linked
