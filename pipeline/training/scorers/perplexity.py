"""``perplexity``: CCNet's reference-model perplexity, with Strata's own tokenizer, model and training loop.

A byte-level BPE of ``quality.ref_vocab`` ids (:func:`pipeline.data.tokenizer.train_bpe`) and a
decoder of ``quality.ref_preset`` (:mod:`pipeline.training.model`) are trained on the documents of
``quality.target`` (what the corpus should resemble: JSONL/Parquet ``text`` field, or one document
a line) by :func:`pipeline.training.loop.train`: the documents (text + EOS) packed in order into
``quality.max_tokens``-token sequences, ``quality.ref_steps`` steps of the loop's default batch and
schedule, seed ``quality.seed``. The model is trained once per inputs (every byte of the target
file and these parameters) into ``quality/models/perplexity-<key>/`` (``save_pretrained``, its
tokenizer beside it); the score files' key is the fingerprint of every byte of that directory and
the scoring options.

**Sign.** A document's score is minus its mean next-token loss under the reference model, in nats
per token, over its first ``quality.max_tokens`` tokens (text + EOS, positions from 0, as the
training's held-out batch is scored: :func:`pipeline.training.heldout.score_heldout`):
``score = -ln(perplexity)``. Higher = closer to the target, as every scorer's score; the
perplexity is ``exp(-score)``. A document with no token (an empty text) has no perplexity: its
score is NaN, which the stage refuses naming it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data.tokenizer import load_tokenizer, train_bpe
from pipeline.devices import device
from pipeline.heavy import lazy
from pipeline.quality.scorers import VERSION, Prepared, Scorer, fingerprint
from pipeline.quality.scorers.fasttext_trained import read_texts
from pipeline.storage.atomic import atomic_dir, file_sha256, write_json
from pipeline.training.heldout import HeldoutBatch, score_heldout
from pipeline.training.heldout_store import heldout_store
from pipeline.training.loop import TrainSettings, train
from pipeline.training.model import mask_mode_of

transformers = lazy("transformers")

FACTS = "reference.json"


def train_reference(texts: list[str], opts: dict[str, Any], out: Path) -> dict[str, Any]:
    """Train the tokenizer and the model on ``texts``, save both into ``out``; return the facts shown."""
    tok = train_bpe(texts, opts["vocab"])
    fix = "put more documents in quality.target, or lower quality.max_tokens (the reference model's sequence length)"
    store = heldout_store(texts, tok, opts["seq_len"], what="the target file (quality.target)", fix=fix)
    settings = TrainSettings(preset=opts["preset"], max_steps=opts["steps"], warmup_steps=max(1, opts["steps"] // 10),
                             seed=opts["seed"], heldout_every=0)
    model, rows = train(store, np.arange(store.n_sequences), len(tok), tok.eos_token_id, tok.pad_token_id, settings, progress=False)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {"target_documents": len(texts), "target_tokens": int(store.tokens.size), "reference_sequences": store.n_sequences,
            "reference_vocab": len(tok), "reference_final_loss": round(float(rows[-1]["loss"]), 4)}


@functools.lru_cache(maxsize=1)
def load(path: str) -> tuple[Any, Any, str]:
    """(the reference model in eval mode on the device, its tokenizer, the device), once per process."""
    where = device()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, attn_implementation="sdpa")
    return model.to(where).eval(), load_tokenizer(path), where


def token_rows(ids: list[list[int]], eos: int, pad: int, seq_len: int) -> HeldoutBatch:
    """The documents' first ``seq_len`` tokens (ids + EOS) as a held-out batch, padded to the longest."""
    rows = [(x + [eos])[:seq_len] for x in ids]
    width = max(map(len, rows))
    tokens = np.full((len(rows), width), pad, dtype=np.int64)
    filled = np.zeros((len(rows), width), dtype=bool)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
        filled[i, : len(r)] = True
    return HeldoutBatch(tokens, filled, [""] * len(rows))


class Perplexity(Scorer):
    name = "perplexity"
    description = "minus the log perplexity under a small model of Strata's trained on quality.target (CCNet's idea)"

    def options(self, cfg) -> dict[str, Any]:
        return {"seq_len": cfg.max_tokens, "batch_size": cfg.batch_size}

    def prepare(self, cfg, models: Path) -> Prepared:
        texts = read_texts(cfg.target, "target", "the reference model needs text to learn")
        opts = {"preset": cfg.ref_preset, "steps": cfg.ref_steps, "vocab": cfg.ref_vocab, "seq_len": cfg.max_tokens, "seed": cfg.seed}
        blob = json.dumps([VERSION, self.name, file_sha256(cfg.target), opts], sort_keys=True)
        out = models / f"perplexity-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"
        if not (out / FACTS).is_file():
            with atomic_dir(out) as tmp:
                write_json(train_reference(texts, opts, tmp), tmp / FACTS)
        options = self.options(cfg)
        return Prepared(self.name, str(out), options, fingerprint(self.name, out, options), json.loads((out / FACTS).read_text()))

    def check(self, model: str, options: dict[str, Any]) -> None:
        load(model)

    def score(self, model: str, options: dict[str, Any], texts: list[str]) -> np.ndarray:
        m, tok, where = load(model)
        eos, seq_len, batch = tok.eos_token_id, options["seq_len"], options["batch_size"]
        pad = eos if tok.pad_token_id is None else tok.pad_token_id
        ids = tok(list(texts), add_special_tokens=False, truncation=True, max_length=seq_len)["input_ids"] if texts else []
        order = np.argsort([len(x) for x in ids], kind="stable")  # batches of like lengths: little padding
        loss = np.full(len(texts), np.nan)
        for a in range(0, len(order), batch):
            rows = order[a:a + batch]
            hb = token_rows([ids[i] for i in rows], eos, pad, seq_len)
            loss[rows] = score_heldout(m, hb, where, batch_size=batch, mask_mode=mask_mode_of(m))
        loss[[len(x) == 0 for x in ids]] = np.nan  # no token: no next-token loss
        return -loss


SPECS = (Perplexity(),)
