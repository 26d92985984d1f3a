"""Near-duplicate recall against the exact Jaccard similarity, for several LSH settings.

Base documents of 150+ words (seeded 40-word pieces of the demo corpus, as ``bench_clean.py``),
then one planted copy of each of ``--copies`` originals: each copy has a seeded share of its words
replaced, drawn evenly from 0 to ``--max-edit`` (so the copies' true Jaccard similarities spread
across the threshold), and every third copy also has a 15-word footer appended. The exact
Jaccard similarity of every planted pair's word 5-shingle sets is the truth: recall is the share
of pairs at or above the threshold that the near pass (pipeline.clean.near, candidates by LSH,
kept when the signatures agree on at least the threshold's share of values) reports, as a whole
and by band of true similarity; the LSH recall is the share that were candidates at all. The old
setting (64 permutations, datasketch's MinHashLSH choosing 5 bands x 11 rows) is run through
datasketch itself for comparison.

    nice -n 15 python benchmarks/bench_near_recall.py --docs 4000   # writes benchmarks/results/near_recall.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_ablate import commit, machine  # noqa: E402
from bench_clean import BOILER, base_documents, demo_pieces, true_jaccard  # noqa: E402

from pipeline.clean.near import candidate_probability, signature_pairs, signature_rows  # noqa: E402

SETTINGS = ((64, 5, 11), (64, 8, 8), (72, 12, 6), (91, 13, 7), (112, 14, 8), (112, 16, 7), (128, 16, 8))  # (num_perm, bands, rows)


def planted(docs: int, copies: int, max_edit: float, seed: int) -> tuple[list[str], np.ndarray]:
    """The base documents then one copy each of ``copies`` originals, and the (original, copy) pairs."""
    pieces, _, _ = demo_pieces(0)
    base = base_documents(pieces, docs, seed)
    rng = random.Random(seed + 1)
    texts, pairs = list(base), []
    for j, o in enumerate(rng.sample(range(docs), copies)):
        words = base[o].split()
        share = max_edit * j / max(1, copies - 1)
        for i in rng.sample(range(len(words)), round(len(words) * share)):
            words[i] = "zq" + words[i][::-1]
        pairs.append((o, len(texts)))
        texts.append(" ".join(words) + (" " + BOILER if j % 3 == 0 else ""))
    return texts, np.array(pairs, np.int64)


def datasketch_pairs(sigs: np.ndarray, threshold: float, seed: int) -> tuple[set, int]:
    """The old near pass: datasketch's MinHashLSH at its own bands and rows, query then insert."""
    from datasketch import LeanMinHash, MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=sigs.shape[1])
    scheme = MinHash(num_perm=1, seed=seed).scheme
    found, candidates = set(), 0
    for key, sig in enumerate(sigs):
        mh = LeanMinHash(seed=seed, hashvalues=sig.astype(np.uint64), scheme=scheme)
        for other in lsh.query(mh):
            candidates += 1
            if np.mean(sigs[other] == sig) >= threshold:
                found.add((int(other), key))
        lsh.insert(key, mh, check_duplication=False)
    return found, candidates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=4000)
    ap.add_argument("--copies", type=int, default=1000)
    ap.add_argument("--max-edit", type=float, default=0.05)
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "near_recall.json"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    texts, pairs = planted(args.docs, args.copies, args.max_edit, 0)
    truth = true_jaccard(texts, pairs, 5)
    want = truth >= args.threshold
    keys = np.arange(len(texts), dtype=np.int64)
    bins = [(args.threshold, 0.85), (0.85, 0.9), (0.9, 1.01)]
    rows = []
    for num_perm, bands, r in SETTINGS:
        t = time.perf_counter()
        sigs = signature_rows(texts, num_perm, 5, seed=1)
        sig_s = time.perf_counter() - t
        t = time.perf_counter()
        if (bands, r) == (5, 11):
            found, candidates = datasketch_pairs(sigs, args.threshold, 1)
            how = "datasketch MinHashLSH (its own bands and rows)"
        else:
            got, candidates = signature_pairs(keys, sigs, args.threshold, r)
            found, how = {tuple(p) for p in got.tolist()}, "pipeline.clean.near"
        lsh_s = time.perf_counter() - t
        hit = np.array([tuple(p) in found for p in pairs.tolist()])
        both = sigs[pairs[:, 0], :bands * r].reshape(-1, bands, r) == sigs[pairs[:, 1], :bands * r].reshape(-1, bands, r)
        candidate = both.all(axis=2).any(axis=1)
        wrong = [p for p in found if true_jaccard(texts, np.array([p]), 5)[0] < args.threshold - 0.1]
        rows.append({"num_perm": num_perm, "bands": bands, "rows": r, "how": how,
                     "s_curve_at_threshold": float(candidate_probability(args.threshold, bands, r)),
                     "s_curve_at_0.5": float(candidate_probability(0.5, bands, r)),
                     "pairs_at_or_above": int(want.sum()), "found": int(hit[want].sum()), "recall": float(hit[want].mean()),
                     "lsh_recall": float(candidate[want].mean()),
                     "recall_by_true_jaccard": {f"{a:g}-{min(b, 1):g}": float(hit[(truth >= a) & (truth < b)].mean())
                                                for a, b in bins if ((truth >= a) & (truth < b)).any()},
                     "found_below_threshold": int(hit[~want].sum()), "found_pairs_below_threshold_minus_0.1": len(wrong),
                     "candidates": candidates, "signature_s": round(sig_s, 2), "lsh_s": round(lsh_s, 2)})
        print(json.dumps(rows[-1]), flush=True)
    doc = {"benchmark": "bench_near_recall.py", "machine": machine(), "commit": commit(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "docs": len(texts), "planted_pairs": len(pairs),
           "threshold": args.threshold, "max_edit": args.max_edit,
           "true_jaccard_quantiles": np.quantile(truth, [0, 0.25, 0.5, 0.75, 1]).tolist(),
           "settings": rows, "wall_s": time.perf_counter() - t0}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
