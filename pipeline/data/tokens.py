"""The tokens stage: every document's token ids in one flat store, each followed by EOS.

Layout: the flat ids (raw ``uint16`` when the vocabulary fits, else ``uint32``) and
``doc_offsets.npy`` (int64, N+1): document d's stream is ``tokens[off[d]:off[d+1]]`` and its
last id is EOS. ``n_tokens[d] = off[d+1] - off[d] - 1`` counts the text tokens.

The ``token_shards`` partitions write each corpus shard's ids (``tokens/shards/<validated>-<tokenizer>.bin``,
:mod:`pipeline.data.token_shards`) and the ``tokens`` asset indexes them in corpus order
(``tokens/runs.parquet``, :mod:`pipeline.data.token_index`); :func:`open_tokens` reads either form;
:func:`tokenize_documents` is the in-memory form for small document sets.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from tqdm import tqdm

from pipeline.data.token_index import open_token_runs


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


def tokenize_documents(tokenizer, texts: list[str], batch: int = 1024, progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(flat_tokens, doc_offsets)`` for ``texts`` (EOS appended to every document)."""
    backend = tokenizer.backend_tokenizer
    eos = tokenizer.eos_token_id
    dtype = token_dtype(len(tokenizer))
    pieces: list[np.ndarray] = []
    lengths = np.empty(len(texts), dtype=np.int64)
    for start in tqdm(range(0, len(texts), batch), desc="tokenize", unit="batch", disable=not progress):
        encs = backend.encode_batch(texts[start : start + batch], add_special_tokens=False)
        for i, enc in enumerate(encs):
            ids = enc.ids
            lengths[start + i] = len(ids) + 1
            pieces.append(np.asarray(ids + [eos], dtype=dtype))
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(pieces) if pieces else np.zeros(0, dtype=dtype)
    return flat, offsets


def tokenizer_fingerprint(tokenizer) -> str:
    """Identity of a fast tokenizer: its full serialized pipeline (vocab, merges, normalizers), EOS and id width."""
    body = tokenizer.backend_tokenizer.to_str()
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    return f"tokenizer:{digest}:eos={tokenizer.eos_token_id}:n={len(tokenizer)}:dtype={token_dtype(len(tokenizer)).str}"


def token_dtype_of(tokens_path: Path, offsets: np.ndarray) -> np.dtype:
    """The dtype of a raw token file holding ``offsets[-1]`` ids: file size / token count."""
    total = int(offsets[-1])
    size = Path(tokens_path).stat().st_size
    if total == 0 or size % total or size // total not in (2, 4):
        raise ValueError(f"{tokens_path}: size {size} does not match {total} tokens; rematerialize the tokens asset")
    return np.dtype(np.uint16 if size // total == 2 else np.uint32)


def open_tokens(tokens_path, offsets_path) -> tuple[np.ndarray, np.ndarray]:
    """The token store and its offsets: a raw ``.bin`` memory-mapped (its dtype follows from file
    size / token count), or the ``tokens`` asset's index over the shards' files (``.parquet``, read
    through :class:`pipeline.data.token_index.ShardedTokens`, which indexes the same way)."""
    offsets = np.load(offsets_path, allow_pickle=False)
    if Path(tokens_path).suffix == ".parquet":
        store = open_token_runs(tokens_path)
        if store.size != int(offsets[-1]):
            raise ValueError(f"{tokens_path}: {store.size} tokens, not the {int(offsets[-1])} of {offsets_path}; rematerialize the tokens "
                             "asset")
        return store, offsets
    return np.memmap(tokens_path, dtype=token_dtype_of(tokens_path, offsets), mode="r"), offsets
