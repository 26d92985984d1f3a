"""Near duplicates: MinHash signatures of each document's word-shingle set (datasketch's MinHash),
LSH buckets over bands of the signature, and each candidate pair kept when its signatures estimate
a Jaccard similarity of at least the threshold.

The banding is Strata's own (:func:`band_keys`, :func:`lsh_pairs`): ``num_perm // rows`` bands of
``rows`` values each (``dedup.near_rows``), one 64-bit key a band and document, the documents
sorted by key band by band. The bands and rows are chosen for recall at the threshold: a pair at
Jaccard ``s`` is a candidate with probability ``1 - (1 - s^rows)^bands``
(:func:`candidate_probability`), 0.974 at 0.8 for the config's 72 permutations in 12 bands of 6
rows, where datasketch's own choice for 64 permutations (5 bands of 11, which minimizes its
weighted false positives and negatives) gives 0.36. Memory is 8 bytes a document and band plus
one band's sort order, and the work is the candidate pairs; no pair is held but those found."""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np

from pipeline.clean.ngrams import _MULT, LONG_CHARS, long_text_ngrams, text_ngrams
from pipeline.heavy import lazy

datasketch = lazy("datasketch")  # imported on first use (pipeline/heavy.py)

_LOW32 = np.uint64(0xFFFFFFFF)  # datasketch's permutations take 32-bit hash values


def _identity(value: int) -> int:
    """The shingle hashes are hashes already: datasketch applies its permutations to them as they are."""
    return value


def signature_rows(texts: Sequence[str], num_perm: int, ngram: int, seed: int = 1, chunk: int | None = None,
                   limit: int | None = None) -> np.ndarray:
    """(len(texts), num_perm) uint32: the datasketch MinHash of each text's shingles (hashed word
    n-grams; a text shorter than ``ngram`` words is one shingle; an empty text's row is all
    ``EMPTY``, datasketch's empty signature).

    A text's shingles go into its MinHash ``chunk`` (:data:`SHINGLE_CHUNK`) at a time: the MinHash of
    a union is the elementwise minimum of the parts' MinHashes, so the signature is the same, and the
    permuted values held at once are ``chunk * num_perm`` however long the text (one 50 MB text has
    about 8.3M shingles: 4.8 GB of permuted values in one batch at 72 permutations). A text longer than
    ``limit`` characters (:data:`LONG_CHARS <pipeline.clean.ngrams.LONG_CHARS>`) is shingled piece by
    piece (:func:`pipeline.clean.ngrams.long_text_ngrams`), so its words are not all held at once either."""
    chunk, limit = int(chunk or SHINGLE_CHUNK), int(limit or LONG_CHARS)
    out = np.empty((len(texts), int(num_perm)), np.uint32)
    base = datasketch.MinHash(num_perm=int(num_perm), seed=int(seed), hashfunc=_identity)

    def fold(mh, shingles: list) -> None:
        for at in range(0, len(shingles), chunk):
            mh.update_batch(shingles[at:at + chunk])

    whole = [i for i, t in enumerate(texts) if len(t) <= limit]
    flat, offsets = text_ngrams([texts[i] for i in whole], ngram, short=True)
    low = (flat & _LOW32).tolist()  # texts of at most ``limit`` characters: what one batch always held
    for j, i in enumerate(whole):
        mh = base.copy()
        fold(mh, low[offsets[j]:offsets[j + 1]])
        out[i] = mh.hashvalues
    for i in sorted(set(range(len(texts))) - set(whole)):
        mh = base.copy()
        for shingles in long_text_ngrams(texts[i], ngram, short=True, limit=limit):
            fold(mh, (shingles & _LOW32).tolist())
        out[i] = mh.hashvalues
    return out


EMPTY = np.uint32(0xFFFFFFFF)  # datasketch's hash range maximum: every value of an empty signature
SHINGLE_CHUNK = 1 << 14  # shingles of one text permuted at a time (x num_perm x 8 bytes: 9.4 MB at 72)
CHUNK = 1 << 15  # candidate pairs whose signatures are compared at a time
ROWS = 6  # values per LSH band unless told (dedup.near_rows)


def candidate_probability(similarity: float | np.ndarray, bands: int, rows: int) -> float | np.ndarray:
    """The LSH S-curve: the chance that two documents of Jaccard similarity ``similarity`` share at
    least one of ``bands`` buckets of ``rows`` MinHash values each, ``1 - (1 - s^rows)^bands``."""
    return 1.0 - (1.0 - np.asarray(similarity, float) ** rows) ** bands


def band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(len(signatures), bands) uint64: one hash of each band's ``rows`` consecutive MinHash values
    (two documents share a band's bucket when its values are equal; a 64-bit hash collision only
    adds a candidate, which the signature comparison then rejects)."""
    sig = np.asarray(signatures, np.uint32)[:, :bands * rows].astype(np.uint64).reshape(len(signatures), bands, rows)
    acc = np.zeros((len(signatures), bands), np.uint64)
    with np.errstate(over="ignore"):
        for k in range(rows):
            acc = acc * _MULT + sig[:, :, k] + np.uint64(1)
    return acc


def lsh_pairs(keys: np.ndarray, keyed: np.ndarray, fetch: Callable[[np.ndarray], np.ndarray], threshold: float
              ) -> tuple[np.ndarray, int]:
    """Every pair of documents that shares a bucket in some band and whose signatures agree on at
    least ``threshold`` of their values, as (earlier key, later key) rows sorted, and the number of
    distinct candidate pairs compared. ``keys`` (m,): the documents, ascending; ``keyed`` (m, bands):
    their :func:`band_keys`; ``fetch(positions)`` gives the signatures of ``keys[positions]``.

    Band by band, the documents are sorted by bucket and each bucket's pairs are formed at distance
    1, 2, ... in that order, so the work is the candidate pairs and the memory one band's order and
    a chunk of pairs; a pair that already shared a bucket in an earlier band is not compared again."""
    keys, keyed = np.asarray(keys, np.int64), np.asarray(keyed, np.uint64)
    found: list[np.ndarray] = []
    candidates = 0
    for band in range(keyed.shape[1]):
        order = np.argsort(keyed[:, band], kind="stable")  # within a bucket, earlier documents first
        col = keyed[order, band]
        starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
        sizes = np.diff(np.r_[starts, col.size])
        end = np.repeat(starts + sizes, sizes)  # per sorted position: where its bucket ends
        live = np.flatnonzero(np.repeat(sizes, sizes) > 1)
        gap = 1
        while live.size:
            live = live[live + gap < end[live]]
            for at in range(0, live.size, CHUNK):
                pos = live[at:at + CHUNK]
                a, b = order[pos], order[pos + gap]
                if band:
                    a, b = (x[~(keyed[a, :band] == keyed[b, :band]).any(axis=1)] for x in (a, b))
                candidates += a.size
                if a.size:
                    same = (fetch(a) == fetch(b)).mean(axis=1) >= threshold
                    found.append(np.column_stack([keys[np.minimum(a, b)[same]], keys[np.maximum(a, b)[same]]]))
            gap += 1
    pairs = np.concatenate(found) if found else np.zeros((0, 2), np.int64)
    return (np.unique(pairs, axis=0) if pairs.size else pairs.reshape(0, 2)).astype(np.int64), candidates


def near_pairs(batches: Iterable[tuple[Sequence[int], Sequence[str]]], threshold: float, num_perm: int, ngram: int,
               seed: int = 1, rows: int = ROWS) -> tuple[np.ndarray, int]:
    """Every near-duplicate pair among the documents of ``batches`` ((keys, texts) each, keys
    ascending across batches) and the number of LSH candidates checked (bands of ``rows`` values)."""
    keys, sigs = [], []
    for k, texts in batches:
        keys.append(np.asarray(k, np.int64))
        sigs.append(signature_rows(texts, num_perm, ngram, seed))
    if not keys:
        return np.zeros((0, 2), np.int64), 0
    return signature_pairs(np.concatenate(keys), np.concatenate(sigs), threshold, rows)


def signature_pairs(keys: np.ndarray, signatures: np.ndarray, threshold: float, rows: int = ROWS) -> tuple[np.ndarray, int]:
    """:func:`lsh_pairs` of documents ``keys`` with their :func:`signature_rows` held in memory (empty
    signatures skipped), in ``num_perm // rows`` bands of ``rows`` values."""
    signatures = np.asarray(signatures, np.uint32)
    real = np.flatnonzero(~(signatures == EMPTY).all(axis=1))
    sig = signatures[real]
    return lsh_pairs(np.asarray(keys, np.int64)[real], band_keys(sig, signatures.shape[1] // rows, rows), lambda p: sig[p], threshold)
