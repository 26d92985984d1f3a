"""A fixed held-out batch, scored every N steps of every run (comparable loss-vs-tokens curves).

The training loss of step t is measured on the data of step t, which differs by strategy, so two
strategies' training losses never compare like with like. Instead every run scores the *same*
held-out documents (the first ``n_docs`` of the held-out split, each its first ``seq_len``
tokens incl. EOS, positions 0..L-1 as in training) with the same mask and loss as training.
Per-document mean token losses are the units of the paired bootstrap
(``pipeline.reports.stats``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.errors import StrataInputError
from pipeline.heavy import lazy
from pipeline.training.model import attention_inputs, next_token_labels, token_losses

torch = lazy("torch")  # imported on first use (pipeline/heavy.py)


@dataclass(frozen=True)
class HeldoutBatch:
    """``tokens (n, L)`` padded with ``pad_id``, ``filled (n, L)`` true at real tokens, ``units`` doc ids."""

    tokens: np.ndarray
    filled: np.ndarray
    units: list[str]

    @property
    def n_docs(self) -> int:
        return int(self.tokens.shape[0])


def heldout_batch(texts: list[str], units: list[str], tokenizer, seq_len: int, n_docs: int) -> HeldoutBatch:
    """Tokenize the first ``n_docs`` documents with >= 2 tokens (text + EOS, cut at ``seq_len``)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    pad = eos if pad is None else pad
    rows, names = [], []
    for text, unit in zip(texts, units):
        if len(rows) == n_docs:
            break
        ids = (tokenizer(text, add_special_tokens=False)["input_ids"] + [eos])[:seq_len]
        if len(ids) >= 2:
            rows.append(ids)
            names.append(str(unit))
    if not rows:
        raise StrataInputError("no held-out document has 2 tokens or more", fix="raise heldout_fraction (held-out batch of the report)")
    tokens = np.full((len(rows), seq_len), pad, dtype=np.int64)
    filled = np.zeros((len(rows), seq_len), dtype=bool)
    for i, ids in enumerate(rows):
        tokens[i, : len(ids)] = ids
        filled[i, : len(ids)] = True
    return HeldoutBatch(tokens, filled, names)


def heldout_tensors(hb: HeldoutBatch, rows: slice, device, mask_mode: str = "dense") -> dict:
    """Model inputs of some rows: one document per row, padding as its own segment (never scored)."""
    toks, filled = hb.tokens[rows], hb.filled[rows]
    seg = np.where(filled, 1, 2)
    labels = next_token_labels(toks, seg)
    labels[~filled] = -100
    pos = np.tile(np.arange(toks.shape[1]), (toks.shape[0], 1))
    seg_t = torch.as_tensor(seg, device=device)
    return {
        "input_ids": torch.as_tensor(toks, device=device),
        "attention_mask": attention_inputs(seg_t, mode=mask_mode),
        "position_ids": torch.as_tensor(pos, device=device),
        "labels": torch.as_tensor(labels, device=device),
        "filled": torch.as_tensor(filled, device=device),
    }


def score_heldout(model, hb: HeldoutBatch, device, batch_size: int = 32, mask_mode: str = "dense") -> np.ndarray:
    """(n_docs,) float64 mean next-token loss (nats/token) of every held-out document."""
    was_training = model.training
    model.eval()
    out = []
    with torch.no_grad():
        for a in range(0, hb.n_docs, batch_size):
            batch = heldout_tensors(hb, slice(a, a + batch_size), device, mask_mode)
            loss, scored = token_losses(model, batch)
            out.append(((loss.float() * scored).sum(1) / scored.sum(1).clamp(min=1)).cpu().numpy())
    model.train(was_training)
    return np.concatenate(out).astype(np.float64)


def score_steps(max_steps: int, every: int) -> list[int]:
    """Steps completed at which the held-out batch is scored: 0, every, 2 every, ..., max_steps."""
    if every <= 0:
        return [max_steps]
    return sorted(set(range(0, max_steps + 1, every)) | {max_steps})
