"""``hf_classifier``: a local Hugging Face sequence-classification directory (FineWeb-Edu's format:
``config.json``, the weights and the tokenizer, a regression head with one output). A document's
score is the head's output for its first ``quality.max_tokens`` tokens (at most the model's
positions): the regression value
(one output, FineWeb-Edu's 0–5 ``int_score`` before rounding), or the softmax probability of the
positive label (``quality.label``, a name of ``id2label`` or an index; default the last label).
Batches of ``quality.batch_size`` documents, on the GPU when there is one. Loaded with
``local_files_only``: never fetched from a hub."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.devices import device
from pipeline.errors import StrataInputError
from pipeline.heavy import lazy
from pipeline.quality.scorers import Scorer

torch = lazy("torch")
transformers = lazy("transformers")


@functools.lru_cache(maxsize=1)
def load(path: str) -> tuple[Any, Any, str]:
    """(model in eval mode on the device, tokenizer, device) of the directory ``path``, or exit 2
    naming it: no config, not a sequence-classification model, a head whose weights the directory
    lacks (they would be random), or no tokenizer."""
    fix = "set quality.path to a directory saved by AutoModelForSequenceClassification.save_pretrained (with its tokenizer)"
    if not (Path(path) / "config.json").is_file():
        raise StrataInputError("no config.json: not a Hugging Face model directory", path=path, fix=fix)
    try:
        model, info = transformers.AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True,
                                                                                      output_loading_info=True)
    except (ValueError, OSError, KeyError) as exc:
        raise StrataInputError(f"cannot load a sequence-classification model ({exc})", path=path, fix=fix) from None
    if info.get("missing_keys"):
        raise StrataInputError(f"the directory lacks weights of the model ({', '.join(sorted(info['missing_keys'])[:4])}): "
                               "no trained classification head", path=path, fix=fix)
    try:
        tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (ValueError, OSError) as exc:
        raise StrataInputError(f"no tokenizer ({exc})", path=path, fix=fix) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tok.pad_token_id
    where = device()
    return model.to(where).eval(), tok, where


def label_index(config, label: str, path: str) -> int:
    """The output the score reads: 0 for one output (regression), else the positive label's."""
    n = int(config.num_labels)
    if n == 1:
        return 0
    if not label:
        return n - 1
    names = {str(v): int(k) for k, v in config.id2label.items()}
    if label in names:
        return names[label]
    if label.isdigit() and int(label) < n:
        return int(label)
    raise StrataInputError(f"the classifier has no label {label!r} (its labels: {', '.join(names)})", path=path,
                           fix="set quality.label to a label name of its id2label or an index")


class HfClassifier(Scorer):
    name = "hf_classifier"
    description = ("a local Hugging Face sequence-classification directory (FineWeb-Edu's): its regression output or the "
                   "positive label's probability")
    expects = "a directory saved by AutoModelForSequenceClassification.save_pretrained, with its tokenizer (e.g. FineWeb-Edu's classifier)"

    def options(self, cfg) -> dict[str, Any]:
        return {"label": cfg.label, "max_tokens": cfg.max_tokens, "batch_size": cfg.batch_size}

    def check(self, model: str, options: dict[str, Any]) -> None:
        label_index(load(model)[0].config, options["label"], model)

    def score(self, model: str, options: dict[str, Any], texts: list[str]) -> np.ndarray:
        m, tok, where = load(model)
        col, out = label_index(m.config, options["label"], model), []
        limit = min(options["max_tokens"], getattr(m.config, "max_position_embeddings", None) or options["max_tokens"])
        for a in range(0, len(texts), options["batch_size"]):
            batch = tok(texts[a:a + options["batch_size"]], truncation=True, max_length=limit, padding=True,
                        return_tensors="pt").to(where)
            with torch.inference_mode():
                logits = m(**batch).logits.float()
            values = logits[:, 0] if logits.shape[1] == 1 else torch.softmax(logits, dim=-1)[:, col]
            out.append(values.cpu().numpy().astype(np.float64))
        return np.concatenate(out) if out else np.zeros(0, np.float64)


SPECS = (HfClassifier(),)
