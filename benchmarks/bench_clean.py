"""The clean stage's detectors on planted cases, and near-duplicate throughput against datasketch alone.

A corpus of ``--docs`` distinct base documents (each ~150+ words: demo-corpus documents, at most
40 words of each, seeded picks), then planted copies appended after them: exact (case and spacing
changed), near by edits (3% of the words replaced), by reordering (the two halves swapped), by
boilerplate (a footer of 15 words appended), and base documents with a WikiText-2 test paragraph
planted inside (contamination). Precision and recall per kind against the planted truth; the
near-duplicate pass (pipeline.clean.near: polars words, hashed shingles, datasketch MinHash + LSH,
signature check) timed against datasketch alone doing the same MinHash + LSH work its usual way
(Python word shingles, MinHash.bulk with its default SHA-1 hashing, LSH insert and query); peak RSS.

    nice -n 15 python benchmarks/bench_clean.py --docs 20000      # writes benchmarks/results/clean_planted.json
    nice -n 15 python benchmarks/bench_clean.py --docs 1000000
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import resource
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_ablate import commit, machine  # noqa: E402

from pipeline.clean.decontam import EvalNgrams  # noqa: E402
from pipeline.clean.exact import text_hashes  # noqa: E402
from pipeline.clean.near import NearIndex  # noqa: E402
from pipeline.clean.plan import duplicate_groups  # noqa: E402

DATA = REPO.parent / "shared" / "data"
BOILER = "Subscribe to our newsletter for updates. Cookie policy. Terms of use. All rights reserved worldwide today."
KINDS = ("exact", "near_edit", "near_reorder", "near_boilerplate")


def base_documents(n: int, seed: int) -> list[str]:
    """``n`` distinct documents of 150+ words: seeded picks of demo-corpus documents, at most 40 words each."""
    with gzip.open(DATA / "corpus" / "demo_corpus.jsonl.gz", "rt", encoding="utf-8") as fh:
        pieces = [" ".join(json.loads(line)["text"].split()[:40]) for line in fh]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words, parts = 0, []
        while words < 150:
            p = pieces[rng.randrange(len(pieces))]
            parts.append(p)
            words += p.count(" ") + 1
        out.append(" ".join(parts))
    return out


def plant(base: list[str], paragraphs: list[str], share: float, seed: int) -> tuple[list[str], dict[str, list[tuple[int, int]]], set[int]]:
    """The corpus (base documents first, then the planted copies, shuffled), the (original, copy)
    pairs of each kind, and the documents holding an evaluation paragraph."""
    rng = random.Random(seed)
    n = len(base)
    per = max(1, int(share * n))
    originals = rng.sample(range(n), per * len(KINDS))
    copies: list[tuple[str, int, str]] = []
    for k, kind in enumerate(KINDS):
        for o in originals[k * per:(k + 1) * per]:
            words = base[o].split()
            if kind == "exact":
                text = "  " + "\n".join(base[o].upper().split(" ")) + " "
            elif kind == "near_edit":
                for i in rng.sample(range(len(words)), max(1, len(words) * 3 // 100)):
                    words[i] = "zq" + words[i][::-1]
                text = " ".join(words)
            elif kind == "near_reorder":
                half = len(words) // 2
                text = " ".join(words[half:] + words[:half])
            else:
                text = base[o] + " " + BOILER
            copies.append((kind, o, text))
    rng.shuffle(copies)
    texts = list(base)
    truth: dict[str, list[tuple[int, int]]] = {k: [] for k in KINDS}
    for kind, o, text in copies:
        truth[kind].append((o, len(texts)))
        texts.append(text)
    contaminated = set(rng.sample([i for i in range(n) if i not in set(originals)], per))
    for i in contaminated:
        words = texts[i].split()
        cut = len(words) // 2
        texts[i] = " ".join(words[:cut] + [paragraphs[rng.randrange(len(paragraphs))]] + words[cut:])
    return texts, truth, contaminated


def datasketch_alone(texts: list[str], threshold: float, num_perm: int, ngram: int, batch: int) -> float:
    """Seconds for datasketch's usual recipe over ``texts``: word shingles, MinHash.bulk, LSH query then insert."""
    from datasketch import MinHash, MinHashLSH

    t0 = time.perf_counter()
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    for a in range(0, len(texts), batch):
        sets = []
        for t in texts[a:a + batch]:
            w = t.lower().split()
            sets.append([" ".join(w[i:i + ngram]).encode() for i in range(max(1, len(w) - ngram + 1))])
        for j, mh in enumerate(MinHash.bulk(sets, num_perm=num_perm, seed=1)):
            lsh.query(mh)
            lsh.insert(a + j, mh, check_duplication=False)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=20_000, help="base documents (planted copies come on top)")
    ap.add_argument("--share", type=float, default=0.02, help="planted copies of each kind, a share of the base documents")
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--num-perm", type=int, default=64)
    ap.add_argument("--ngram", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "clean_planted.json"))
    args = ap.parse_args()
    from evals.wikitext import read_articles

    start = {"machine": machine(), "commit": commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    wiki = DATA / "eval" / "wikitext" / "wiki.test.raw"
    paragraphs = [p.strip() for a in read_articles(wiki) for p in a.split("\n") if len(p.split()) >= 40]
    texts, truth, contaminated = plant(base_documents(args.docs, 0), paragraphs, args.share, 1)
    n = len(texts)

    t0 = time.perf_counter()
    evals = EvalNgrams.build({"wikitext": lambda: read_articles(wiki)}, 13)
    build_s = time.perf_counter() - t0
    near = NearIndex(args.threshold, args.num_perm, args.ngram, seed=1)
    seen: dict[int, int] = {}
    reps, pairs, flags = [], [], []
    exact_s = near_s = decontam_s = 0.0
    for a in range(0, n, args.batch):
        ids = np.arange(a, min(a + args.batch, n))
        batch = texts[a:a + args.batch]
        t = time.perf_counter()
        rep = np.array([seen.setdefault(h, int(i)) for i, h in zip(ids, text_hashes(batch).tolist())], np.int64)
        exact_s += time.perf_counter() - t
        t = time.perf_counter()
        first = np.flatnonzero(rep == ids)
        pairs.append(near.add(ids[first].tolist(), [batch[i] for i in first]))
        near_s += time.perf_counter() - t
        t = time.perf_counter()
        flags.append(evals.overlaps(batch)[:, 0] > 0)
        decontam_s += time.perf_counter() - t
        reps.append(rep)
    group, kind, lost = duplicate_groups(n, np.concatenate(reps), np.concatenate(pairs), np.zeros((0, 2), np.int64))
    flagged = np.concatenate(flags)
    planted_copy = {c: o for k in KINDS for o, c in truth[k]}

    def precision(level: int) -> dict:
        docs = np.flatnonzero(lost == level)
        right = sum(1 for d in docs.tolist() if d in planted_copy and group[planted_copy[d]] == group[d])
        return {"flagged": int(docs.size), "correct": right, "precision": right / docs.size if docs.size else None}

    rows = {}
    for k in KINDS:
        found = sum(1 for o, c in truth[k] if group[c] >= 0 and group[c] == group[o])
        rows[k] = {"planted": len(truth[k]), "found": found, "recall": found / len(truth[k])}
    hits = set(np.flatnonzero(flagged).tolist())
    rows["contamination"] = {"planted": len(contaminated), "found": len(hits & contaminated), "recall": len(hits & contaminated) /
                             len(contaminated), "flagged": len(hits), "precision": len(hits & contaminated) / len(hits) if hits else None}
    detect = {"exact": precision(0), "near": precision(1)}
    peak_ours = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    alone_texts = [texts[i] for i in np.flatnonzero(np.concatenate(reps) == np.arange(n)).tolist()]  # what the near pass saw
    near_docs = len(alone_texts)
    alone_s = datasketch_alone(alone_texts, args.threshold, args.num_perm, args.ngram, args.batch)
    doc = {"benchmark": "bench_clean.py", **start, "docs": n, "base_docs": args.docs, "share": args.share,
           "params": {"threshold": args.threshold, "num_perm": args.num_perm, "ngram": args.ngram, "decontam_ngram": 13},
           "recall": rows, "precision": detect, "lsh_candidates": near.candidates,
           "seconds": {"exact": exact_s, "near": near_s, "decontam": decontam_s, "eval_ngrams_build": build_s,
                       "datasketch_alone": alone_s},
           "near_docs": near_docs, "near_docs_per_s": near_docs / near_s, "datasketch_docs_per_s": near_docs / alone_s,
           "ratio_vs_datasketch": alone_s / near_s, "peak_rss_mb": peak_ours,
           "eval_ngrams": int(evals.hashes[0].size)}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: doc[k] for k in ("docs", "recall", "precision", "seconds", "ratio_vs_datasketch", "peak_rss_mb")}, indent=1))


if __name__ == "__main__":
    main()
