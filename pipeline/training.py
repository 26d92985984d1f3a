"""Short training runs on an ordered stream (nanoGPT-style loop over a transformers model).

Every strategy gets the same model init (seeded), token budget, optimizer (AdamW, linear warmup
then cosine decay to 10% of the peak), batch size and sequence length; only the order of the
sequences differs. Step t trains on ``order[t*B:(t+1)*B]`` (wrapping into a next epoch if the
budget exceeds the stream). Loss is next-token cross-entropy within documents only.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from tqdm import tqdm

from pipeline.model import attention_inputs, build_model, document_layout, next_token_labels
from pipeline.packing import SequenceStore


@dataclass(frozen=True)
class TrainSettings:
    preset: str = "tiny"
    seq_len: int = 256
    batch_size: int = 16
    max_steps: int = 60
    lr: float = 3e-3
    warmup_steps: int = 6
    weight_decay: float = 0.1
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    cross_document: bool = False


def lr_at(step: int, s: TrainSettings) -> float:
    """Linear warmup for ``warmup_steps``, then cosine decay to ``min_lr_ratio * lr``."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    progress = (step - s.warmup_steps) / max(1, s.max_steps - s.warmup_steps)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train(
    store: SequenceStore,
    order: np.ndarray,
    vocab_size: int,
    eos_id: int,
    pad_id: int,
    settings: TrainSettings,
    on_step: Callable[[dict], None] | None = None,
    progress: bool = True,
):
    """Train a fresh model on ``order``; return ``(model, per-step log rows)``."""
    import torch
    import torch.nn.functional as F

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_model(settings.preset, vocab_size, settings.seq_len, settings.seed, eos_id, pad_id).to(dev)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lr, betas=(0.9, 0.95), fused=dev == "cuda",
    )
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev == "cuda" else torch.autocast("cpu", enabled=False)
    order = np.asarray(order, dtype=np.int64)
    B, L, M = settings.batch_size, settings.seq_len, order.size
    rows: list[dict] = []
    tokens_seen = 0
    model.train()
    for step in tqdm(range(settings.max_steps), desc="train", unit="step", disable=not progress):
        t0 = time.perf_counter()
        pos_in_stream = (np.arange(step * B, (step + 1) * B)) % M
        ids = order[pos_in_stream]
        toks, seg_rows, seg_starts = store.batch(ids)
        seg, pos = document_layout(seg_starts, seg_rows, B, L)
        labels = next_token_labels(toks, seg)
        x = torch.as_tensor(toks, device=dev)
        y = torch.as_tensor(labels, device=dev)
        mask = attention_inputs(torch.as_tensor(seg, device=dev), settings.cross_document)
        lr = lr_at(step, settings)
        for group in opt.param_groups:
            group["lr"] = lr
        with amp:
            logits = model(input_ids=x, attention_mask=mask, position_ids=torch.as_tensor(pos, device=dev)).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        opt.step()
        tokens_seen += B * L
        row = {
            "step": step,
            "loss": float(loss.item()),
            "grad_norm": float(grad_norm.item()),
            "lr": lr,
            "tokens_seen": tokens_seen,
            "epoch": int((step * B) // M),
            "tokens_per_s": B * L / (time.perf_counter() - t0),
        }
        rows.append(row)
        if on_step is not None:
            on_step(row)
    model.eval()
    return model, rows
