"""Tokens and embeddings as per-shard work: fixed shards of ``shard_docs`` texts, either engine.

The tokens and embeddings stages hand the documents they must compute (the cache misses) to
:func:`map_text_shards`. It cuts them into consecutive shards of ``cfg.shard_docs`` texts — the
same shards on both engines, so every embedding batch holds the same documents and the vectors
are byte-identical — runs the pure shard function on each (:mod:`pipeline.distributed.engine`),
and writes each shard's result atomically under ``work/<stage>/`` as soon as it arrives. A shard
file is named by a hash of its producer fingerprint and its texts, so a rerun after a crash
reuses exactly the shards already computed; the stage removes them once its own artifacts exist.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from tqdm import tqdm

from pipeline.distributed.engine import Shard, map_shards
from pipeline.storage.atomic import atomic_path


@lru_cache(maxsize=2)
def _backend(tokenizer_json: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json)


def tokenize_shard(tokenizer_json: str, eos_id: int, dtype: str, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(flat ids, offsets)`` of ``texts``, EOS after each document — the ids
    :func:`pipeline.data.tokens.tokenize_documents` gives, from the tokenizer's serialized form."""
    dt = np.dtype(dtype)
    eos = np.array([eos_id], dtype=dt)
    rows = [np.asarray(e.ids, dtype=dt) for e in _backend(tokenizer_json).encode_batch(texts, add_special_tokens=False)]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([r.size + 1 for r in rows], out=offsets[1:])
    flat = np.concatenate([x for r in rows for x in (r, eos)]) if rows else np.zeros(0, dtype=dt)
    return flat, offsets


def embed_shard(method: str, model: str, max_tokens: int, batch_size: int, progress: bool, texts: list[str]) -> np.ndarray:
    """Unit-norm embeddings of one shard (:func:`pipeline.represent.embeddings.embed`, no checkpoints:
    a shard is the unit of resumption, so its batches never depend on an interruption)."""
    from pipeline.represent.embeddings import embed

    return embed(texts, method, model, max_tokens, batch_size, work_dir=None, progress=progress)


def _key(fingerprint: str, texts: Sequence[str]) -> str:
    h = hashlib.sha256(fingerprint.encode("utf-8"))
    for t in texts:
        h.update(hashlib.sha256(t.encode("utf-8")).digest())
    return h.hexdigest()[:20]


def _save(shard: Shard, result: Any) -> None:
    arrays = result if isinstance(result, tuple) else (result,)
    with atomic_path(shard.outputs[0]) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, *arrays)


def _load(path: Path) -> Any:
    with np.load(path, allow_pickle=False) as z:
        arrays = tuple(z[f"arr_{i}"] for i in range(len(z.files)))
    return arrays if len(arrays) > 1 else arrays[0]


def map_text_shards(
    fn: Callable[..., Any],
    args: tuple,
    texts: Sequence[str],
    *,
    stage: str,
    fingerprint: str,
    work_dir: Path,
    cfg,
    actors: bool = False,
    stats: dict[str, int] | None = None,
) -> list[Any]:
    """``fn(*args, shard_texts)`` for every shard of ``texts``; the shards' results in order.

    ``stats`` (when given) counts ``shards`` and ``shards_resumed`` (found complete from an earlier run)."""
    n = cfg.shard_docs
    shards = [
        Shard(f"{stage}[{i // n}]", (*args, list(texts[i : i + n])), (work_dir / f"{stage}-{_key(fingerprint, texts[i : i + n])}.npz",))
        for i in range(0, len(texts), n)
    ]
    bar = tqdm(total=len(texts), desc=f"{stage}[{cfg.engine}]", unit="doc", disable=len(shards) < 2)
    resumed = [s for s in shards if s.done()]
    if stats is not None:
        stats["shards"] = stats.get("shards", 0) + len(shards)
        stats["shards_resumed"] = stats.get("shards_resumed", 0) + len(resumed)
    bar.update(sum(len(s.args[-1]) for s in resumed))
    map_shards(fn, shards, _save, engine=cfg.engine, ray_cfg=cfg.ray, actors=actors, progress=lambda s: bar.update(len(s.args[-1])))
    bar.close()
    return [_load(s.outputs[0]) for s in shards]


def clear_shards(work_dir: Path, stage: str) -> None:
    """Remove a stage's shard files once its artifacts are written."""
    for p in work_dir.glob(f"{stage}-*.npz"):
        p.unlink(missing_ok=True)
