"""``fasttext_trained``: a fastText classifier Strata trains, DCLM's recipe: the documents of
``quality.positives`` labelled ``__label__hq``, those of ``quality.negatives`` ``__label__cc``, one
line each, a bigram model (``wordNgrams`` 2) trained by ``fasttext.train_supervised`` on one
thread with the config's seed; a seeded ``quality.heldout_share`` of each class is held out and
the model's ROC AUC on it reported (Mann–Whitney: the chance a held-out positive outscores a
held-out negative, ties counting half). The model is trained once per inputs (every byte of both
files and the parameters) into ``quality/models/<key>.bin``; it then scores as ``fasttext``."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.quality.scorers import VERSION, Prepared, Scorer
from pipeline.quality.scorers.fasttext_model import DEFAULT_LABEL, load, one_line, probabilities
from pipeline.storage.atomic import atomic_path, file_sha256, write_json

NEGATIVE = "__label__cc"


def read_texts(path: str, what: str, why: str = "a classifier needs both classes") -> list[str]:
    """The texts of a labels file (``quality.<what>``): JSONL (``.jsonl``, ``.jsonl.gz``) or Parquet
    with a ``text`` field, else plain text, one document a line; exit 2 when it is missing or holds
    none (``why`` it needs one)."""
    p = Path(path).expanduser()
    if not path or not p.is_file():
        raise StrataInputError(f"the {what} file is missing", path=path or None,
                               fix=f"set quality.{what} to a file of {what} (JSONL or Parquet with a text field, or one document a line)")
    name = p.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".parquet")):
        frame = pl.read_parquet(p) if name.endswith(".parquet") else pl.read_ndjson(p)
        if "text" not in frame.columns:
            raise StrataInputError(f"the {what} file has no text field (its fields: {', '.join(frame.columns)})", path=p,
                                   fix="give each row a text field")
        texts = frame["text"].drop_nulls().to_list()
    else:
        texts = p.read_text(encoding="utf-8").splitlines()
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise StrataInputError(f"the {what} file holds no document: {why}", path=p,
                               fix=f"put {what} documents in it")
    return texts


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """ROC AUC of scores ``pos`` against ``neg`` (Mann–Whitney U / (n_pos n_neg), average ranks for ties)."""
    both = np.concatenate([pos, neg])
    order = np.argsort(both, kind="stable")
    ranks = np.empty(both.size)
    sorted_v = both[order]
    starts = np.flatnonzero(np.r_[True, sorted_v[1:] != sorted_v[:-1]])
    ends = np.r_[starts[1:], both.size]
    for a, b in zip(starts, ends):
        ranks[order[a:b]] = (a + b + 1) / 2  # 1-based average rank
    u = ranks[: pos.size].sum() - pos.size * (pos.size + 1) / 2
    return float(u / (pos.size * neg.size))


def split(n: int, share: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(training rows, held-out rows) of ``n``: a seeded ``share`` held out, at least one each way when n >= 2."""
    perm = rng.permutation(n)
    k = min(max(int(round(n * share)), 1 if n >= 2 else 0), n - 1)
    return np.sort(perm[k:]), np.sort(perm[:k])


class FastTextTrained(Scorer):
    name = "fasttext_trained"
    description = "a fastText classifier Strata trains on quality.positives against quality.negatives (DCLM's recipe)"

    def options(self, cfg) -> dict[str, Any]:
        return {"epochs": cfg.epochs, "dim": cfg.dim, "bucket": cfg.bucket, "lr": cfg.lr, "heldout_share": cfg.heldout_share,
                "seed": cfg.seed}

    def prepare(self, cfg, models: Path) -> Prepared:
        pos, neg = read_texts(cfg.positives, "positives"), read_texts(cfg.negatives, "negatives")
        opts = self.options(cfg)
        blob = json.dumps([VERSION, self.name, file_sha256(cfg.positives), file_sha256(cfg.negatives), opts], sort_keys=True)
        key = hashlib.sha256(blob.encode()).hexdigest()[:16]
        out, meta = models / f"{key}.bin", models / f"{key}.json"
        if not (out.is_file() and meta.is_file()):
            models.mkdir(parents=True, exist_ok=True)
            write_json(train(pos, neg, opts, out, models / f"{key}.train.txt"), meta)
        facts = json.loads(meta.read_text(encoding="utf-8"))
        return Prepared(self.name, str(out), {"label": DEFAULT_LABEL}, key, facts)

    def score(self, model: str, options: dict[str, Any], texts: list[str]) -> np.ndarray:
        return probabilities(load(model), texts, options["label"])


# The child's whole program: train, save, and on failure print fastText's message and exit 1.
_CHILD = """
import json, sys
import fasttext
a = json.loads(sys.argv[1])
try:
    fasttext.train_supervised(a["input"], epoch=a["epochs"], dim=a["dim"], lr=a["lr"], wordNgrams=2, bucket=a["bucket"],
                              minCount=1, thread=1, seed=a["seed"], verbose=0).save_model(a["output"])
except RuntimeError as exc:
    sys.stderr.write(str(exc))
    sys.exit(1)
"""


def train_in_fresh_process(work: Path, out: Path, opts: dict[str, Any]) -> None:
    """``fasttext.train_supervised`` on ``work``, saved to ``out``, in a new Python process: within a
    process that has already trained, the fastText wheel's training can stop with "Encountered NaN."
    on inputs that train cleanly in a fresh one (the failure follows what ran before, not the inputs),
    so each model is trained where the same inputs give the same bytes. A failure raises RuntimeError with
    fastText's message."""
    args = {"input": str(work), "output": str(out), **{k: opts[k] for k in ("epochs", "dim", "lr", "bucket", "seed")}}
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit status {done.returncode}")


def train(pos: list[str], neg: list[str], opts: dict[str, Any], out: Path, work: Path) -> dict[str, Any]:
    """Train on the training rows of both classes (written interleaved in a seeded order), save the
    model to ``out`` and return its held-out AUC and the counts."""
    rng = np.random.default_rng(opts["seed"])
    (pos_tr, pos_ho), (neg_tr, neg_ho) = split(len(pos), opts["heldout_share"], rng), split(len(neg), opts["heldout_share"], rng)
    lines = [f"{DEFAULT_LABEL} {one_line(pos[i])}" for i in pos_tr] + [f"{NEGATIVE} {one_line(neg[i])}" for i in neg_tr]
    work.write_text("\n".join(lines[i] for i in rng.permutation(len(lines))) + "\n", encoding="utf-8")
    try:
        with atomic_path(out) as tmp:
            train_in_fresh_process(work, tmp, opts)
    except RuntimeError as exc:
        raise StrataInputError(f"fastText training failed ({exc}) on {len(pos_tr)} positives and {len(neg_tr)} negatives",
                               path=work, fix="give more documents of each class, or lower quality.lr") from None
    finally:
        work.unlink(missing_ok=True)
    model = load(str(out))
    held = {"heldout_positives": int(pos_ho.size), "heldout_negatives": int(neg_ho.size)}
    if pos_ho.size and neg_ho.size:
        scores = probabilities(model, [pos[i] for i in pos_ho] + [neg[i] for i in neg_ho], DEFAULT_LABEL)
        held["heldout_auc"] = round(auc(scores[: pos_ho.size], scores[pos_ho.size:]), 6)
    return {"trained_positives": int(pos_tr.size), "trained_negatives": int(neg_tr.size), **held}


SPECS = (FastTextTrained(),)
