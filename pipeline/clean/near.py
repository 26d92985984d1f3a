"""Near duplicates: MinHash signatures of each document's word-shingle set and LSH buckets
(datasketch), each candidate pair kept when its signatures estimate a Jaccard similarity of at
least the threshold. Streaming: each document is queried against the documents before it, then
inserted, so memory is the LSH index plus one signature a document, never all pairs."""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from pipeline.clean.ngrams import text_ngrams

_LOW32 = np.uint64(0xFFFFFFFF)  # datasketch's permutations take 32-bit hash values


def _identity(value: int) -> int:
    """The shingle hashes are hashes already: datasketch applies its permutations to them as they are."""
    return value


class NearIndex:
    """An LSH index of MinHash signatures that reports, as documents are added, the earlier
    documents each one nearly duplicates."""

    def __init__(self, threshold: float, num_perm: int, ngram: int, seed: int = 1):
        from datasketch import MinHashLSH

        self.threshold, self.num_perm, self.ngram, self.seed = float(threshold), int(num_perm), int(ngram), int(seed)
        self.lsh = MinHashLSH(threshold=self.threshold, num_perm=self.num_perm)
        self._signatures: list[np.ndarray] = []  # one (num_perm,) uint32 row an added document
        self._row: dict[int, int] = {}
        self.candidates = 0  # LSH candidate pairs looked at

    def signatures(self, texts: Sequence[str]) -> list:
        """The datasketch MinHash of each text's shingles (hashed word n-grams; a text shorter than
        ``ngram`` words is one shingle)."""
        from datasketch import MinHash

        flat, offsets = text_ngrams(texts, self.ngram, short=True)
        low = (flat & _LOW32).tolist()
        sets = (low[offsets[i]:offsets[i + 1]] for i in range(len(texts)))
        return MinHash.bulk(sets, num_perm=self.num_perm, seed=self.seed, hashfunc=_identity)

    def add(self, keys: Sequence[int], texts: Sequence[str]) -> np.ndarray:
        """Add documents ``keys`` (ints, unique) with their ``texts``; the (k, 2) pairs (earlier
        key, key) whose estimated Jaccard similarity reaches the threshold. Empty texts are skipped."""
        pairs: list[tuple[int, int]] = []
        for key, mh in zip(keys, self.signatures(texts)):
            if mh.is_empty():
                continue
            sig = mh.hashvalues.astype(np.uint32)
            for other in self.lsh.query(mh):
                self.candidates += 1
                if np.mean(self._signatures[self._row[other]] == sig) >= self.threshold:
                    pairs.append((int(other), int(key)))
            self.lsh.insert(int(key), mh, check_duplication=False)
            self._row[int(key)] = len(self._signatures)
            self._signatures.append(sig)
        return np.asarray(pairs, np.int64).reshape(-1, 2)


def near_pairs(batches: Iterable[tuple[Sequence[int], Sequence[str]]], threshold: float, num_perm: int, ngram: int,
               seed: int = 1) -> tuple[np.ndarray, int]:
    """Every near-duplicate pair among the documents of ``batches`` ((keys, texts) each) and the
    number of LSH candidates checked."""
    index = NearIndex(threshold, num_perm, ngram, seed)
    found = [index.add(keys, texts) for keys, texts in batches]
    return (np.concatenate(found) if found else np.zeros((0, 2), np.int64)), index.candidates
