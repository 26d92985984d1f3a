"""What ``greedy_blend`` does with a blend the caps cannot give, with caps per document piece, and
with stages edited after a frozen prefix (issue 59), on five demo-corpus domains as sources.

One corpus: documents of ``web``, ``code``, ``religious_text``, ``technical_docs`` and
``quotes_humor`` (their ``domain`` as ``source``; code 6 documents, about 2.4% of the tokens),
packed in a random order into 256-token sequences, so sequences mix sources. Three measurements:

1. **Infeasible**: code asked for 10% with ``max_repetition`` {code: 2}, the budget the packing's
   tokens. The schedule's tokens against the largest the caps allow (a linear program over the
   sequences' copies, solved by scipy's HiGHS), and what the rate solver's budget ladder (budgets
   lowered in steps of sqrt(2), ``pipeline.ordering.schedule.sequence_rates``, greedy_mixture's) gives
   on the same caps.
2. **Caps per piece**: religious_text allowed 2 uses and asked for 70% (web 30%): pieces used beyond their own
   source's cap in the order (0 expected), and the pieces the former rule (a sequence capped by the
   source holding most of its tokens) would have allowed beyond their own cap.
3. **Stages**: three stages; the stream ordered as is, and with its first third frozen and the
   later stages edited: each stage's L1 from its weights (after the prefix), the last two batches'
   L1 from the last stage's, the share of a source of weight 0 in the batch before a boundary.

Writes ``benchmarks/results/mixture_blend.json``; docs/mixture.md quotes it.
"""

from __future__ import annotations

import datetime
import gzip
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULT = ROOT / "benchmarks" / "results" / "mixture_blend.json"
L, B = 256, 16
FIVE = ["code", "quotes_humor", "religious_text", "technical_docs", "web"]
TAKE = {"web": 200, "code": 6, "religious_text": 60, "technical_docs": 27, "quotes_humor": 870}
STAGES = [{"until_tokens": 0.5, "weights": {"web": 0.3, "code": 0.1, "religious_text": 0.2, "technical_docs": 0.2, "quotes_humor": 0.2}},
          {"until_tokens": 0.8, "weights": {"web": 0.2, "code": 0.0, "religious_text": 0.4, "technical_docs": 0.2, "quotes_humor": 0.2}},
          {"weights": {"web": 0.1, "code": 0.3, "religious_text": 0.1, "technical_docs": 0.5, "quotes_humor": 0.0}}]
EDITED = [STAGES[0],
          {"until_tokens": 0.7, "weights": {"web": 0.5, "code": 0.0, "religious_text": 0.1, "technical_docs": 0.2, "quotes_humor": 0.2}},
          {"weights": {"web": 0.0, "code": 0.2, "religious_text": 0.6, "technical_docs": 0.1, "quotes_humor": 0.1}}]


def corpus():
    """(documents, segments, (sequences x sources) tokens) of the five sources, packed in a random order."""
    from pipeline.packing.pack import pack_concat

    path = Path(os.environ.get("STRATA_SHARED", "/work/shared")) / "data" / "corpus" / "demo_corpus.jsonl.gz"
    got: dict[str, list[str]] = {d: [] for d in FIVE}
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec.get("domain") in got and len(got[rec["domain"]]) < TAKE[rec["domain"]]:
                got[rec["domain"]].append(rec["text"])
            if all(len(got[d]) == TAKE[d] for d in FIVE):
                break
    src = [d for d in FIVE for _ in got[d]]
    ntok = np.array([max(1, len(t.split())) for d in FIVE for t in got[d]]) + 1
    docs = pl.DataFrame({"doc_id": np.arange(len(src)), "cluster": np.arange(len(src)) % 4, "n_tokens": ntok, "source": src})
    seg = pack_concat(np.random.default_rng(0).permutation(len(src)), ntok, L).segments
    g = np.zeros((int(seg["sequence_id"].max()) + 1, len(FIVE)))
    codes = np.searchsorted(FIVE, np.array(src)[seg["doc_id"].to_numpy()])
    np.add.at(g, (seg["sequence_id"].to_numpy(), codes), seg["n_tokens"].to_numpy())
    return docs, seg, g


def params(**mixture):
    from pipeline.config import StrataConfig
    from pipeline.ordering.engine import OrderParams

    return OrderParams.from_config(StrataConfig(length_bins=8, mixture=mixture))


def features(docs, seg):
    from pipeline.ordering.blend import group_tokens
    from pipeline.ordering.features import packed_sequence_features

    sid, did = seg["sequence_id"].to_numpy(), seg["doc_id"].to_numpy()
    f = packed_sequence_features(sid, did, seg["n_tokens"].to_numpy(), docs["cluster"].to_numpy(), docs["n_tokens"].to_numpy(), 8, {})
    codes = np.searchsorted(FIVE, docs["source"].to_numpy())
    return f, group_tokens(np.searchsorted(f.sequence_ids, sid), codes[did], seg["n_tokens"].to_numpy().astype(float), f.n_sequences, 5)


def infeasible(docs, seg) -> dict:
    """Item 1: the schedule against the linear program's optimum and the sqrt(2) ladder's."""
    from scipy import sparse as sp
    from scipy.optimize import linprog

    from pipeline.ordering.blend import planned_counts, row_caps
    from pipeline.ordering.engine import run_strategy
    from pipeline.ordering.schedule import sequence_rates

    weights = {"web": 0.35, "code": 0.1, "religious_text": 0.25, "technical_docs": 0.15, "quotes_humor": 0.15}
    p = params(weights=weights, max_repetition={"code": 2.0})
    f, groups = features(docs, seg)
    t0 = time.perf_counter()
    counts, w, fit = planned_counts(f, groups, p.blend, FIVE, float(f.lengths.sum()), p.max_sequence_copies, 0)
    plan_s = time.perf_counter() - t0
    max_rep = p.blend.caps(FIVE, "max_repetition", 1.0)
    cap = np.minimum(row_caps(f, groups, max_rep, np.ones(5), p.max_sequence_copies, 0), p.max_sequence_copies)
    c = sp.csr_matrix((groups.data, groups.indices, groups.indptr), shape=(groups.n_rows, 5))
    res = linprog(np.r_[np.zeros(f.n_sequences), -1.0], A_eq=sp.hstack([c.T, -w[0][:, None]]).tocsr(), b_eq=np.zeros(5),
                  A_ub=sp.hstack([c.T, sp.csr_matrix((5, 1))]).tocsr(), b_ub=max_rep * groups.column_totals(),
                  bounds=[(0, float(r)) for r in cap] + [(0, None)], method="highs")
    bound = float(min(f.lengths.sum(), (max_rep * groups.column_totals() / w[0]).min()))
    ladder = float(sequence_rates(replace(f, clusters=groups), w[0], bound, cap) @ f.lengths)
    order = run_strategy("greedy_blend", docs, seg, L, p, seed=0).order["sequence_id"].to_numpy()
    return {"weights": weights, "max_repetition": {"code": 2.0}, "asked_tokens": fit.asked, "allowed_tokens": fit.allowed,
            "binding_group": fit.binding, "scheduled_tokens": float(counts @ f.lengths),
            "ordered_tokens": float(f.lengths[np.searchsorted(f.sequence_ids, order)].sum()), "lp_optimum_tokens": -float(res.fun),
            "sqrt2_ladder_tokens": ladder, "corpus_tokens": fit.corpus, "seq_len": L, "plan_seconds": plan_s,
            "warning": fit.warning(p.blend)}


def per_piece(docs) -> dict:
    """Item 2: pieces beyond their own source's cap, now and under the former rule, on a packing
    with half of religious_text's documents packed on their own (pure sequences), the rest mixed."""
    from pipeline.ordering.engine import run_strategy
    from pipeline.packing.pack import pack_concat

    rel = docs.filter(pl.col("source") == "religious_text")["doc_id"].to_numpy()
    rest = np.setdiff1d(docs["doc_id"].to_numpy(), rel[: rel.size // 2])
    seg = pack_concat(np.r_[rel[: rel.size // 2], np.random.default_rng(0).permutation(rest)], docs["n_tokens"].to_numpy(), L).segments
    g = np.zeros((int(seg["sequence_id"].max()) + 1, len(FIVE)))
    np.add.at(g, (seg["sequence_id"].to_numpy(), np.searchsorted(FIVE, docs["source"].to_numpy()[seg["doc_id"].to_numpy()])),
              seg["n_tokens"].to_numpy())
    p = params(weights={"religious_text": 0.7, "web": 0.3}, max_repetition={"religious_text": 2.0})
    order = run_strategy("greedy_blend", docs, seg, L, p, seed=0).order["sequence_id"].to_numpy()
    copies = np.bincount(order, minlength=g.shape[0])
    src = docs["source"].to_numpy()[seg["doc_id"].to_numpy()]
    sid = seg["sequence_id"].to_numpy()
    own = np.where(src == "religious_text", 2, 1)
    dominant_cap = np.where(np.argmax(g, axis=1) == FIVE.index("religious_text"), 2, 1)[sid]
    exposed = dominant_cap > own
    return {"pieces": int(sid.size), "pieces_beyond_own_cap": int((copies[sid] > own).sum()),
            "pieces_repeated": int((copies[sid] > 1).sum()), "repeated_pieces_sources": sorted(set(src[copies[sid] > 1])),
            "former_rule_pieces_allowed_beyond_own_cap": int(exposed.sum()),
            "former_rule_tokens_allowed_beyond_own_cap": int(seg["n_tokens"].to_numpy()[exposed].sum())}


def stage_stats(order: np.ndarray, g: np.ndarray, stages: list[dict], n_prefix: int = 0) -> dict:
    """Per stage L1 (after the prefix), the last two batches' L1 and largest source share, and the
    largest share of a weight-0 source in the batch before each boundary."""
    ends = np.array([s.get("until_tokens", 1.0) for s in stages])
    want = np.array([[s["weights"][n] for n in FIVE] for s in stages])
    tok = g[order]
    start = np.r_[0, np.cumsum(tok.sum(axis=1))[:-1]]
    stage = np.minimum(np.searchsorted(ends * tok.sum(), start, side="right"), len(ends) - 1)
    after = np.arange(order.size) >= n_prefix
    l1 = [float(np.abs(tok[(stage == k) & after].sum(0) / tok[(stage == k) & after].sum() - want[k]).sum())
          for k in range(len(ends)) if tok[(stage == k) & after].sum()]
    last = [tok[-B:].sum(0), tok[-2 * B : -B].sum(0)]
    bleed = []
    for k in range(len(ends) - 1):
        before = tok[np.flatnonzero(stage == k)[-B:]].sum(0)
        zero = want[k] == 0
        bleed.append(float((before / before.sum())[zero].max()) if zero.any() else 0.0)
    return {"stage_l1": l1, "last_batches_l1": [float(np.abs(t / t.sum() - want[-1]).sum()) for t in last],
            "last_batches_max_share": [float((t / t.sum()).max()) for t in last], "zero_weight_share_before_boundary": bleed}


def stages(docs, seg, g, seeds=(0, 1, 2, 3)) -> dict:
    """Item 3: three stages as is, and edited after a frozen third."""
    from pipeline.ordering.engine import run_strategy

    out = {}
    for seed in seeds:
        t0 = time.perf_counter()
        first = run_strategy("greedy_blend", docs, seg, L, params(stages=STAGES, max_repetition={"code": 2.0}), seed=seed)
        first = first.order["sequence_id"].to_numpy()
        t1 = time.perf_counter()
        n_prefix = first.size // 3
        after = run_strategy("greedy_blend", docs, seg, L, params(stages=EDITED, max_repetition={"code": 2.0}), seed=seed,
                             prefix=first[:n_prefix]).order["sequence_id"].to_numpy()
        out[str(seed)] = {"as_is": {**stage_stats(first, g, STAGES), "positions": int(first.size), "seconds": t1 - t0},
                          "edited_after_prefix": {**stage_stats(after, g, EDITED, n_prefix), "positions": int(after.size),
                                                  "frozen_positions": n_prefix, "seconds": time.perf_counter() - t1}}
    return out


def main() -> int:
    from bench_order import _commit, _machine

    machine, (rev, dirty) = _machine(), _commit()
    docs, seg, g = corpus()
    shares = g.sum(0) / g.sum()
    doc = {"benchmark": "benchmarks/bench_blend_fidelity.py", "commit": rev, "dirty_files": dirty,
           "date": datetime.date.today().isoformat(), "machine": machine, "documents": int(docs.height), "sequences": int(g.shape[0]),
           "seq_len": L, "batch": B, "corpus_shares": dict(zip(FIVE, shares.round(4).tolist())), "stages": STAGES, "edited": EDITED,
           "infeasible": infeasible(docs, seg), "per_piece": per_piece(docs), "stage_runs": stages(docs, seg, g),
           "loadavg_at_end": os.getloadavg()[0]}
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("infeasible", "per_piece")}, indent=1))
    runs = doc["stage_runs"].values()
    for case in ("as_is", "edited_after_prefix"):
        print(case, "worst stage L1", max(max(r[case]["stage_l1"]) for r in runs),
              "worst last-batch L1", max(max(r[case]["last_batches_l1"]) for r in runs),
              "worst weight-0 share before a boundary", max(max(r[case]["zero_weight_share_before_boundary"]) for r in runs))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main())
