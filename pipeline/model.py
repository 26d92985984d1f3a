"""The model of the ablation runs: a small Llama-style decoder built from a transformers config.

Packed sequences get a block-diagonal causal mask (no attention across document boundaries) and
positions that restart at every document, built from the segments table.
"""

from __future__ import annotations

import numpy as np

PRESETS: dict[str, dict[str, int]] = {
    # name: hidden, layers, heads, intermediate
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512),
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
    "base": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, intermediate_size=2048),
    "100m": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}


def build_model(preset: str, vocab_size: int, seq_len: int, seed: int, eos_id: int, pad_id: int):
    """A freshly initialized ``LlamaForCausalLM`` (same seed => same weights)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if preset not in PRESETS:
        from pipeline.errors import StrataInputError

        raise StrataInputError(f"unknown model preset {preset!r}", fix=f"use one of {sorted(PRESETS)}")
    spec = PRESETS[preset]
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=max(seq_len, 2048),
        num_key_value_heads=spec["num_attention_heads"],
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        attn_implementation="sdpa",
        **spec,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


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


def attention_inputs(seg: np.ndarray, cross_document: bool = False):
    """The 4D boolean mask (B, 1, L, L): causal, and block-diagonal by document unless allowed."""
    import torch

    s = torch.as_tensor(seg)
    L = s.shape[1]
    causal = torch.tril(torch.ones(L, L, dtype=torch.bool, device=s.device))
    if cross_document:
        return causal.expand(s.shape[0], 1, L, L)
    return ((s[:, :, None] == s[:, None, :]) & causal)[:, None]


def next_token_labels(tokens: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Labels for next-token loss: -100 where the next token belongs to another document."""
    labels = np.full_like(tokens, -100)
    same = seg[:, 1:] == seg[:, :-1]
    labels[:, :-1] = np.where(same, tokens[:, 1:], -100)
    return labels
