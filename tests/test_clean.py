"""The clean stage's library (pipeline/clean/): exact, near and semantic duplicates and n-gram
decontamination on planted cases, the actions, and the config's refusals."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
import yaml
from helpers import DATA, demo_slice

from pipeline.clean.decontam import EvalNgrams
from pipeline.clean.exact import exact_representatives, text_hashes
from pipeline.clean.near import near_pairs, signature_rows
from pipeline.clean.ngrams import text_ngrams
from pipeline.clean.plan import duplicate_groups, plan
from pipeline.clean.semantic import semantic_pairs
from pipeline.data.text_pieces import pieces

WIKITEXT = DATA / "eval" / "wikitext" / "wiki.test.raw"


def _long_texts(n: int, words: int = 80) -> list[str]:
    """``n`` distinct texts of at least ``words`` words, each demo-corpus documents joined in turn."""
    out, cur = [], []
    for d in demo_slice(3000, stride=7):
        cur.append(d["text"])
        if len(" ".join(cur).split()) >= words:
            out.append(" ".join(cur))
            cur = []
            if len(out) == n:
                return out
    pytest.skip("the shared demo corpus is too short")


def _wiki_paragraph() -> str:
    from pipeline.data.wikitext import read_articles

    if not WIKITEXT.is_file():
        pytest.skip(f"WikiText-2 raw test file not found at {WIKITEXT}")
    return max(read_articles(WIKITEXT)[5].split("\n"), key=len).strip()


def test_exact_duplicates_ignore_case_and_spacing_only():
    texts = ["The cat sat.\n\nOn the mat.", "  the CAT sat. on   the mat.", "The cat sat on the mat.", "Another text entirely."]
    assert exact_representatives(text_hashes(texts)).tolist() == [0, 0, 2, 3]


def test_near_duplicates_by_edits_reorderings_and_boilerplate_and_not_distinct_texts():
    base = _long_texts(12, words=250)
    edited = base[0].split()
    for i in (10, 90, 170):
        edited[i] = "zzedit"
    paragraphs = base[1].split()
    reordered = " ".join(paragraphs[len(paragraphs) // 2:] + paragraphs[:len(paragraphs) // 2])  # two halves swapped
    boiler = base[2] + " Subscribe to our newsletter. Cookie policy. All rights reserved."
    texts = base + [" ".join(edited), reordered, boiler]
    pairs, _ = near_pairs([(list(range(len(texts))), texts)], threshold=0.8, num_perm=128, ngram=5)
    found = {tuple(p) for p in pairs.tolist()}
    assert {(0, 12), (1, 13), (2, 14)} <= found
    assert not {p for p in found if p[1] < 12}, found  # the distinct documents are not paired with each other


def test_semantic_pairs_stay_within_a_cluster():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 16)).astype(np.float32)
    x[1] = x[0] + 0.01 * rng.normal(size=16)  # a near copy in the same cluster
    x[3] = x[2]  # the same vector in another cluster
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    cluster = np.array([0, 0, 1, 2, 1, 2])
    pairs, largest = semantic_pairs(lambda ids: x[ids], cluster, np.arange(6), threshold=0.95)
    assert pairs.tolist() == [[0, 1]] and largest == 2


def test_semantic_groups_reduced_chunk_by_chunk_are_the_pairs_groups():
    """``forest``: one pair a grouped document, to its group's smallest doc id, over several chunks
    of queries; the groups (connected components) are those of every pair."""
    from pipeline.clean.groups import components

    rng = np.random.default_rng(1)
    base = rng.normal(size=(8, 32)).astype(np.float32)
    x = np.concatenate([base[rng.integers(0, 8, 60)] + 0.02 * rng.normal(size=(60, 32)).astype(np.float32),
                        rng.normal(size=(20, 32)).astype(np.float32)])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    cluster = rng.integers(0, 3, x.shape[0])
    docs = np.arange(x.shape[0])
    pairs, _ = semantic_pairs(lambda ids: x[ids], cluster, docs, threshold=0.95, chunk=7)
    tree, _ = semantic_pairs(lambda ids: x[ids], cluster, docs, threshold=0.95, chunk=7, forest=True)
    assert len(tree) < len(pairs) and np.array_equal(components(docs.size, tree), components(docs.size, pairs))
    assert np.unique(tree[:, 1]).size == len(tree) and (tree[:, 0] < tree[:, 1]).all()
    assert (components(docs.size, tree)[tree[:, 1]] == tree[:, 0]).all()  # each pair ends at its group's smallest doc id


def test_a_planted_wikitext_paragraph_is_caught_and_only_it():
    para = _wiki_paragraph()
    clean = _long_texts(3)
    evals = EvalNgrams.build({"wikitext": lambda: [WIKITEXT.read_text(encoding="utf-8")]}, 13)
    texts = clean + [clean[0][:300] + " " + para + " " + clean[1][:200]]
    counts = evals.overlaps(texts)[:, 0]
    assert counts[:3].tolist() == [0, 0, 0] and counts[3] >= len(re.findall(r"\w+", para)) - 12


def test_an_evaluation_sets_boilerplate_never_flags_but_its_passages_do():
    """Man pages share a license footer: in the held-out split it is boilerplate, not a passage."""
    footer = ("This is free software; see the source for copying conditions. There is NO warranty; not even for "
              "MERCHANTABILITY or FITNESS FOR A PARTICULAR PURPOSE.")
    docs = _long_texts(12)
    heldout = [d[:400] + " " + footer for d in docs[:10]]  # ten held-out documents carry the footer
    training = [docs[10][:300] + " " + footer, docs[11][:300] + " " + docs[3][:400], docs[10][300:600]]
    plain = EvalNgrams.build({"heldout": lambda: heldout}, 13)
    assert plain.overlaps(training)[:, 0].astype(bool).tolist() == [True, True, False]
    cleaned = EvalNgrams.build({"heldout": lambda: heldout}, 13, common_share=0.01)
    assert cleaned.common[0] > 0  # the footer's n-grams, in 10 of 10 units
    # the footer alone flags nothing; a held-out document's own text still does
    assert cleaned.overlaps(training)[:, 0].astype(bool).tolist() == [False, True, False]
    # a unit is every text one row shows a model: a query repeated with each choice is one unit
    rows = [[docs[i][:300], docs[i][:300] + " choice A", docs[i][:300] + " choice B", docs[i][:300] + " choice C"] for i in range(2)]
    per_row = EvalNgrams.build({"dclm": lambda: rows}, 13, common_share=0.01)
    assert per_row.common[0] == 0 and per_row.overlaps([docs[0][:300]])[0, 0] > 0


def test_boilerplate_many_training_documents_share_never_flags():
    """Two held-out man pages carry the footer (too few for the held-out side to call it common), forty
    training documents too: the footer is boilerplate (several evaluation units and many training
    documents hold it); a held-out page's own text still flags."""
    from pipeline.clean.decontam import common_grams

    footer = ("This is free software; see the source for copying conditions. There is NO warranty; not even for "
              "MERCHANTABILITY or FITNESS FOR A PARTICULAR PURPOSE.")
    docs = _long_texts(44, words=40)
    heldout = [docs[0] + " " + footer, docs[1] + " " + footer]
    training = [d + " " + footer for d in docs[2:42]] + [docs[42] + " " + docs[0], docs[43]]
    evals = EvalNgrams.build({"heldout": lambda: heldout}, 13, common_share=0.01)
    assert evals.common == (0,)
    found = evals.hits(training)[0]
    assert len(np.unique(found[:, 0])) == 41  # every footer carrier and the copied passage
    for share, flagged in ((1.0, set(range(41))), (0.01, {40})):
        boiler = common_grams(found, evals.hashes[0].size, len(training), share, evals.units_with[0])
        kept = found[~boiler[found[:, 1]]]
        assert set(np.unique(kept[:, 0]).tolist()) == flagged


def _synthetic_docs(n: int, words: int, seed: int) -> list[str]:
    """``n`` seeded texts of ``words`` made-up words (they share no 13-gram with real text)."""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}q" for i in range(5000)])
    return [" ".join(vocab[rng.integers(0, vocab.size, words)]) for _ in range(n)]


def test_a_benchmark_passage_copied_into_many_training_documents_is_always_flagged(tmp_path):
    """One WikiText paragraph planted in 1 to 600 of 2,000 training documents is flagged in every
    copy at the default ``common_share`` (a passage sits in one evaluation unit, however many
    training documents copy it), while a footer two evaluation units and a hundred training
    documents share is left out as boilerplate, and reported with each document holding it."""
    import polars as pl

    from pipeline.clean.shards import ScanSpec, ShardScan, scan_unit
    from pipeline.clean.stage import _contamination
    from pipeline.config import StrataConfig

    if not WIKITEXT.is_file():
        pytest.skip(f"WikiText-2 raw test file not found at {WIKITEXT}")
    from pipeline.data.wikitext import read_articles

    footer = "Retrieved from the online encyclopedia under the free licence all text is available under the same terms ok"
    articles = read_articles(WIKITEXT)
    units = [articles[0] + " " + footer, articles[1] + " " + footer] + list(articles[2:])
    cache = EvalNgrams.build({"wikitext": lambda: units}, 13).save(tmp_path / "evals")
    spec = ScanSpec(exact=False, near=None, evals=str(cache))
    passage = max(articles[5].split("\n"), key=len).strip()
    cfg = StrataConfig.model_validate({})
    assert cfg.decontam.common_share == 0.01 and cfg.decontam.min_overlap == 1
    base = _synthetic_docs(2000, 60, 0)
    footed = list(range(1, 2000, 20))  # 100 documents carry the footer, none of them a planted copy

    def scanned(copies: int) -> tuple[list[int], list]:
        texts = list(base)
        planted = list(range(0, 2000, 2000 // copies))[:copies]
        for i in planted:
            texts[i] = texts[i][:200] + " " + passage + " " + texts[i][200:]
        for i in footed:
            texts[i] += " " + footer
        np.save(tmp_path / f"hits{copies}.npy", scan_unit(texts, False, None, str(cache))[3])
        return planted, [ShardScan(0, len(texts), None, {"hits": tmp_path / f"hits{copies}.npy"})]

    missed = {}
    for copies in (1, 4, 15, 25, 60, 200, 600):
        planted, scans = scanned(copies)
        counts = _contamination(cfg, 2000, ("wikitext",), [(spec, scans)])[0]
        flagged = np.flatnonzero(counts[:, 0] >= cfg.decontam.min_overlap).tolist()
        assert set(flagged) <= set(planted)
        missed[copies] = copies - len(flagged)
    assert missed == dict.fromkeys(missed, 0)
    rows: list = []  # what the stage writes to clean/skipped_hits.parquet
    _, common, skipped, ngrams = _contamination(cfg, 2000, ("wikitext",), [(spec, scanned(600)[1])], rows.append)
    assert common[0] == ngrams.height > 0 and set(ngrams["eval_set"]) == {"wikitext"}
    assert (ngrams["eval_units"] >= 2).all() and (ngrams["training_docs"] == len(footed)).all()
    holders = pl.concat(rows)
    assert sorted(holders["doc_id"].unique().to_list()) == footed == np.flatnonzero(skipped[:, 0]).tolist()
    assert set(holders["ngram"].to_list()) == set(ngrams["ngram"].to_list())


def test_groups_kinds_and_actions():
    # 0 = 1 exactly, 2 nearly duplicates 0, 3 semantically duplicates 2's group, 4 contaminated, 5 clean
    exact_rep, near, sem = np.array([0, 0, 2, 3, 4, 5]), np.array([[0, 2]]), np.array([[0, 3]])
    group, kind, lost = duplicate_groups(6, exact_rep, near, sem)
    assert group.tolist() == [0, 0, 0, 0, -1, -1] and kind.tolist() == [0, 0, 1, 2, -1, -1] and lost.tolist() == [-1, 0, 1, 2, -1, -1]
    flags = np.array([[0], [0], [0], [0], [1], [0]], bool)
    keep = plan(6, exact_rep, near, sem, flags, ("wikitext",), "keep_one", True)
    assert keep["removed"].to_list() == [None, "exact", "near", "semantic", "contaminated", None]
    assert keep["contaminated"].to_list() == [None, None, None, None, "wikitext", None]
    assert plan(6, exact_rep, near, sem, flags, ("wikitext",), "drop", False)["removed"].to_list() == ["exact"] * 2 + ["near", "semantic",
                                                                                                                          None, None]
    assert plan(6, exact_rep, near, sem, flags, ("wikitext",), "separate", False)["removed"].null_count() == 6


def test_a_bad_clean_key_exits_2_naming_the_key_and_the_fix(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({"data_root": str(tmp_path / "root"), "dedup": {"near_threshold": 1.5}}))
    proc = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(cfg)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "dedup.near_threshold" in proc.stderr and "Fix:" in proc.stderr and "Traceback" not in proc.stderr
    cfg.write_text(yaml.safe_dump({"data_root": str(tmp_path / "root"), "dedup": {"action": "delete"}}))
    proc = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(cfg)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "dedup.action" in proc.stderr and "keep_one" in proc.stderr, proc.stderr[-2000:]


def _shard_scans(tmp_path, texts: list[str], cfg, cut: int) -> list:
    """``texts`` scanned as two shards (``[:cut]``, ``[cut:]``) by the per-shard scan, their
    signature files read back as the gather reads them."""
    from pipeline.clean.shards import ShardScan, scan_spec, scan_unit

    near = scan_spec(cfg, None).near
    scans = []
    for j, (a, b) in enumerate(((0, cut), (cut, len(texts)))):
        np.save(tmp_path / f"{j}.sig.npy", scan_unit(texts[a:b], False, near, None)[2])
        scans.append(ShardScan(a, b - a, None, {"sig": tmp_path / f"{j}.sig.npy"}))
    return scans


def test_stored_signatures_give_the_pairs_the_texts_give(tmp_path):
    """The gather's path (signatures computed per shard, read back from their files) finds the
    pairs the text path finds, across two shards."""
    from pipeline.clean.stage import _near_pairs
    from pipeline.config import StrataConfig

    cfg = StrataConfig.model_validate({})
    d = cfg.dedup
    base = _long_texts(6, words=200)
    edited = base[0].split()
    edited[40] = "zzedit"
    texts = base + [" ".join(edited), base[3].upper(), ""]
    want, _ = near_pairs([(list(range(len(texts))), texts)], d.near_threshold, d.near_num_perm, d.near_ngram, cfg.seed + 1)
    got, _ = _near_pairs(cfg, _shard_scans(tmp_path, texts, cfg, 4), np.arange(len(texts)))
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, want.tolist())) and {(0, 6), (3, 7)} <= set(map(tuple, got.tolist()))


def test_near_copies_at_the_threshold_are_lsh_candidates(tmp_path):
    """Planted near copies across the threshold (0% to 5% of the words replaced, a footer on every
    third): of the pairs at true Jaccard >= ``dedup.near_threshold`` whose signatures agree on that
    share of values (what the check keeps), the default LSH bands make >= 95% candidates. Pairs
    just above the threshold whose 72-value estimate falls under it are lost to the estimate, not
    to the LSH (docs/cleaning.md)."""
    from pipeline.clean.ngrams import text_ngrams
    from pipeline.clean.stage import _near_pairs
    from pipeline.config import StrataConfig

    cfg = StrataConfig.model_validate({})
    d = cfg.dedup
    rng = np.random.default_rng(7)
    texts = _synthetic_docs(400, 150, 1)
    pairs = []
    for j, o in enumerate(rng.choice(400, 200, replace=False).tolist()):
        words = texts[o].split()
        for i in rng.choice(len(words), round(len(words) * 0.05 * j / 199), replace=False):
            words[i] = "zz" + words[i]
        pairs.append((o, len(texts)))
        texts.append(" ".join(words) + (" with a footer of twelve words that every third copy carries at its end" if j % 3 == 0 else ""))
    truth = []
    for a, b in pairs:
        flat, off = text_ngrams([texts[a], texts[b]], d.near_ngram, short=True)
        x, y = set(flat[off[0]:off[1]].tolist()), set(flat[off[1]:off[2]].tolist())
        truth.append(len(x & y) / len(x | y))
    truth = np.array(truth)
    scans = _shard_scans(tmp_path, texts, cfg, 300)
    sig = np.concatenate([np.load(s.files["sig"]) for s in scans])
    agree = np.array([np.mean(sig[a] == sig[b]) >= d.near_threshold for a, b in pairs])
    found = {tuple(p) for p in _near_pairs(cfg, scans, np.arange(len(texts)))[0].tolist()}
    hit = np.array([(min(a, b), max(a, b)) in found for a, b in pairs])
    want = truth >= d.near_threshold
    assert want.sum() >= 80 and (want & agree).sum() >= 60  # the planted pairs spread across the threshold
    assert hit[want & agree].mean() >= 0.95, (hit[want & agree].mean(), hit[want].mean(), agree[want].mean())
    assert hit[want].mean() >= agree[want].mean() - 0.05  # within 5 points of what the estimate's noise leaves
    from pipeline.clean.near import candidate_probability

    assert candidate_probability(d.near_threshold, d.near_num_perm // d.near_rows, d.near_rows) >= 0.95


def test_evaluation_ngrams_saved_and_loaded_keep_the_boilerplate_rule(tmp_path):
    """The cache the per-shard scans read (every n-gram, with the units holding each) gives the
    boilerplate that building with ``common_share`` leaves out."""
    units = [f"unit {i} " + " ".join(f"w{i}x{j}" for j in range(20)) + " the same licence footer of every unit in this set ok"
             for i in range(10)]
    full = EvalNgrams.build({"heldout": lambda: units}, 5)
    back = EvalNgrams.load(full.save(tmp_path / "cache"))
    assert back.names == full.names and back.n == 5 and back.n_units == (10,)
    np.testing.assert_array_equal(back.hashes[0], full.hashes[0])
    cleaned = EvalNgrams.build({"heldout": lambda: units}, 5, common_share=0.01)
    boiler = back.boilerplate(0.01)[0]
    assert boiler.sum() == cleaned.common[0] > 0
    np.testing.assert_array_equal(np.asarray(back.hashes[0])[~boiler], cleaned.hashes[0])
    assert not back.boilerplate(1.0)[0].any()


def test_a_shards_hits_map_to_the_doc_ids_of_the_rows_the_corpus_kept(tmp_path):
    from pipeline.clean.shards import ShardScan

    hits = np.array([[0, 0, 5], [2, 1, 7], [3, 0, 9], [5, 0, 1]], np.int64)  # (training row, set, n-gram)
    np.save(tmp_path / "h.npy", hits)
    every = ShardScan(start=10, n=6, rows=None, files={"hits": tmp_path / "h.npy"}).hits()
    assert every.tolist() == [[10, 0, 5], [12, 1, 7], [13, 0, 9], [15, 0, 1]]
    kept = ShardScan(start=10, n=3, rows=np.array([0, 3, 4]), files={"hits": tmp_path / "h.npy"}).hits()
    assert kept.tolist() == [[10, 0, 5], [11, 0, 9]]  # rows 2 and 5 were dropped by the corpus; row 3 is its 2nd document


def test_a_scan_is_named_by_what_its_bytes_depend_on():
    """dedup.action or a threshold (the gather's) keeps a shard's scan; the MinHash size, the seed or
    the evaluation files make a new one."""
    from pipeline.clean.shards import scan_spec
    from pipeline.config import StrataConfig

    def key(**over) -> str:
        return scan_spec(StrataConfig.model_validate(over), "/x/clean/evals/abc").key

    base = key()
    assert key(dedup={"action": "drop", "near_threshold": 0.7, "semantic_threshold": 0.9}) == base
    assert key(decontam={"common_share": 1.0, "min_overlap": 3}) == base
    assert key(dedup={"near_rows": 8}) == base  # the bands are cut from the stored signatures by the gather
    assert len({base, key(dedup={"near_num_perm": 128}), key(seed=1), key(dedup={"exact": False})}) == 4
    assert scan_spec(StrataConfig.model_validate({}), "/x/clean/evals/def").key != base


def test_a_long_text_read_in_pieces_gives_the_signature_and_hits_of_the_whole():
    """A text longer than ``limit`` is shingled and looked up piece by piece, its shingles folded
    into the MinHash ``chunk`` at a time: the same signatures and hits as the whole text in one
    batch (and as datasketch given every shingle at once). The n-grams across each cut are among
    the evaluation n-grams, so a wrong overlap of words between pieces loses hits."""
    import datasketch

    texts = _long_texts(4, words=300)
    long = texts[0] + "\n\n" + texts[1]
    assert len(list(pieces(long, 200))) > 10
    few = "x" * 500 + " Σ y"  # longer than the limit, fewer words than a shingle: one shingle of all of them
    batch = [texts[2], long, "", few, "short text", texts[3]]
    whole = signature_rows(batch, 72, 5, 7, limit=10**9, chunk=10**9)
    assert (signature_rows(batch, 72, 5, 7, limit=200, chunk=3) == whole).all()
    flat, offsets = text_ngrams(batch, 5, short=True)
    sets = [(flat[offsets[i]:offsets[i + 1]] & np.uint64(0xFFFFFFFF)).tolist() for i in range(len(batch))]
    ref = datasketch.MinHash.bulk(sets, num_perm=72, seed=7, hashfunc=lambda v: v)
    assert (whole == np.array([m.hashvalues for m in ref], np.uint32)).all()

    evals = EvalNgrams.build({"long": lambda: [long], "other": lambda: [texts[3]]}, 13)
    at_once = evals.hits(batch, limit=10**9)
    in_pieces = evals.hits(batch, limit=200)
    assert at_once[0].shape[0] == evals.hashes[0].size and set(at_once[0][:, 0]) == {1}  # every n-gram of the long text
    assert all((a == b).all() and a.shape == b.shape for a, b in zip(at_once, in_pieces))
    assert evals.hits([few, long], limit=200)[0].shape[0] == evals.hashes[0].size
