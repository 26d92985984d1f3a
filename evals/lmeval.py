"""Running Strata's lm-eval tasks (``evals/tasks/*.yaml``) offline on an in-memory model."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

TASK_DIR = Path(__file__).resolve().parent / "tasks"


def set_offline(work_dir: Path) -> None:
    """No network: HF hub/datasets/transformers offline; HF caches under ``work_dir``."""
    from pipeline.offline import set_offline as _set_offline

    _set_offline(Path(work_dir) / "hf_home", force=True)


def max_length(model: Any, default: int = 2048) -> int:
    """The model's context length (``max_position_embeddings`` / ``n_positions``)."""
    cfg = model.config
    for attr in ("max_position_embeddings", "n_positions", "n_ctx"):
        if getattr(cfg, attr, None):
            return int(getattr(cfg, attr))
    return default


def prefix_token_id(tokenizer: Any) -> int:
    """Token that precedes a document's first token in rolling log-likelihood (BOS, else EOS)."""
    tid = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if tid is None:
        from pipeline.errors import StrataInputError

        raise StrataInputError("tokenizer has neither a BOS nor an EOS token", fix="give the tokenizer an eos_token")
    return int(tid)


def make_lm(model: Any, tokenizer: Any, *, device: str, batch_size: int = 8, max_len: int | None = None) -> Any:
    """An lm-eval ``HFLM`` wrapping the in-memory model and tokenizer."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=model, tokenizer=tokenizer, device=device, batch_size=batch_size,
                max_length=max_len or max_length(model), prefix_token_id=prefix_token_id(tokenizer))


def run_task(lm: Any, task: str, *, metadata: dict[str, Any], limit: int | None = None,
             log_samples: bool = False) -> dict[str, Any]:
    """Evaluate one task from ``evals/tasks`` (built-in tasks are not indexed), zero-shot, seeded 0.

    Calls ``lm_eval.evaluator.evaluate`` with the setup ``simple_evaluate`` would do for an
    in-memory model (seeds, zero-shot, fewshot seed) but without its run record: that record
    runs ``git describe`` in the working directory (printing "fatal: not a git repository"
    outside a checkout) and collects the environment (pip, conda, GPU tools) again for every task."""
    import random

    import numpy as np
    import torch
    from lm_eval.evaluator import evaluate
    from lm_eval.tasks import TaskManager

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    loaded = TaskManager(include_path=str(TASK_DIR), include_defaults=False, metadata=metadata).load([task])
    for task_obj in loaded["tasks"].values():
        if task_obj.get_config("num_fewshot") != 0:
            task_obj.set_config(key="num_fewshot", value=0)
        task_obj.set_fewshot_seed(seed=0)
    return evaluate(lm=lm, task_dict=loaded, limit=limit, bootstrap_iters=0, log_samples=log_samples, fewshot_as_multiturn=True)


def metric_value(results: dict[str, Any], task: str, metric: str) -> float:
    """A metric from ``results["results"][task]`` (lm-eval keys it as ``"<metric>,none"``)."""
    value = results["results"][task][f"{metric},none"]
    return float(value)


def per_doc_loglikelihoods(results: dict[str, Any], task: str) -> list[tuple[dict[str, Any], float]]:
    """(doc, summed log-likelihood) of every logged sample of a rolling task."""
    out = []
    for sample in sorted(results["samples"][task], key=lambda s: s["doc_id"]):
        ll, _ = sample["bits_per_byte"]
        if not math.isfinite(ll):
            raise ValueError(f"non-finite log-likelihood for doc {sample['doc_id']}")
        out.append((sample["doc"], float(ll)))
    return out
