"""Fingerprints of what produced an artifact (a tokenizer, an embedding model and its parameters).

Per-shard artifacts are named by the shard's documents and the producer's fingerprint
(:mod:`pipeline.data.shard_docs`): a new tokenizer or model gives new names, so stale
values are never reused, and an unchanged shard is never computed twice.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def fingerprint_digest(fingerprint: str) -> str:
    """A short file-name-safe digest of a fingerprint."""
    return hashlib.sha256(fingerprint.encode("utf-8")).hexdigest()[:16]


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
