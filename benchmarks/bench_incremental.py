"""Incremental reruns: embedding (and tokenizing) N demo documents, then N + 1% new ones, with the hash cache.

Target (issue 6): the rerun after adding 1% new documents takes <= 10% of the full run's
embedding time. Usage::

    python benchmarks/bench_incremental.py [--n 3000] [--new 0.01] [--corpus PATH]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.offline import set_offline  # noqa: E402
from pipeline.storage.cache import HashCache, cached_embed, cached_tokenize, embedding_fingerprint, tokenizer_fingerprint  # noqa: E402
from pipeline.data.corpus import content_hashes  # noqa: E402
from pipeline.represent.embeddings import default_model_path, embed_texts  # noqa: E402
from pipeline.data.tokenizer import train_bpe  # noqa: E402
from pipeline.data.tokens import token_dtype, tokenize_documents  # noqa: E402

set_offline()
SHARED = Path(os.environ.get("STRATA_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))


def read_docs(path: Path, n: int) -> list[str]:
    texts = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            texts.append(json.loads(line)["text"])
            if len(texts) == n:
                break
    return texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--new", type=float, default=0.01, help="fraction of new documents in the rerun")
    ap.add_argument("--corpus", default=str(SHARED / "data" / "corpus" / "demo_corpus.jsonl.gz"))
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    n_new = max(1, round(args.n * args.new))
    texts = read_docs(Path(args.corpus), args.n + n_new)
    base, grown = texts[: args.n], texts
    hb, hg = content_hashes(pl.Series(base)).to_list(), content_hashes(pl.Series(grown)).to_list()
    model = default_model_path()
    fp = embedding_fingerprint(model, args.max_tokens, batch_size=64)
    print(f"documents: {args.n} + {n_new} new ({args.new:.1%}); model all-MiniLM-L6-v2, max_tokens {args.max_tokens}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")

    def embed(batch: list[str]) -> np.ndarray:
        return embed_texts(batch, model, args.max_tokens, 64, progress=False)

    with tempfile.TemporaryDirectory() as tmp:
        cache = HashCache(tmp, "embeddings", fp, np.float32, 384)
        t0 = time.perf_counter()
        full, computed = cached_embed(embed, base, hb, cache)
        t_full = time.perf_counter() - t0
        t0 = time.perf_counter()
        again, computed_re = cached_embed(embed, grown, hg, HashCache(tmp, "embeddings", fp, np.float32, 384))
        t_re = time.perf_counter() - t0
        t0 = time.perf_counter()
        embed(grown[args.n:])
        t_new_only = time.perf_counter() - t0
        assert computed == args.n and computed_re == n_new and np.array_equal(again[: args.n], full)
        print(f"embeddings  full run: {t_full:7.1f} s ({args.n / t_full:.0f} docs/s)")
        print(f"embeddings  rerun   : {t_re:7.1f} s = {t_re / t_full:.1%} of the full run "
              f"(embedding {n_new} new docs alone, incl. model load: {t_new_only:.1f} s; "
              f"cache overhead {max(0.0, t_re - t_new_only):.1f} s)  target <= 10%: {'met' if t_re <= 0.1 * t_full else 'NOT met'}")

        tok = train_bpe(base[:1000], 8192)
        tcache = HashCache(tmp, "tokens", tokenizer_fingerprint(tok), token_dtype(len(tok)))
        t0 = time.perf_counter()
        tokenize_documents(tok, grown, progress=False)
        t_tok_plain = time.perf_counter() - t0
        cached_tokenize(tok, base, hb, tcache)
        t0 = time.perf_counter()
        flat, off, n_tok = cached_tokenize(tok, grown, hg, HashCache(tmp, "tokens", tokenizer_fingerprint(tok), token_dtype(len(tok))))
        t_tok_re = time.perf_counter() - t0
        ref_flat, ref_off = tokenize_documents(tok, grown, progress=False)
        assert n_tok == n_new and np.array_equal(flat, ref_flat) and np.array_equal(off, ref_off)
        print(f"tokens      full    : {t_tok_plain:7.2f} s; rerun with cache {t_tok_re:.2f} s "
              f"({t_tok_re / t_tok_plain:.0%}; {int(ref_off[-1])} tokens, identical to a full tokenization)")


if __name__ == "__main__":
    main()
