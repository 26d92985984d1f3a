"""Near duplicates: MinHash signatures of each document's word-shingle set and LSH buckets
(datasketch), each candidate pair kept when its signatures estimate a Jaccard similarity of at
least the threshold. Streaming: each document is queried against the documents before it, then
inserted, so memory is the LSH index plus one signature a document, never all pairs."""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np

from pipeline.clean.ngrams import text_ngrams
from pipeline.heavy import lazy

datasketch = lazy("datasketch")  # imported on first use (pipeline/heavy.py)

_LOW32 = np.uint64(0xFFFFFFFF)  # datasketch's permutations take 32-bit hash values


def _identity(value: int) -> int:
    """The shingle hashes are hashes already: datasketch applies its permutations to them as they are."""
    return value


def signature_rows(texts: Sequence[str], num_perm: int, ngram: int, seed: int = 1) -> np.ndarray:
    """(len(texts), num_perm) uint32: the datasketch MinHash of each text's shingles (hashed word
    n-grams; a text shorter than ``ngram`` words is one shingle; an empty text's row is all
    ``EMPTY``, datasketch's empty signature)."""
    flat, offsets = text_ngrams(texts, ngram, short=True)
    low = (flat & _LOW32).tolist()
    sets = (low[offsets[i]:offsets[i + 1]] for i in range(len(texts)))
    out = np.empty((len(texts), int(num_perm)), np.uint32)
    for i, mh in enumerate(datasketch.MinHash.bulk(sets, num_perm=int(num_perm), seed=int(seed), hashfunc=_identity)):
        out[i] = mh.hashvalues
    return out


EMPTY = np.uint32(0xFFFFFFFF)  # datasketch's hash range maximum: every value of an empty signature


class NearIndex:
    """An LSH index of MinHash signatures that reports, as documents are added, the earlier
    documents each one nearly duplicates. ``lookup(key)`` gives an added document's signature
    back (for signatures stored elsewhere, e.g. memory-mapped files); without it the index keeps
    a copy of each."""

    def __init__(self, threshold: float, num_perm: int, ngram: int, seed: int = 1,
                 lookup: Callable[[int], np.ndarray] | None = None):
        self.threshold, self.num_perm, self.ngram, self.seed = float(threshold), int(num_perm), int(ngram), int(seed)
        self.lsh = datasketch.MinHashLSH(threshold=self.threshold, num_perm=self.num_perm)
        self._lookup = lookup
        self._scheme = datasketch.MinHash(num_perm=1, seed=self.seed).scheme  # what signature_rows' MinHash.bulk computes
        self._signatures: dict[int, np.ndarray] = {}
        self.candidates = 0  # LSH candidate pairs looked at

    def add(self, keys: Sequence[int], texts: Sequence[str]) -> np.ndarray:
        """Add documents ``keys`` (ints, unique) with their ``texts``: :meth:`add_signatures`."""
        return self.add_signatures(keys, signature_rows(texts, self.num_perm, self.ngram, self.seed))

    def add_signatures(self, keys: Sequence[int], signatures: np.ndarray) -> np.ndarray:
        """Add documents ``keys`` with their :func:`signature_rows`; the (k, 2) pairs (earlier key,
        key) whose estimated Jaccard similarity reaches the threshold. Empty signatures are skipped."""
        pairs: list[tuple[int, int]] = []
        for key, sig in zip(keys, np.asarray(signatures, np.uint32)):
            if (sig == EMPTY).all():
                continue
            mh = datasketch.LeanMinHash(seed=self.seed, hashvalues=sig.astype(np.uint64), scheme=self._scheme)
            for other in self.lsh.query(mh):
                self.candidates += 1
                theirs = self._lookup(other) if self._lookup is not None else self._signatures[other]
                if np.mean(theirs == sig) >= self.threshold:
                    pairs.append((int(other), int(key)))
            self.lsh.insert(int(key), mh, check_duplication=False)
            if self._lookup is None:
                self._signatures[int(key)] = sig.copy()
        return np.asarray(pairs, np.int64).reshape(-1, 2)


def near_pairs(batches: Iterable[tuple[Sequence[int], Sequence[str]]], threshold: float, num_perm: int, ngram: int,
               seed: int = 1) -> tuple[np.ndarray, int]:
    """Every near-duplicate pair among the documents of ``batches`` ((keys, texts) each) and the
    number of LSH candidates checked."""
    index = NearIndex(threshold, num_perm, ngram, seed)
    found = [index.add(keys, texts) for keys, texts in batches]
    return (np.concatenate(found) if found else np.zeros((0, 2), np.int64)), index.candidates
