"""Fingerprints of what produced an artifact (an embedding model and its parameters; a tokenizer's
is ``pipeline.data.tokens.tokenizer_fingerprint``, beside the token ids' width it names).

Per-shard artifacts are named by the shard's documents and the producer's fingerprint
(:mod:`pipeline.data.shard_docs`): a new tokenizer or model gives new names, so stale
values are never reused, and an unchanged shard is never computed twice.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pipeline.storage.atomic import file_sha256, is_sidecar


def fingerprint_digest(fingerprint: str) -> str:
    """A short file-name-safe digest of a fingerprint."""
    return hashlib.sha256(fingerprint.encode("utf-8")).hexdigest()[:16]


def embedding_fingerprint(model_path: str, max_tokens: int, **params: object) -> str:
    """Identity of an embedding model: a hash of its weight/config/tokenizer files plus parameters.

    Hashing the files (not just the path) means replacing a model in place also invalidates the cache.
    """
    root = Path(model_path)
    files = sorted(p for p in root.rglob("*") if p.is_file() and not is_sidecar(p)) if root.is_dir() else ([root] if root.is_file() else [])
    h = hashlib.sha256(model_path.encode("utf-8"))
    for p in files:
        h.update(str(p.relative_to(root) if root.is_dir() else p.name).encode())
        h.update(file_sha256(p).encode())
    extra = ",".join(f"{k}={params[k]}" for k in sorted(params))
    return f"embed:{h.hexdigest()}:max_tokens={max_tokens}:{extra}"
