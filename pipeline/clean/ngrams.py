"""Words and hashed word n-grams of texts, vectorized over a batch (polars for the words, NumPy for
the n-grams): what the near-duplicate shingles and the decontamination n-grams are made of."""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import polars as pl

from pipeline.data.text_pieces import PIECE_CHARS, pieces

WORD = r"\w+"  # a word: a run of letters, digits or underscores (punctuation and spacing never count)
_MULT = np.uint64(0x9E3779B97F4A7C15)  # odd multiplier of the polynomial n-gram hash (the golden ratio's 64 bits)
_HASH_SEED = 46  # polars' word hash seed: fixed, so the same words hash the same in every run
LONG_CHARS = PIECE_CHARS  # a text longer than this is read in pieces (:func:`long_text_ngrams`)


def word_hashes(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each text's lowercased words as 64-bit hashes, flat, and the offsets (len(texts) + 1) of each text's words."""
    words = pl.Series(list(texts), dtype=pl.String).str.to_lowercase().str.extract_all(WORD)
    counts = words.list.len().fill_null(0).to_numpy().astype(np.int64)
    offsets = np.zeros(counts.size + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    flat = words.explode().drop_nulls()  # an empty list explodes to one null
    return flat.hash(seed=_HASH_SEED).to_numpy().astype(np.uint64, copy=False), offsets


def ngram_hashes(words: np.ndarray, offsets: np.ndarray, n: int, short: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The 64-bit hashes of every run of ``n`` consecutive words inside one text (order-sensitive:
    sum of word_i * M^(n-1-i) modulo 2^64), flat, with their offsets per text. A text of fewer than
    ``n`` words gives none, or with ``short`` one hash of all its words (so short texts still shingle)."""
    counts = np.diff(offsets)
    total = words.size
    starts = np.zeros(0, np.int64)
    acc = np.zeros(0, np.uint64)
    if total >= n:
        m = total - n + 1
        acc = np.zeros(m, np.uint64)
        with np.errstate(over="ignore"):
            for k in range(n):
                acc = acc * _MULT + words[k:k + m]
        text_of = np.repeat(np.arange(counts.size), counts)[:m]
        starts = np.flatnonzero(np.arange(m) + n <= offsets[1:][text_of])
        acc = acc[starts]
    per_text = np.maximum(counts - n + 1, 0)
    if short:
        few = np.flatnonzero((counts > 0) & (counts < n))
        if few.size:
            extra = np.zeros(few.size, np.uint64)
            with np.errstate(over="ignore"):
                for j, t in enumerate(few):
                    h = np.uint64(0)
                    for w in words[offsets[t]:offsets[t + 1]]:
                        h = h * _MULT + w
                    extra[j] = h
            where = np.zeros(counts.size + 1, np.int64)
            np.cumsum(per_text, out=where[1:])
            acc = np.insert(acc, where[few], extra)  # each short text's one hash at its place
            per_text = per_text.copy()
            per_text[few] = 1
    out = np.zeros(counts.size + 1, np.int64)
    np.cumsum(per_text, out=out[1:])
    return acc, out


def text_ngrams(texts: Sequence[str], n: int, short: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """:func:`ngram_hashes` of :func:`word_hashes`."""
    words, offsets = word_hashes(texts)
    return ngram_hashes(words, offsets, n, short)


def long_text_ngrams(text: str, n: int, short: bool = False, limit: int = LONG_CHARS) -> Iterator[np.ndarray]:
    """:func:`ngram_hashes` of one text in consecutive arrays, read in :func:`pieces
    <pipeline.data.text_pieces.pieces>` of at most about ``limit`` characters, so the memory is a
    piece's words whatever the text's length. A piece ends just before whitespace that follows a
    non-whitespace character, so no word spans two pieces and a word's lowercasing does not depend
    on the cut; the last ``n - 1`` words of what came before lead the next piece's words, so every
    n-gram across a cut is made once. Concatenated, the arrays are the whole text's n-grams, in order."""
    carry = np.zeros(0, np.uint64)
    made = False
    for piece in pieces(text, limit):
        words = np.concatenate([carry, word_hashes([piece])[0]])
        if words.size >= n:
            yield ngram_hashes(words, np.array([0, words.size], np.int64), n)[0]
            made = True
        carry = words[max(words.size - (n - 1), 0):]  # under n words so far: all of them
    if short and not made and carry.size:
        yield ngram_hashes(carry, np.array([0, carry.size], np.int64), n, short=True)[0]
