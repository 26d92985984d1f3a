"""Content-hash keyed caches: token ids and embeddings are computed only for new or changed documents.

A document's identity is the SHA-256 of its text (``corpus.parquet: content_hash``). A
:class:`HashCache` maps that hash to one row of values: a fixed-width vector (embeddings,
``dim=...``) or a variable-length vector (token ids, ``dim=None``). The cache key also holds a
*fingerprint* of whatever produced the values (tokenizer vocabulary and merges, embedding model
and its parameters): a changed fingerprint opens a different, empty cache, so stale values are
never returned. Appending, editing (new text = new hash) and deleting documents therefore
recompute only the changed documents; :meth:`HashCache.prune` drops entries of deleted ones.

On disk: ``<dir>/<name>-<fp16>/`` holding ``keys.npy`` (sorted 32-byte digests, ``S32``),
``values.npy`` (``(n, dim)``, or the flat concatenation for variable-length rows),
``offsets.npy`` (variable-length rows only) and ``meta.json`` (the full fingerprint). The
directory is replaced as a whole through :func:`pipeline.storage.atomic.atomic_dir`, so a crash leaves the
previous complete cache or the new one, never a mix. A missing or unreadable cache is an empty
cache (everything is recomputed), never an error.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from pipeline.storage.atomic import atomic_dir


def _keys(hashes: Sequence[str]) -> np.ndarray:
    """Hex SHA-256 strings -> ``S32`` digests (a ValueError names the first bad hash)."""
    out = np.empty(len(hashes), dtype="S32")
    for i, h in enumerate(hashes):
        raw = bytes.fromhex(h) if isinstance(h, str) and len(h) == 64 else b""
        if len(raw) != 32:
            raise ValueError(f"content hash #{i} {h!r} is not a hex SHA-256 digest")
        out[i] = raw
    return out


def fingerprint_digest(fingerprint: str) -> str:
    return hashlib.sha256(fingerprint.encode("utf-8")).hexdigest()[:16]


class HashCache:
    """Per-document rows keyed by content hash, valid for one producer ``fingerprint``.

    ``dim=None`` stores variable-length 1-D rows (e.g. token ids); an integer stores ``(dim,)`` rows;
    ``dim=0`` stores fixed-width rows whose width is taken from the stored cache or the first update.
    """

    def __init__(self, directory: str | Path, name: str, fingerprint: str, dtype: np.dtype | str, dim: int | None = None):
        if not name.isidentifier():
            raise ValueError(f"cache name {name!r} must be an identifier")
        self.directory, self.name, self.fingerprint = Path(directory), name, fingerprint
        self.dtype, self.dim = np.dtype(dtype), dim
        self.path = self.directory / f"{name}-{fingerprint_digest(fingerprint)}"
        self._keys, self._values, self._offsets = self._load()

    # -- storage -----------------------------------------------------------------------------
    def _empty(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        values = np.zeros((0, self.dim) if self.dim is not None else 0, dtype=self.dtype)
        return np.zeros(0, dtype="S32"), values, np.zeros(1, dtype=np.int64)

    def _load(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        try:
            meta = json.loads((self.path / "meta.json").read_text(encoding="utf-8"))
            if meta.get("fingerprint") != self.fingerprint or meta.get("dtype") != self.dtype.str:
                return self._empty()
            if self.dim == 0 and isinstance(meta.get("dim"), int):
                self.dim = meta["dim"]
            if meta.get("dim") != self.dim:
                return self._empty()
            keys = np.load(self.path / "keys.npy", allow_pickle=False)
            values = np.load(self.path / "values.npy", allow_pickle=False)
            offsets = np.load(self.path / "offsets.npy", allow_pickle=False) if self.dim is None else np.zeros(1, np.int64)
        except (OSError, ValueError, json.JSONDecodeError):
            return self._empty()
        rows = offsets.size - 1 if self.dim is None else values.shape[0]
        if keys.dtype != np.dtype("S32") or rows != keys.size or (self.dim is None and int(offsets[-1]) != values.size):
            return self._empty()
        return keys, values, offsets

    def _save(self, keys: np.ndarray, values: np.ndarray, offsets: np.ndarray) -> None:
        with atomic_dir(self.path) as tmp:
            np.save(tmp / "keys.npy", keys, allow_pickle=False)
            np.save(tmp / "values.npy", values, allow_pickle=False)
            if self.dim is None:
                np.save(tmp / "offsets.npy", offsets, allow_pickle=False)
            meta = {"fingerprint": self.fingerprint, "dtype": self.dtype.str, "dim": self.dim, "rows": int(keys.size)}
            (tmp / "meta.json").write_text(json.dumps(meta, sort_keys=True) + "\n", encoding="utf-8")
        # Caches of other fingerprints (an older model or tokenizer) can never be hit again.
        for stale in self.directory.glob(f"{self.name}-*"):
            if stale.is_dir() and stale != self.path and not stale.name.startswith("."):
                shutil.rmtree(stale, ignore_errors=True)
        self._keys, self._values, self._offsets = keys, values, offsets

    def __len__(self) -> int:
        return int(self._keys.size)

    def _rows(self, idx: np.ndarray) -> list[np.ndarray] | np.ndarray:
        if self.dim is not None:
            return self._values[idx]
        return [self._values[self._offsets[i] : self._offsets[i + 1]] for i in idx]

    # -- public API --------------------------------------------------------------------------
    def lookup(self, hashes: Sequence[str]) -> tuple[np.ndarray, np.ndarray | list[np.ndarray | None]]:
        """Return ``(found, values)`` in input order.

        Fixed rows: ``values`` is ``(n, dim)`` with zero rows where not found. Variable-length
        rows: a list holding an array per found hash and ``None`` elsewhere.
        """
        keys = _keys(hashes)
        pos = np.searchsorted(self._keys, keys)
        pos_c = np.minimum(pos, max(self._keys.size - 1, 0))
        found = (pos < self._keys.size) & (self._keys[pos_c] == keys) if self._keys.size else np.zeros(keys.size, bool)
        if self.dim is not None:
            values = np.zeros((keys.size, self.dim), dtype=self.dtype)
            values[found] = self._values[pos_c[found]]
            return found, values
        rows: list[np.ndarray | None] = [None] * keys.size
        for i in np.flatnonzero(found):
            p = pos_c[i]
            rows[i] = self._values[self._offsets[p] : self._offsets[p + 1]]
        return found, rows

    def update(self, hashes: Sequence[str], values: np.ndarray | Sequence[np.ndarray]) -> None:
        """Insert (or overwrite) rows for ``hashes`` and write the cache atomically."""
        keys = _keys(hashes)
        if self.dim is not None:
            if self.dim == 0 and not self._keys.size:
                self.dim = int(np.shape(values)[1])
                self._values = np.zeros((0, self.dim), dtype=self.dtype)
            new_vals = np.asarray(values, dtype=self.dtype).reshape(keys.size, self.dim)
        else:
            if len(values) != keys.size:
                raise ValueError(f"{len(values)} rows for {keys.size} hashes")
            new_rows = [np.asarray(v, dtype=self.dtype).ravel() for v in values]
        # Last occurrence wins among duplicates in the input; new rows win over cached ones.
        uniq_rev, first_rev = np.unique(keys[::-1], return_index=True)
        new_idx = keys.size - 1 - first_rev
        old_keep = ~np.isin(self._keys, uniq_rev)
        all_keys = np.concatenate([self._keys[old_keep], uniq_rev])
        order = np.argsort(all_keys, kind="stable")
        if self.dim is not None:
            merged = np.concatenate([self._values[old_keep], new_vals[new_idx]])[order]
            self._save(all_keys[order], merged, np.zeros(1, np.int64))
            return
        rows = self._rows(np.flatnonzero(old_keep)) + [new_rows[i] for i in new_idx]
        rows = [rows[i] for i in order]
        self._save(all_keys[order], *_flatten(rows, self.dtype))

    def prune(self, keep_hashes: Sequence[str]) -> int:
        """Drop every entry whose hash is not in ``keep_hashes`` (deleted documents); return how many."""
        keep = np.isin(self._keys, _keys(keep_hashes))
        dropped = int((~keep).sum())
        if dropped:
            idx = np.flatnonzero(keep)
            if self.dim is not None:
                self._save(self._keys[idx], self._values[idx], np.zeros(1, np.int64))
            else:
                self._save(self._keys[idx], *_flatten(self._rows(idx), self.dtype))
        return dropped


def _flatten(rows: list[np.ndarray], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([r.size for r in rows], out=offsets[1:])
    flat = np.concatenate(rows).astype(dtype, copy=False) if rows else np.zeros(0, dtype=dtype)
    return flat, offsets


# -- fingerprints --------------------------------------------------------------------------------
def tokenizer_fingerprint(tokenizer) -> str:
    """Identity of a fast tokenizer: its full serialized pipeline (vocab, merges, normalizers), EOS and id width."""
    from pipeline.data.tokens import token_dtype

    body = tokenizer.backend_tokenizer.to_str()
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    return f"tokenizer:{digest}:eos={tokenizer.eos_token_id}:n={len(tokenizer)}:dtype={token_dtype(len(tokenizer)).str}"


def embedding_fingerprint(model_path: str, max_tokens: int, **params: object) -> str:
    """Identity of an embedding model: a hash of its weight/config/tokenizer files plus parameters.

    Hashing the files (not just the path) means replacing a model in place also invalidates the cache.
    """
    from pipeline.storage.atomic import file_sha256

    root = Path(model_path)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else ([root] if root.is_file() else [])
    h = hashlib.sha256(model_path.encode("utf-8"))
    for p in files:
        h.update(str(p.relative_to(root) if root.is_dir() else p.name).encode())
        h.update(file_sha256(p).encode())
    extra = ",".join(f"{k}={params[k]}" for k in sorted(params))
    return f"embed:{h.hexdigest()}:max_tokens={max_tokens}:{extra}"


# -- cached stages -------------------------------------------------------------------------------
def cached_tokenize(
    tokenizer, texts: Sequence[str], hashes: Sequence[str], cache: HashCache,
    tokenize_fn: Callable[[list[str]], tuple[np.ndarray, np.ndarray]] | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Token store of ``texts`` as :func:`pipeline.data.tokens.tokenize_documents` returns it, tokenizing misses only
    (with ``tokenize_fn`` when given: the same ``(flat, offsets)`` contract, e.g. sharded on Ray).

    The cache holds each document's text token ids (no EOS); EOS is appended when assembling.
    Returns ``(flat_tokens, doc_offsets, n_computed)``.
    """
    from pipeline.data.tokens import token_dtype, tokenize_documents

    dtype = token_dtype(len(tokenizer))
    if cache.dtype != dtype or cache.dim is not None:
        raise ValueError(f"token cache must be variable-length {dtype}, got dim={cache.dim} {cache.dtype}")
    found, rows = cache.lookup(hashes)
    miss = np.flatnonzero(~found)
    if miss.size:
        missing = [texts[i] for i in miss]
        flat, off = tokenize_fn(missing) if tokenize_fn else tokenize_documents(tokenizer, missing, progress=False)
        fresh = [flat[off[j] : off[j + 1] - 1] for j in range(miss.size)]
        for j, i in enumerate(miss):
            rows[i] = fresh[j]
        cache.update([hashes[i] for i in miss], fresh)
    eos = np.array([tokenizer.eos_token_id], dtype=dtype)
    lengths = np.fromiter((r.size + 1 for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate([x for r in rows for x in (r, eos)]) if rows else np.zeros(0, dtype=dtype)
    return flat.astype(dtype, copy=False), offsets, int(miss.size)


def cached_embed(
    embed_fn: Callable[[list[str]], np.ndarray], texts: Sequence[str], hashes: Sequence[str], cache: HashCache
) -> tuple[np.ndarray, int]:
    """Embeddings of ``texts`` in input order, calling ``embed_fn`` once on the misses only.

    Returns ``(embeddings (n, dim), n_computed)``. Documents repeated within ``texts`` (same hash)
    are embedded once.
    """
    found, values = cache.lookup(hashes)
    miss = np.flatnonzero(~found)
    if miss.size:
        miss_hashes = [hashes[i] for i in miss]
        _, first = np.unique(np.asarray(miss_hashes), return_index=True)
        first = np.sort(first)
        fresh = np.asarray(embed_fn([texts[miss[j]] for j in first]), dtype=cache.dtype)
        if fresh.ndim != 2 or fresh.shape[0] != first.size or cache.dim not in (0, fresh.shape[1]):
            raise ValueError(f"embed_fn returned shape {fresh.shape}, expected {(first.size, cache.dim)}")
        cache.update([miss_hashes[j] for j in first], fresh)
        _, values = cache.lookup(hashes)
        return values, int(first.size)
    return values, 0
