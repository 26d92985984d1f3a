"""The model of the ablation runs: a small Llama-style decoder built from a transformers config.

Packed sequences get a block-diagonal causal mask (no attention across document boundaries) and
positions that restart at every document, built from the segments table. The mask is either a
dense 4D boolean tensor for SDPA (``dense``, the CPU path) or a FlexAttention ``BlockMask``
(``flex``, the GPU path): the fused kernel skips the fully masked blocks instead of reading an
(L x L) mask per sequence, and gives the same attention (tests compare the losses).
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import StrataInputError
from pipeline.heavy import lazy

torch = lazy("torch")  # imported on first use (pipeline/heavy.py)
flex_attention = lazy("torch.nn.attention.flex_attention")
F = lazy("torch.nn.functional")
torch_checkpoint = lazy("torch.utils.checkpoint")
transformers = lazy("transformers")

PRESETS: dict[str, dict[str, int]] = {
    # Llama-style SwiGLU decoders; intermediate = 8/3 * hidden rounded up to a multiple of 64 (the
    # Llama convention: the 3-matrix MLP then holds ~8 h^2 weights, like a 4h GELU MLP).
    # Parameters with tied embeddings, non-embedding / total @ vocab 8192 / total @ vocab 50257:
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=384),  # 0.43M / 1.5M / 6.9M
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=704),  # 3.2M / 5.3M / 16M
    "base": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, intermediate_size=1408),  # 26M / 30M / 51M
    "100m": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=2048),  # 85M / 91M / 124M
}


MASK_MODES = ("dense", "flex")


def attention_implementation(mask_mode: str) -> str:
    """The transformers attention backend of a mask mode (``dense`` -> sdpa, ``flex`` -> flex_attention)."""
    if mask_mode not in MASK_MODES:
        raise StrataInputError(f"unknown attention mask mode {mask_mode!r}", fix=f"use one of {MASK_MODES} (or 'auto')")
    return "flex_attention" if mask_mode == "flex" else "sdpa"


def mask_mode_of(model) -> str:
    """The mask mode a built model expects (``flex`` when it runs FlexAttention, else ``dense``)."""
    return "flex" if getattr(model.config, "_attn_implementation", "sdpa") == "flex_attention" else "dense"


def model_config(preset: str, vocab_size: int, seq_len: int, eos_id: int, pad_id: int, mask_mode: str = "dense"):
    """The ``LlamaConfig`` of a preset (tied input/output embeddings, full multi-head attention).

    ``max_position_embeddings`` is ``seq_len``: positions never pass L-1 in training (they
    restart per document, or run 0..L-1 with cross-document attention), and evaluation reads the
    context length from here (``evals.lmeval.max_length``), so rolling windows and few-shot
    contexts never score RoPE at positions the model never trained on.
    """
    if preset not in PRESETS:
        raise StrataInputError(f"unknown model preset {preset!r}", fix=f"use one of {sorted(PRESETS)}")
    spec = PRESETS[preset]
    return transformers.LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=seq_len,
        num_key_value_heads=spec["num_attention_heads"],
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        attn_implementation=attention_implementation(mask_mode),
        **spec,
    )


def build_model(preset: str, vocab_size: int, seq_len: int, seed: int, eos_id: int, pad_id: int, mask_mode: str = "dense"):
    """A freshly initialized ``LlamaForCausalLM`` (same seed => same weights, whatever the mask mode)."""
    cfg = model_config(preset, vocab_size, seq_len, eos_id, pad_id, mask_mode)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg)


def preset_parameters(preset: str, vocab_size: int) -> dict[str, int]:
    """Exact parameter counts of a preset, ``{"total", "non_embedding"}``, without allocating it
    (the model is built on torch's ``meta`` device)."""
    cfg = model_config(preset, vocab_size, 2048, 0, 0)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    total = sum(p.numel() for p in model.parameters())
    return {"total": total, "non_embedding": total - vocab_size * cfg.hidden_size}


def document_layout(seq_starts: np.ndarray, seq_rows: np.ndarray, n_rows: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-position segment index and position id for a batch of packed sequences.

    ``seq_rows[i]``/``seq_starts[i]`` give row and start offset of segment i. Returns
    ``seg (n_rows, seq_len)`` (a segment counter, unique within a row) and ``pos`` (restarting
    at 0 at every segment start).
    """
    starts = np.zeros((n_rows, seq_len), dtype=np.int64)
    starts[seq_rows, seq_starts] = 1
    starts[:, 0] = 1
    seg = np.cumsum(starts, axis=1)
    idx = np.broadcast_to(np.arange(seq_len), (n_rows, seq_len))
    last_start = np.maximum.accumulate(np.where(starts == 1, idx, 0), axis=1)
    return seg, idx - last_start


def attention_inputs(seg, cross_document: bool = False, mode: str = "dense", filled=None):
    """Causal attention, block-diagonal by document unless ``cross_document``; padding keys
    (``filled`` false) masked when attention crosses documents.

    ``dense``: a 4D boolean tensor (B, 1, L, L) for SDPA. ``flex``: a FlexAttention
    ``BlockMask`` with the same mask_mod (for a model built with ``mask_mode="flex"``).
    """
    s = torch.as_tensor(seg)
    B, L = s.shape
    if mode == "flex":
        f = None if filled is None else torch.as_tensor(filled, device=s.device)

        def mask_mod(b, h, q, kv):
            keep = q >= kv
            if not cross_document:
                keep = keep & (s[b, q] == s[b, kv])
            elif f is not None:
                keep = keep & f[b, kv]
            return keep

        return flex_attention.create_block_mask(mask_mod, B, None, L, L, device=s.device)
    causal = torch.tril(torch.ones(L, L, dtype=torch.bool, device=s.device))
    if cross_document:
        mask = causal.expand(B, 1, L, L)
        return mask if filled is None else mask & torch.as_tensor(filled, device=s.device)[:, None, None, :]
    return ((s[:, :, None] == s[:, None, :]) & causal)[:, None]


def next_token_labels(tokens: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Labels for next-token loss: -100 where the next token belongs to another document."""
    labels = np.full_like(tokens, -100)
    same = seg[:, 1:] == seg[:, :-1]
    labels[:, :-1] = np.where(same, tokens[:, 1:], -100)
    return labels


def batch_tensors(store, sequence_ids: np.ndarray, cross_document: bool, device, mask_mode: str = "dense") -> dict:
    """Model inputs of a batch of packed sequences from a ``SequenceStore``.

    Returns ``input_ids``, ``attention_mask`` (see :func:`attention_inputs`; ``mask_mode`` dense
    or flex), ``position_ids``, ``labels`` (:func:`next_token_labels`) and ``filled`` (False at
    padding). Positions restart at every document when attention is block-diagonal; with
    ``cross_document`` attention spans the whole sequence, so positions run 0..L-1 over it (plain
    concatenated training). Padding (padding / best_fit packings) is never scored and never
    attended to by a real token.
    """
    toks, seg_rows, seg_starts, filled = store.masked_batch(sequence_ids)
    n, L = toks.shape
    seg, pos = document_layout(seg_starts, seg_rows, n, L)
    if cross_document:
        pos = np.tile(np.arange(L), (n, 1))
    labels = next_token_labels(toks, seg)
    labels[:, :-1][~filled[:, 1:]] = -100
    labels[~filled] = -100
    filled_t = torch.as_tensor(filled, device=device)
    mask = attention_inputs(torch.as_tensor(seg, device=device), cross_document, mask_mode, filled_t if cross_document else None)
    return {
        "input_ids": torch.as_tensor(toks, device=device),
        "attention_mask": mask,
        "position_ids": torch.as_tensor(pos, device=device),
        "labels": torch.as_tensor(labels, device=device),
        "filled": filled_t,
    }


def token_losses(model, batch: dict, max_logit_bytes: int = 4 << 30):
    """Per-token next-token cross-entropy (n, L) float32 and the (n, L) mask of scored tokens.

    When the batch's float32 logits (tokens x vocab x 4 bytes: 13 GB at 32 x 2048 tokens and a
    50k vocabulary) would exceed ``max_logit_bytes``, the output head and the loss run on chunks
    of tokens under activation checkpointing, so one chunk's logits exist at a time (backward
    recomputes them, a little slower, and the batch fits). Values
    and gradients equal the unchunked loss.
    """
    hidden = model.model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).last_hidden_state
    head = model.get_output_embeddings()
    y = batch["labels"]
    h, flat_y = hidden.reshape(-1, hidden.shape[-1]), y.reshape(-1)

    def chunk_loss(h_part, y_part):
        return F.cross_entropy(head(h_part).float(), y_part, ignore_index=-100, reduction="none")

    chunk = max(1, max_logit_bytes // (4 * head.out_features))
    if h.shape[0] <= chunk:
        return chunk_loss(h, flat_y).view(y.shape), y != -100
    parts = []
    for i in range(0, h.shape[0], chunk):
        args = (h[i : i + chunk], flat_y[i : i + chunk])
        parts.append(torch_checkpoint.checkpoint(chunk_loss, *args, use_reentrant=False) if torch.is_grad_enabled() else chunk_loss(*args))
    return torch.cat(parts).view(y.shape), y != -100
