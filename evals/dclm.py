"""DCLM-core: the 22 low-variance ICL tasks, scored and aggregated the way llm-foundry and DCLM do.

Data: a directory in DCLM's layout (``local_data/<category>/<task>.jsonl[.gz]`` in llm-foundry's
ICL formats, ``eval_meta_data.csv`` [+ ``eval_meta_data_v1.csv``], ``additional_aggregation.json``).

Prompts follow llm-foundry's ``InContextLearning*Dataset`` classes (see ``docs/evals.md``):
string fields are stripped; a few-shot example is ``context + continuation_delimiter + answer``,
examples are joined with ``example_delimiter`` ("\\n"); the query context is right-stripped; the
continuation (choice) gets a leading space when the tokenizer encodes " a" as one token; the
few-shot prefix, context and continuation are tokenized separately and concatenated; few-shot
examples are drawn with llm-foundry's sampler from ``random.Random(1234)`` consumed over the whole
file in order, so a row's prompt does not depend on ``limit``. The context is left-truncated so
context + continuation fit the model's maximum length.

Scoring (llm-foundry ``InContextLearning{MultipleChoice,LM}Accuracy``):
multiple choice and schema pick the option with the lowest *mean* per-token loss of the
continuation (ties: the first); language modeling is correct only if every continuation token
is the greedy argmax. Aggregation (DCLM ``aggregated_metrics.py``):
``centered = (acc - 0.01*RB) / (1 - 0.01*RB)`` per task and Core = plain mean of centered
accuracy over the 22 tasks, taken in the CSV's row order.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from pipeline.data.dclm_tasks import TASK_FILES, core_tasks, read_jsonl, task_file
from pipeline.errors import StrataInputError

EXAMPLE_DELIMITER = "\n"
FEWSHOT_SEED = 1234
TASK_TYPES = {"multiple choice": "mc", "schema": "schema", "language modeling": "lm"}


@dataclass(frozen=True)
class TaskMeta:
    """One row of ``eval_meta_data.csv``: what DCLM aggregates over."""

    name: str
    category: str
    task_type: str  # "mc" | "schema" | "lm" (others are not scored here)
    shots: int
    random_baseline: float  # percent


@dataclass(frozen=True)
class Request:
    """Token ids of one (context, continuation) pair to score."""

    context: list[int]
    continuation: list[int]
    n_bytes: int  # UTF-8 bytes of the continuation text as tokenized


@dataclass(frozen=True)
class Scored:
    """Model outputs for one request: summed NLL (nats), token count, all-greedy flag."""

    nll: float
    n_tokens: int
    greedy: bool

    @property
    def mean_nll(self) -> float:
        return self.nll / self.n_tokens


# --------------------------------------------------------------------------- metadata + aggregation

def read_meta(csv_path: Path) -> list[TaskMeta]:
    """Rows of an ``eval_meta_data*.csv`` in file order."""
    if not Path(csv_path).is_file():
        raise StrataInputError("DCLM metadata CSV not found", fix="point dclm_dir at DCLM's eval/ directory", path=csv_path)
    out = []
    with open(csv_path, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            out.append(TaskMeta(
                name=row["Eval Task"].strip(), category=row["Task Category"].strip(),
                task_type=TASK_TYPES.get(row["Task Type"].strip(), row["Task Type"].strip()),
                shots=int(row["#shots"]), random_baseline=float(row["Random baseline"]),
            ))
    return out


def centered_accuracy(acc: float, random_baseline: float) -> float:
    """(acc - RB/100) / (1 - RB/100), written as DCLM computes it (0.01 * RB)."""
    return (acc - 0.01 * random_baseline) / (1.0 - 0.01 * random_baseline)


def core_score(accuracies: dict[str, float], meta: Sequence[TaskMeta], tasks: Sequence[str]) -> float:
    """Core: plain mean of centered accuracy over ``tasks``, in the metadata CSV's row order.

    Matches DCLM's pandas ``mean`` bit for bit (same summation order: CSV rows).
    """
    wanted = set(tasks)
    missing = sorted(wanted - set(accuracies))
    if missing:
        raise StrataInputError(f"accuracies missing for Core tasks {missing}", fix="evaluate all Core tasks")
    by_name = {m.name: m for m in meta}
    absent = sorted(wanted - set(by_name))
    if absent:
        raise StrataInputError(f"tasks {absent} are not in the metadata CSV", fix="use DCLM's eval_meta_data.csv")
    values = [centered_accuracy(float(accuracies[m.name]), m.random_baseline) for m in meta if m.name in wanted]
    return float(np.mean(np.asarray(values, dtype=np.float64)))


# --------------------------------------------------------------------------- data + prompts

def strip_row(row: dict[str, Any]) -> dict[str, Any]:
    """llm-foundry ``strip_data``: strip every string field (lists are left alone)."""
    return {k: v.strip() if isinstance(v, str) else v for k, v in row.items()}


def fewshot_indices(n_rows: int, num_fewshot: int, seed: int = FEWSHOT_SEED) -> list[list[int]]:
    """Few-shot example indices of every row, drawn like llm-foundry's ``_get_fewshot_sample_idxs``.

    One ``random.Random(seed)`` is consumed row by row; the set's iteration order is the order
    in which examples appear in the prompt (as in llm-foundry).
    """
    if num_fewshot == 0:
        return [[] for _ in range(n_rows)]
    rng = random.Random(seed)
    out = []
    for example_idx in range(n_rows):
        k = min(n_rows - 1, num_fewshot)
        idxs = set(rng.sample(range(0, n_rows), k))
        if example_idx in idxs:
            idxs.remove(example_idx)
            if len(idxs) < n_rows - 1:
                replacement = rng.choice(range(0, n_rows))
                while replacement in idxs or replacement == example_idx:
                    replacement = rng.choice(range(0, n_rows))
                idxs.add(replacement)
        out.append(list(idxs))
    return out


class PromptBuilder:
    """Builds llm-foundry token requests for one task (see module docstring)."""

    def __init__(self, tokenizer: Any, task_type: str, delimiter: str, max_len: int):
        self.tok = tokenizer
        self.task_type = task_type
        self.delim = delimiter
        self.max_len = max_len
        self.prefix_space = len(tokenizer(" a", add_special_tokens=False)["input_ids"]) == 1

    def _encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def _preamble(self, text: str) -> list[int]:
        ids = list(self.tok(text)["input_ids"])  # special tokens always added to the preamble
        if self.tok.eos_token_id is not None and len(ids) > 1 and ids[-1] == self.tok.eos_token_id:
            ids = ids[:-1]
        return ids

    def _space(self, text: str) -> str:
        return f" {text}" if self.prefix_space and not text.startswith(" ") else text

    def _shot(self, row: dict[str, Any], preceding: str) -> str:
        sep = EXAMPLE_DELIMITER if preceding else ""
        if self.task_type == "schema":
            return f"{sep}{row['context_options'][row['gold']]}{self.delim}{row['continuation']}"
        if self.task_type == "mc":
            return f"{sep}{row['query']}{self.delim}{row['choices'][row['gold']]}"
        return f"{sep}{row['context']}{self.delim}{row['continuation']}"

    def requests(self, rows: Sequence[dict[str, Any]], idx: int, shots: Sequence[int]) -> tuple[list[Request], int]:
        """Requests for row ``idx`` (one per choice / context option; one for LM) and the gold index."""
        row = rows[idx]
        fewshot = ""
        for j in shots:
            fewshot += self._shot(rows[j], fewshot)
        pre = self._preamble(fewshot)
        sep = EXAMPLE_DELIMITER if fewshot else ""
        if self.task_type == "schema":
            cont_del = self.delim.rstrip() if fewshot else ""
            cont = self._space(row["continuation"])
            cont_ids = self._encode(cont)
            ctxs = [pre + self._encode(f"{sep}{c}{cont_del}") for c in row["context_options"]]
            reqs = [self._request(c, cont_ids, cont) for c in ctxs]
            return reqs, int(row["gold"])
        if self.task_type == "mc":
            ctx = pre + self._encode(f"{sep}{row['query']}{self.delim}".rstrip())
            reqs = []
            for choice in row["choices"]:
                text = self._space(choice)
                reqs.append(self._request(ctx, self._encode(text), text))
            return reqs, int(row["gold"])
        ctx = pre + self._encode(f"{sep}{row['context']}{self.delim}".rstrip())
        text = self._space(row["continuation"])
        return [self._request(ctx, self._encode(text), text)], 0

    def _request(self, context: list[int], continuation: list[int], text: str) -> Request:
        if not continuation:
            raise StrataInputError(f"empty continuation {text!r}", fix="drop the row from the task file")
        if not context:
            raise StrataInputError("empty context", fix="drop the row from the task file")
        if len(continuation) >= self.max_len:
            # as llm-foundry, context + continuation is cut from the left to the model's length;
            # one context token is kept so every scored token has a prediction
            continuation = continuation[-(self.max_len - 1):]
        room = self.max_len - len(continuation)
        return Request(context[-room:] if len(context) > room else context, continuation, len(text.encode("utf-8")))


# --------------------------------------------------------------------------- scoring

@torch.no_grad()
def score_requests(model: Any, requests: Sequence[Request], *, device: str, batch_size: int = 16,
                   pad_id: int = 0) -> list[Scored]:
    """Summed continuation NLL, token count and all-greedy flag per request (one forward each)."""
    order = sorted(range(len(requests)), key=lambda i: -(len(requests[i].context) + len(requests[i].continuation)))
    out: list[Scored | None] = [None] * len(requests)
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        seqs = [requests[i].context + requests[i].continuation for i in idx]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, :len(s)] = torch.tensor(s, dtype=torch.long)
            mask[r, :len(s)] = 1
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        for r, i in enumerate(idx):
            req = requests[i]
            start, n = len(req.context), len(req.continuation)
            lp = torch.log_softmax(logits[r, start - 1:start - 1 + n].float(), dim=-1)  # continuation rows only
            target = torch.tensor(req.continuation, dtype=torch.long, device=lp.device)
            nll = -lp.gather(1, target[:, None]).sum().item()
            greedy = bool((lp.argmax(dim=-1) == target).all().item())
            out[i] = Scored(nll=nll, n_tokens=n, greedy=greedy)
    return out  # type: ignore[return-value]


def pick_choice(scored: Sequence[Scored]) -> int:
    """Index of the lowest mean per-token loss (first on ties), as llm-foundry's ``index(min(...))``."""
    means = [s.mean_nll for s in scored]
    return means.index(min(means))


@dataclass(frozen=True)
class TaskResult:
    task: str
    accuracy: float
    gold_bpb: float  # bits per UTF-8 byte of the gold continuation, byte-weighted over examples
    n: int
    rows: tuple[int, ...]  # evaluated row indices of the task file
    correct: tuple[bool, ...]  # per evaluated row


def evaluate_task(model: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], *, task: str, task_type: str,
                  shots: int, delimiter: str, max_len: int, device: str, limit: int | None = None,
                  seed: int = 0, batch_size: int = 16) -> TaskResult:
    """Score one task on (a seeded sample of ``limit``) rows of its file."""
    rows = [strip_row(r) for r in rows]
    if not rows:
        raise StrataInputError(f"DCLM task {task!r} has no rows", fix="check the task file")
    fewshot = fewshot_indices(len(rows), shots)
    selected = list(range(len(rows)))
    if limit is not None and limit < len(rows):
        selected = sorted(random.Random(seed).sample(selected, limit))
    builder = PromptBuilder(tokenizer, task_type, delimiter, max_len)
    groups, golds, flat = [], [], []
    for i in selected:
        reqs, gold = builder.requests(rows, i, fewshot[i])
        groups.append((len(flat), len(flat) + len(reqs)))
        golds.append(gold)
        flat.extend(reqs)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    scored = score_requests(model, flat, device=device, batch_size=batch_size, pad_id=pad)
    correct, gold_nll, gold_bytes = [], 0.0, 0
    for (a, b), gold in zip(groups, golds):
        group = scored[a:b]
        correct.append(group[0].greedy if task_type == "lm" else pick_choice(group) == gold)
        gold_nll += group[gold].nll
        gold_bytes += flat[a + gold].n_bytes
    return TaskResult(task=task, accuracy=sum(correct) / len(selected), gold_bpb=gold_nll / (math.log(2) * gold_bytes),
                      n=len(selected), rows=tuple(selected), correct=tuple(correct))


def run_core(model: Any, tokenizer: Any, dclm_dir: Path, *, device: str, max_len: int, limit: int | None = None,
             seed: int = 0, batch_size: int = 16, tasks: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Evaluate the Core tasks; tidy rows (suite "dclm") incl. Core_v2 and, with the v1 CSV, Core_v1."""
    dclm_dir = Path(dclm_dir)
    meta = read_meta(dclm_dir / "eval_meta_data.csv")
    by_name = {m.name: m for m in meta}
    names = list(tasks) if tasks is not None else core_tasks(dclm_dir)
    rows_out: list[dict[str, Any]] = []
    acc: dict[str, float] = {}
    cache: dict[Path, list[dict[str, Any]]] = {}
    for name in names:
        if name not in by_name or name not in TASK_FILES:
            raise StrataInputError(f"unknown DCLM task {name!r}", fix=f"choose from {sorted(TASK_FILES)}")
        m = by_name[name]
        path = task_file(dclm_dir, name)
        if path not in cache:
            cache[path] = read_jsonl(path)
        res = evaluate_task(model, tokenizer, cache[path], task=name, task_type=m.task_type, shots=m.shots,
                            delimiter=TASK_FILES[name][1], max_len=max_len, device=device, limit=limit,
                            seed=seed, batch_size=batch_size)
        acc[name] = res.accuracy
        for metric, value in (("acc", res.accuracy), ("centered_acc", centered_accuracy(res.accuracy, m.random_baseline)),
                              ("gold_bpb", res.gold_bpb)):
            rows_out.append({"suite": "dclm", "task": name, "metric": metric, "value": float(value), "n": res.n})
    if set(core_tasks(dclm_dir)) <= set(acc):
        n = sum(r["n"] for r in rows_out if r["metric"] == "acc")
        core = core_tasks(dclm_dir)
        rows_out.append({"suite": "dclm", "task": "core", "metric": "core_v2", "value": core_score(acc, meta, core), "n": n})
        v1 = dclm_dir / "eval_meta_data_v1.csv"
        if v1.is_file():
            rows_out.append({"suite": "dclm", "task": "core", "metric": "core_v1",
                             "value": core_score(acc, read_meta(v1), core), "n": n})
    return rows_out
