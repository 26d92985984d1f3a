"""Packing variants (Packing & shuffling A.3): token conservation, padding masks, atom boundaries, best fit."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipeline.errors import StrataInputError
from pipeline.packing.pack import (
    ATOM_MULTIPLES,
    PACKING_SPECS,
    SEGMENT_SCHEMA,
    SequenceStore,
    conservation,
    pack,
    pack_concat,
    packing_stats,
    parse_packing,
    sequence_tokens,
)

SHARED = Path(os.environ.get("STRATA_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
EOS, PAD = 1, 0
L = 32


def corpus(n_docs: int = 120, seed: int = 3, hi: int = 150):
    """Stream lengths (text + EOS), offsets, and a store whose value at position i is i."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, hi, n_docs)
    lengths[:4] = [1, 2, L, L + 1]  # EOS only, 1 text token, exactly MSL, MSL + 1
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    return lengths, offsets, np.arange(offsets[-1], dtype=np.int64), rng.permutation(n_docs)


def eos_store(offsets: np.ndarray, seed: int = 0) -> np.ndarray:
    """A store with text ids in [2, 50) and EOS at the end of every document."""
    toks = np.random.default_rng(seed).integers(2, 50, offsets[-1])
    toks[offsets[1:] - 1] = EOS
    return toks


def matrix(p, tokens, offsets, pad_id: int = -1):
    return SequenceStore(tokens, offsets, p.segments, p.seq_len, pad_id=pad_id).masked_batch(np.arange(p.n_sequences))


@pytest.mark.parametrize("spec", PACKING_SPECS)
def test_every_store_token_placed_exactly_once(spec):
    lengths, offsets, toks, order = corpus()
    variant, atom = parse_packing(spec)
    p = pack(variant, order, lengths, L, atom_multiple=atom, seed=7)
    t, _, _, filled = matrix(p, toks, offsets)
    assert (t[~filled] == -1).all()
    assert conservation(p.segments, lengths, L)["ok"]
    assert p.tokens_packed == p.n_sequences * L == p.tokens_in - p.tokens_dropped + p.tokens_eos_added + p.tokens_padding
    assert filled.sum() == p.tokens_in - p.tokens_dropped + p.tokens_eos_added
    assert filled.any(axis=1).all()  # no sequence is all padding
    counts = np.bincount(t[filled], minlength=toks.size)
    eos_pos = offsets[1:] - 1
    added = np.bincount(p.segments.filter("eos_added")["doc_id"].to_numpy(), minlength=lengths.size)
    if variant == "concat":  # the kept tokens are a prefix of the doc_order stream
        stream = np.concatenate([toks[offsets[d] : offsets[d + 1]] for d in order])
        keep = p.tokens_in - p.tokens_dropped
        assert keep == stream.size // max(p.atom or L, L) * max(p.atom or L, L)
        assert np.array_equal(np.sort(t[filled]), np.sort(stream[:keep]))
        assert p.tokens_eos_added == p.tokens_padding == 0
    else:
        assert p.tokens_dropped == 0
        text = np.ones(toks.size, bool)
        text[eos_pos] = False
        assert (counts[text] == 1).all()
        assert np.array_equal(counts[eos_pos], 1 + added)
    if variant == "padding":  # one inserted EOS per piece but the last
        a = p.atom or L
        assert np.array_equal(added, np.maximum(1, -(-(lengths - 1) // (a - 1))) - 1)


def test_concat_matches_reference_and_legacy_api():
    lengths, offsets, toks, order = corpus(40)
    p = pack_concat(order, lengths, L)
    assert p.segments.select(list(SEGMENT_SCHEMA)).schema == pl.Schema(SEGMENT_SCHEMA)
    stream = np.concatenate([toks[offsets[d] : offsets[d + 1]] for d in order])
    m = stream.size // L
    assert (p.n_sequences, p.tokens_dropped) == (m, stream.size - m * L)
    store = SequenceStore(toks, offsets, p.segments, L)
    tokens, rows, starts = store.batch(np.arange(m))
    assert np.array_equal(tokens, stream[: m * L].reshape(m, L))
    assert not store.has_padding
    assert np.array_equal(sequence_tokens(toks, offsets, p.segments, L, np.array([3, 1])), tokens[[3, 1]])
    # segment starts: every sequence start plus every document start inside a sequence
    doc_starts = (np.cumsum(lengths[order]) - lengths[order])
    expect = np.union1d(np.arange(m) * L, doc_starts[doc_starts < m * L])
    assert np.array_equal(np.sort(rows * L + starts), expect)


@pytest.mark.parametrize("mult", ATOM_MULTIPLES)
def test_concat_atoms_are_shuffled_whole_stream_chunks(mult):
    lengths, offsets, toks, order = corpus(150)
    p = pack("concat", order, lengths, L, atom_multiple=mult, seed=11)
    a = int(mult * L)
    t, _, _, filled = matrix(p, toks, offsets)
    assert filled.all()
    stream = np.concatenate([toks[offsets[d] : offsets[d + 1]] for d in order])
    blocks = t.reshape(-1, a)  # the sequences, read in id order, are the shuffled atoms
    where = np.empty(toks.size, np.int64)  # store value -> position in the doc_order stream
    where[stream] = np.arange(stream.size)
    pos = where[blocks[:, 0]]
    assert (pos % a == 0).all()
    assert np.array_equal(np.sort(pos // a), np.arange(blocks.shape[0]))
    assert all(np.array_equal(b, stream[s : s + a]) for b, s in zip(blocks, pos))
    assert not np.array_equal(pos, np.sort(pos))  # actually shuffled


def test_padding_pieces_follow_appendix_a3_example():
    # MSL 64, document of 130 text tokens: 63 + EOS, 63 + EOS, 4 + EOS (its own) + 59 padding.
    lengths = np.array([131])
    offsets = np.array([0, 131])
    toks = eos_store(offsets)
    p = pack("padding", np.array([0]), lengths, 64)
    t, _, _, filled = SequenceStore(toks, offsets, p.segments, 64, pad_id=PAD).masked_batch(np.arange(3))
    assert p.n_sequences == 3 and p.tokens_eos_added == 2 and p.tokens_padding == 59
    assert filled.sum(axis=1).tolist() == [64, 64, 5]
    assert t[0, 63] == t[1, 63] == t[2, 4] == EOS and (t[2, 5:] == PAD).all()
    assert np.array_equal(np.r_[t[0, :63], t[1, :63], t[2, :4]], toks[:130])


@pytest.mark.parametrize("mult", [m for m in ATOM_MULTIPLES if m <= 1])
def test_padding_small_atoms_fill_slots_of_atom_size(mult):
    lengths, offsets, _, order = corpus()
    toks = eos_store(offsets)
    a = int(mult * L)
    p = pack("padding", order, lengths, L, atom_multiple=mult, seed=5)
    t, _, _, filled = matrix(p, toks, offsets, PAD)
    assert (t[~filled] == PAD).all()
    seg = p.segments
    assert (seg["seq_token_start"].to_numpy() % a == 0).all()  # every piece starts a slot
    ext = seg["n_tokens"].to_numpy() + seg["eos_added"].to_numpy()
    assert (ext <= a).all() and (ext[seg["eos_added"].to_numpy()] == a).all()
    slots, slot_fill = t.reshape(-1, a), filled.reshape(-1, a)
    n = slot_fill.sum(axis=1)
    used = n > 0
    assert (slot_fill == (np.arange(a) < n[:, None])).all()  # real tokens first, then padding
    assert (slots[used, n[used] - 1] == EOS).all()  # every piece ends with EOS
    assert (np.flatnonzero(~used) // (L // a) == p.n_sequences - 1).all()  # only the last sequence has empty slots


@pytest.mark.parametrize("mult", [m for m in ATOM_MULTIPLES if m >= 1])
def test_padding_large_atoms_pad_to_msl_and_split(mult):
    lengths, offsets, _, order = corpus(hi=400)
    toks = eos_store(offsets)
    a = int(mult * L)
    p = pack("padding", order, lengths, L, atom_multiple=mult, seed=5)
    t, _, _, filled = matrix(p, toks, offsets, PAD)
    seg = p.segments.sort("doc_id", "doc_token_start")
    assert (seg["seq_token_start"] == 0).all() and seg["sequence_id"].n_unique() == seg.height  # one piece part per sequence
    piece = seg["doc_token_start"].to_numpy() // (a - 1)
    same = (np.diff(seg["doc_id"].to_numpy()) == 0) & (np.diff(piece) == 0)
    assert (np.diff(seg["sequence_id"].to_numpy())[same] == 1).all()  # a piece's parts are consecutive
    assert (filled == (np.arange(L) < filled.sum(axis=1)[:, None])).all()
    last = filled.sum(axis=1) - 1
    doc_end = seg["doc_token_start"].to_numpy() + seg["n_tokens"].to_numpy() == lengths[seg["doc_id"].to_numpy()]
    ends_piece = np.isin(np.arange(p.n_sequences), seg["sequence_id"].to_numpy()[seg["eos_added"].to_numpy() | doc_end])
    assert (t[ends_piece, last[ends_piece]] == EOS).all()
    assert (filled[~ends_piece]).all()
    # A.3: a 35-token document with MSL 32 and atom 128 is padded to 64, not to 128
    q = pack("padding", np.array([0]), np.array([36]), 32, atom_multiple=4)
    assert q.n_sequences == 2 and q.tokens_padding == 28


def reference_best_fit(sizes: list[int], cap: int) -> list[int]:
    bins: list[int] = []
    for s in sorted(sizes, reverse=True):
        fits = [i for i, f in enumerate(bins) if cap - f >= s]
        if fits:
            i = min(fits, key=lambda i: cap - bins[i])
            bins[i] += s
        else:
            bins.append(s)
    return sorted(bins)


def test_best_fit_keeps_short_documents_whole_and_matches_reference():
    lengths, offsets, toks, order = corpus(300, hi=80)
    p = pack("best_fit", order, lengths, L, seed=2)
    seg = p.segments
    per_doc = seg.group_by("doc_id").agg(pl.len().alias("k"), pl.col("n_tokens").sum().alias("n")).sort("doc_id")
    short = lengths[per_doc["doc_id"].to_numpy()] <= L
    assert (per_doc["k"].to_numpy()[short] == 1).all()
    assert np.array_equal(per_doc["n"].to_numpy(), lengths[per_doc["doc_id"].to_numpy()])
    fills = seg.group_by("sequence_id").agg(pl.col("n_tokens").sum())["n_tokens"].to_numpy()
    full = lengths // L
    assert (fills == L).sum() >= full.sum()
    expect = reference_best_fit([int(x) for x in lengths % L if x], L)
    assert sorted(fills[fills < L].tolist()) == [f for f in expect if f < L]
    assert p.n_sequences == full.sum() + len(expect)
    assert packing_stats(p)["docs_cut"] == int((lengths > L).sum())
    # varied sizes where best, first and worst fit disagree
    sizes = np.random.default_rng(0).integers(1, 100, 400)
    q = pack("best_fit", np.arange(400), sizes, 100)
    fills = q.segments.group_by("sequence_id").agg(pl.col("n_tokens").sum())["n_tokens"].to_list()
    assert sorted(fills) == reference_best_fit(sizes.tolist(), 100) and packing_stats(q)["docs_cut"] == 0


def test_stats_report_variant_figures():
    lengths, _, _, order = corpus(hi=400)
    s = packing_stats(pack("padding", order, lengths, L, atom_multiple=0.5, seed=1))
    assert s["packing"] == "padding-x0.5" and s["atom"] == L // 2 and s["tokens_dropped"] == 0
    assert s["tokens_kept"] == lengths.sum() and 0 < s["padding_fraction"] < 1
    assert s["docs_cut"] == int((lengths - 1 > L // 2 - 1).sum())
    c = packing_stats(pack("concat", order, lengths, L))
    assert c["padding_fraction"] == 0 and c["efficiency"] == 1 and c["docs_per_sequence"] > 1


@pytest.mark.parametrize("spec", PACKING_SPECS)
def test_deterministic_given_seed(spec):
    lengths, _, _, order = corpus()
    variant, atom = parse_packing(spec)
    a = pack(variant, order, lengths, L, atom_multiple=atom, seed=4).segments
    assert a.equals(pack(variant, order, lengths, L, atom_multiple=atom, seed=4).segments)
    if atom is not None or variant == "best_fit":
        assert not a.equals(pack(variant, order, lengths, L, atom_multiple=atom, seed=5).segments)


def test_conservation_detects_lost_and_overlapping_tokens():
    lengths, _, _, order = corpus()
    seg = pack("padding", order, lengths, L, atom_multiple=0.5).segments
    assert conservation(seg, lengths, L)["ok"]
    assert not conservation(seg.filter(pl.int_range(pl.len()) != 5), lengths, L)["ok"]
    moved = seg.with_columns(
        seq_token_start=pl.when(pl.int_range(pl.len()) == 1).then(pl.col("seq_token_start") - 1).otherwise(pl.col("seq_token_start")))
    assert not conservation(moved, lengths, L)["ok"]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(variant="shuffle"),
        dict(variant="concat", atom_multiple=0.3),
        dict(variant="concat", atom_multiple=-1.0),
        dict(variant="best_fit", atom_multiple=1.0),
        dict(variant="padding", atom_multiple=1 / 32),
        dict(variant="concat", seq_len=1),
        dict(variant="concat", doc_order=np.array([0, 99])),
        dict(variant="concat", doc_order=np.array([0, 1, 1])),
        dict(variant="concat", lengths=np.array([3, 0, 2])),
    ],
)
def test_bad_parameters_raise_input_error(kwargs):
    variant = kwargs.pop("variant")
    args = dict(doc_order=np.array([0, 1, 2]), lengths=np.array([3, 4, 2]), seq_len=L) | kwargs
    with pytest.raises(StrataInputError):
        pack(variant, args.pop("doc_order"), args.pop("lengths"), args.pop("seq_len"), **args)


@pytest.mark.parametrize("spec", ["concat-x0", "best_fit-x1", "padding-xabc", "pad"])
def test_bad_packing_spec(spec):
    with pytest.raises(StrataInputError):
        parse_packing(spec)


def test_real_corpus_every_variant():
    path = SHARED / "data" / "corpus" / "demo_corpus.jsonl.gz"
    tok_path = SHARED / "data" / "tokenizers" / "gpt-neox-olmo-dolma-v1_5.tokenizer.json"
    if not path.exists() or not tok_path.exists():
        pytest.skip("shared data not available")
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(tok_path))
    eos = tk.token_to_id("<|endoftext|>")
    with gzip.open(path, "rt") as f:
        texts = [json.loads(line)["text"] for i, line in zip(range(4000), f) if i % 10 == 0]
    ids = [e.ids + [eos] for e in tk.encode_batch(texts)]
    lengths = np.array([len(x) for x in ids])
    offsets = np.r_[0, np.cumsum(lengths)]
    toks = np.concatenate(ids).astype(np.int64)
    order = np.random.default_rng(0).permutation(lengths.size)
    for spec in PACKING_SPECS:
        variant, atom = parse_packing(spec)
        p = pack(variant, order, lengths, 64, atom_multiple=atom, seed=0)
        assert conservation(p.segments, lengths, 64)["ok"], spec
        t, _, _, filled = SequenceStore(toks, offsets, p.segments, 64, pad_id=-1).masked_batch(np.arange(p.n_sequences))
        assert (t[filled] >= 0).all() and (t[~filled] == -1).all()
        seg = p.segments
        d, n, e = seg["doc_id"].to_numpy(), seg["n_tokens"].to_numpy(), seg["eos_added"].to_numpy()
        ends = e | (seg["doc_token_start"].to_numpy() + n == lengths[d])
        last = seg["sequence_id"].to_numpy() * 64 + seg["seq_token_start"].to_numpy() + n + e - 1
        assert (t.reshape(-1)[last[ends]] == eos).all(), spec  # every document and piece ends in EOS


def test_token_counts_past_two_to_the_31_do_not_wrap():
    """Segment lengths are Int32; whole-corpus sums over them (10M documents hold 2.2B tokens) must not wrap."""
    lengths = np.full(3, 1_000_000_001, dtype=np.int64)
    p = pack("concat", np.arange(3), lengths, 2048)
    stats = packing_stats(p)
    assert stats["tokens_in"] == 3_000_000_003
    assert stats["tokens_kept"] + stats["tokens_dropped"] == stats["tokens_in"] and stats["tokens_kept"] > 2**31
    assert stats["tokens_padding"] >= 0 and 0 <= stats["padding_fraction"] < 1
    assert conservation(p.segments, lengths, 2048)["tokens_dropped"] == stats["tokens_dropped"]


def _reference_pack(variant: str, order: np.ndarray, lengths: np.ndarray, seq_len: int, atom_multiple=None, seed: int = 0) -> pl.DataFrame:
    """Segments by whole-array NumPy (one temporary per step), the way packing was computed before
    the numba kernels: the kernels must give the same rows in the same order."""
    def cut(start, length, doc, doc_start, eos, size):
        end = start + length
        first, last = start // size, (end - 1) // size
        pieces = last - first + 1
        rep = np.repeat(np.arange(start.size), pieces)
        seq = first[rep] + np.arange(rep.size) - np.repeat(np.cumsum(pieces) - pieces, pieces)
        lo, hi = np.maximum(start[rep], seq * size), np.minimum(end[rep], (seq + 1) * size)
        e = eos[rep] & (hi == end[rep])
        return seq, lo - seq * size, doc[rep], doc_start[rep] + lo - start[rep], hi - lo - e, e

    lens = lengths[order].astype(np.int64)
    rng = np.random.default_rng(seed)
    atom = None if atom_multiple is None else int(round(atom_multiple * seq_len))
    if variant == "concat":
        unit = seq_len if atom is None else max(atom, seq_len)
        keep = int(lens.sum()) // unit * unit
        starts = np.cumsum(lens) - lens
        live = starts < keep
        s, d = starts[live], order[live]
        n = np.minimum(s + lens[live], keep) - s
        ds, e = np.zeros(s.size, np.int64), np.zeros(s.size, bool)
        if atom is not None:
            a_id, a_off, d, ds, n, e = cut(s, n, d, ds, e, atom)
            slot = np.empty(keep // atom, np.int64)
            slot[rng.permutation(slot.size)] = np.arange(slot.size)
            s = slot[a_id] * atom + a_off
        rows = cut(s, n, d, ds, e, seq_len)
    else:  # padding
        a = seq_len if atom is None else atom
        k = np.maximum(1, -(-(lens - 1) // (a - 1)))
        rep = np.repeat(np.arange(order.size), k)
        j = np.arange(rep.size) - np.repeat(np.cumsum(k) - k, k)
        last = j == k[rep] - 1
        ds = j * (a - 1)
        n = np.where(last, lens[rep] - ds, a - 1)
        e = ~last
        slot = np.full(n.size, a, np.int64) if a <= seq_len else -(-(n + e) // seq_len) * seq_len
        perm = np.arange(n.size) if atom is None else rng.permutation(n.size)
        rep, ds, n, e, slot = rep[perm], ds[perm], n[perm], e[perm], slot[perm]
        rows = cut(np.cumsum(slot) - slot, n + e, order[rep], ds, e, seq_len)
    seq, start, doc, ds, n, e = rows
    o = np.lexsort((start, seq))
    seq, start, doc, ds, n, e = seq[o], start[o], doc[o], ds[o], n[o], e[o]
    cont = (seq[1:] == seq[:-1]) & (doc[1:] == doc[:-1]) & ~e[:-1] & (start[:-1] + n[:-1] == start[1:]) & (ds[:-1] + n[:-1] == ds[1:])
    head = np.flatnonzero(np.r_[True, ~cont])
    tail = np.r_[head[1:], seq.size] - 1
    return pl.DataFrame({"sequence_id": seq[head], "seq_token_start": start[head].astype(np.int32), "doc_id": doc[head],
                         "doc_token_start": ds[head], "n_tokens": np.add.reduceat(n, head).astype(np.int32), "eos_added": e[tail]})


@pytest.mark.parametrize("spec", [s for s in PACKING_SPECS if not s.startswith("best_fit")])
def test_kernels_give_the_reference_rows(spec):
    lengths, _, _, order = corpus(300, seed=5, hi=400)
    variant, atom = parse_packing(spec)
    for seed in (0, 1):
        got = pack(variant, order, lengths, L, atom_multiple=atom, seed=seed).segments
        assert got.equals(_reference_pack(variant, order, lengths, L, atom, seed)), (spec, seed)


def test_concat_in_chunks_on_every_thread_gives_the_reference_rows(monkeypatch):
    """concat packs chunks of documents on every core (each chunk's stream position and first
    piece from the chunks before it): with one document a chunk minimum, on 1 or 2 threads, the
    rows are the reference's, and a bad order is refused as before."""
    import numba
    from helpers import chunked_threads

    from pipeline import segments

    lengths, _, _, order = corpus(300, seed=6, hi=400)
    with chunked_threads(monkeypatch) as counts:
        for threads in counts:
            numba.set_num_threads(threads)
            assert segments.n_chunks(order.size) == 4 * threads
            for part in (order, order[: order.size // 3]):  # every document, and a subset (the tail dropped mid-document)
                assert pack("concat", part, lengths, L).segments.equals(_reference_pack("concat", part, lengths, L, None, 0))
    for bad, message in ((np.array([0, lengths.size]), "outside"), (np.array([3, 1, 3]), "repeats"), (np.array([-1, 3, 3]), "outside")):
        with pytest.raises(StrataInputError, match=message):
            pack_concat(bad, lengths, L)
    with pytest.raises(StrataInputError, match="empty token stream"):
        pack_concat(np.array([0, 1]), np.array([5, 0]), L)


def test_ids_by_key_is_a_stable_sort_on_every_thread(monkeypatch):
    """``ids_by_key`` (cluster_packed's order of the documents): the indices with a key, stably
    sorted by key, on 1 and 2 threads with one index a chunk minimum; empty and keyless inputs too."""
    import numba
    from helpers import chunked_threads

    from pipeline import segments

    rng = np.random.default_rng(11)
    with chunked_threads(monkeypatch) as counts:
        for threads in counts:
            numba.set_num_threads(threads)
            for n, k in ((0, 1), (1, 1), (5, 1), (40, 3), (1000, 9), (5000, 300)):
                key = rng.integers(-1, k, n)
                present = np.flatnonzero(key >= 0)
                want = present[np.argsort(key[present], kind="stable")]
                np.testing.assert_array_equal(segments.ids_by_key(key, k), want)
            np.testing.assert_array_equal(segments.ids_by_key(np.full(7, -1), 4), np.empty(0, np.int64))


@pytest.mark.parametrize("parts", [1, 2, 3, 5])
def test_stable_argsort_is_numpys_stable_argsort_in_any_number_of_parts(monkeypatch, parts):
    """``stable_argsort`` (the greedy's stratified stream) sorts a part a core and merges the parts:
    the same indices as NumPy's stable argsort, ties (equal floats, integers) kept in index order,
    for inputs cut into 1 to 5 parts of a few values each and left whole when small."""
    from pipeline import segments

    monkeypatch.setattr(segments, "MIN_SORT_PART", 3)
    monkeypatch.setattr(segments, "cores", lambda: parts)
    rng = np.random.default_rng(parts)
    for n in (0, 1, 2, 7, 16, 101, 1000):
        for values in (rng.random(n), rng.integers(0, 4, n).astype(np.float64), rng.integers(-3, 3, n), np.zeros(n)):
            np.testing.assert_array_equal(segments.stable_argsort(values), np.argsort(values, kind="stable"))


def _reference_conservation(seg: pl.DataFrame, lengths: np.ndarray, seq_len: int, gaps: bool) -> bool:
    by_doc = seg.sort("doc_id", "doc_token_start")
    d, ds, n = by_doc["doc_id"].to_numpy(), by_doc["doc_token_start"].to_numpy(), by_doc["n_tokens"].to_numpy().astype(np.int64)
    new = np.r_[True, d[1:] != d[:-1]]
    prev = np.r_[0, ds[:-1] + n[:-1]]
    starts = (ds >= np.where(new, 0, prev)) & (ds >= 0) if gaps else np.where(new, ds == 0, ds == prev)
    tiles = bool(starts.all() and (n > 0).all() and (ds + n <= lengths[d]).all())
    by_seq = seg.sort("sequence_id", "seq_token_start")
    sid, st = by_seq["sequence_id"].to_numpy(), by_seq["seq_token_start"].to_numpy().astype(np.int64)
    ext = by_seq["n_tokens"].to_numpy().astype(np.int64) + by_seq["eos_added"].to_numpy()
    new = np.r_[True, sid[1:] != sid[:-1]]
    fits = bool((st + ext <= seq_len).all() and np.where(new, st >= 0, st >= np.r_[0, st[:-1] + ext[:-1]]).all())
    per_doc = np.bincount(d, weights=n, minlength=lengths.size)
    return tiles and fits and bool((per_doc <= lengths).all())


def test_conservation_agrees_with_sorting_on_shuffled_and_broken_tables():
    lengths, _, _, order = corpus(200, seed=9)
    rng = np.random.default_rng(0)
    for spec in ("concat", "padding-x0.5", "concat-x2", "best_fit"):
        variant, atom = parse_packing(spec)
        seg = pack(variant, order, lengths, L, atom_multiple=atom, seed=2).segments
        shifted = seg.with_columns(doc_token_start=pl.when(pl.int_range(pl.len()) == 7).then(pl.col("doc_token_start") + 1)
                                   .otherwise(pl.col("doc_token_start")))
        for table in (seg, seg.sample(fraction=1.0, shuffle=True, seed=1), seg.filter(pl.int_range(pl.len()) != 3), shifted):
            for gaps in (False, True):
                got = conservation(table, lengths, L, gaps=gaps)["ok"]
                assert got == _reference_conservation(table, lengths, L, gaps), (spec, gaps)
        assert conservation(seg.sample(fraction=1.0, shuffle=True, seed=int(rng.integers(9))), lengths, L)["ok"]
    assert not conservation(shifted, lengths, L)["ok"]


def test_distinct_pairs_counts_each_document_once_per_sequence():
    from pipeline.packing.pack import distinct_pairs

    lengths, _, _, order = corpus(200, seed=4)
    seg = pack("padding", order, lengths, L, atom_multiple=0.25, seed=3).segments
    want = seg.select("sequence_id", "doc_id").unique().height
    assert distinct_pairs(seg["sequence_id"].to_numpy(), seg["doc_id"].to_numpy()) == want
    shuffled = seg.sample(fraction=1.0, shuffle=True, seed=0)  # not grouped by sequence: the sorting path
    assert distinct_pairs(shuffled["sequence_id"].to_numpy(), shuffled["doc_id"].to_numpy()) == want
    assert want < seg.height  # some document has two pieces in one sequence


@pytest.mark.parametrize("n_docs,seq_len,stretch", [(0, 64, 4), (1, 64, 4), (1000, 64, 7), (3000, 2048, 64)])
def test_a_streamed_packing_writes_the_whole_packings_rows(n_docs, seq_len, stretch, tmp_path, monkeypatch):
    """``pack_concat_file`` a stretch of documents at a time: the file holds the rows ``pack`` gives
    (the same frame), its report is ``packing_stats``', and ``conservation_file`` (a batch at a time)
    agrees with ``conservation`` on it, on a best-fit packing (rows out of document order: checked
    whole) and on files with a token doubled or a span moved."""
    import pipeline.packing.pack as packing

    rng = np.random.default_rng(n_docs)
    lengths = np.clip(rng.lognormal(4, 1.2, n_docs), 1, 5000).astype(np.int64)
    order = rng.permutation(n_docs)[: max(0, n_docs - 3)]
    whole = packing.pack("concat", order, lengths, seq_len)
    monkeypatch.setattr(packing, "STREAM_DOCS", stretch)
    _, report = packing.pack_concat_file(order, lengths, seq_len, tmp_path / "s.parquet")
    assert pl.read_parquet(tmp_path / "s.parquet").equals(whole.segments)
    assert report == packing.packing_stats(whole)
    held = np.where(np.isin(np.arange(n_docs), order), lengths, 0)
    assert packing.conservation_file(tmp_path / "s.parquet", held, seq_len) == packing.conservation(whole.segments, held, seq_len)
    assert packing.conservation(whole.segments, held, seq_len)["ok"]
    narrow = packing.narrow_lengths(lengths)  # as the stage gives them: 4 bytes a document, the same rows and counts
    assert narrow.dtype == np.int32
    _, again = packing.pack_concat_file(order, narrow, seq_len, tmp_path / "n.parquet")
    assert again == report and pl.read_parquet(tmp_path / "n.parquet").equals(whole.segments)
    assert packing.conservation_file(tmp_path / "n.parquet", packing.narrow_lengths(held), seq_len) == \
        packing.conservation(whole.segments, held, seq_len)
    best = packing.pack("best_fit", order, lengths, seq_len).segments
    best.write_parquet(tmp_path / "b.parquet")
    assert packing.conservation_file(tmp_path / "b.parquet", held, seq_len) == packing.conservation(best, held, seq_len)
    if whole.segments.height > 3:
        row = pl.int_range(pl.len())
        for name, bad in [("n_tokens", pl.col("n_tokens") + (row == 2).cast(pl.Int32)),
                          ("doc_token_start", pl.col("doc_token_start") + (row == 1).cast(pl.Int64))]:
            broken = whole.segments.with_columns(bad.alias(name))
            broken.write_parquet(tmp_path / "x.parquet")
            got = packing.conservation_file(tmp_path / "x.parquet", held, seq_len)
            assert got == packing.conservation(broken, held, seq_len) and not got["ok"]
