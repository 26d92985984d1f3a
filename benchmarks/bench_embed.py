"""Embedding throughput (docs/s) at 256 tokens on real demo-corpus texts, and topic recovery.

    python benchmarks/bench_embed.py [--docs 20000 --forward-docs 2000] [--labels 5000]

Throughput: shallow (tokenizing, pooling and end to end; on a uniform sample and on long
documents that all reach the token limit), sentence and deep
(all-MiniLM-L6-v2 unless --model), side by side with sentence-transformers' own ``encode`` on the
same model and inputs when it is importable (``batch_size`` there is documents a batch; here it
caps a batch's tokens at ``batch_size * max_tokens``, so short documents share a batch).
Model loading is timed separately.
``--labels N``: ARI/NMI of each representation's spherical k-means clusters (k = number of labels
in the sample) against the corpus's ``domain`` and ``subdomain`` labels, on a seeded uniform
sample of N documents and on a domain-balanced sample.
Set STRATA_SHARED to the shared folder (default ../shared beside the repository). Like the
pipeline, it runs with TOKENIZERS_PARALLELISM=false (our tokenizing on a thread pool;
sentence-transformers' on one core) unless set; with TOKENIZERS_PARALLELISM=true both tokenize on
every core through the library.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.devices import device  # noqa: E402
from pipeline.represent import embeddings as E  # noqa: E402
from pipeline.represent.agreement import label_agreement  # noqa: E402
from pipeline.represent.clusters import kmeans  # noqa: E402

SHARED = Path(os.environ.get("STRATA_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))


def load_corpus() -> list[dict]:
    with gzip.open(SHARED / "data" / "corpus" / "demo_corpus.jsonl.gz", "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def shallow_row(label: str, texts: list[str], model: str, max_tokens: int, batch: int) -> None:
    path = E._model_dir(model)
    table, t_load = timed(E.load_embedding_matrix, path)
    backend, t_tok_load = timed(E._shallow_tokenizer, path)
    (ids, offsets), t_tok = timed(E.tokenize, backend, texts, max_tokens, False)
    _, t_pool = timed(E.embed_shallow_ids, table, ids, offsets)
    _, t_all = timed(E.embed, texts, "shallow", model, max_tokens, batch, None, False)
    n = len(texts)
    print(f"shallow, {label}: {n:,} docs, {offsets[-1] / n:.0f} tokens/doc; loading table {t_load:.2f} s + tokenizer {t_tok_load:.2f} s; "
          f"tokenize {n / t_tok:,.0f} docs/s ({offsets[-1] / t_tok / 1e6:.2f} M tokens/s); pooling {n / t_pool:,.0f} docs/s; "
          f"end to end incl. loading {n / t_all:,.0f} docs/s")


def reference_model(SentenceTransformer, path: Path, max_tokens: int):
    """sentence-transformers' model of ``path``: its own modules for a sentence-transformers
    directory; for a plain HF directory, Transformer + mean pooling like our ``sentence``/``deep``
    (sentence-transformers 6 would pick last-token pooling for a decoder-only model)."""
    if (path / "modules.json").is_file():
        st = SentenceTransformer(str(path), device=device())
        st.max_seq_length = min(st.max_seq_length or max_tokens, max_tokens)
        return st
    from sentence_transformers.models import Pooling, Transformer

    body = Transformer(str(path), max_seq_length=max_tokens)
    dim = int(body.auto_model.config.get_text_config().hidden_size)
    return SentenceTransformer(modules=[body, Pooling(dim, pooling_mode="mean")], device=device())


def throughput(texts_all: list[str], n_shallow: int, n_forward: int, model: str, max_tokens: int, batch: int) -> None:
    rng = np.random.default_rng(0)
    shallow_texts = [texts_all[i] for i in rng.choice(len(texts_all), n_shallow, replace=False)]
    fwd_texts = shallow_texts[:n_forward]
    path = E._model_dir(model)
    print(f"model {path}\nmax_tokens {max_tokens}, batch_size {batch}, device {device()}, "
          f"TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM', '(unset)')}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"shallow docs: {n_shallow} (mean {np.mean([len(t) for t in shallow_texts]):.0f} chars); forward docs: {n_forward}\n")
    E.embed(shallow_texts[:100], "shallow", model, max_tokens, batch, None, False)  # imports (torch, safetensors) not timed
    shallow_row("uniform sample", shallow_texts, model, max_tokens, batch)
    long_texts = [t for t in texts_all if len(t) >= 8 * max_tokens][:n_shallow]
    shallow_row(f"documents of >= {8 * max_tokens} chars", long_texts, model, max_tokens, batch)
    rows, speed = {}, {}
    for method in ("sentence", "deep"):
        E.embed(fwd_texts[:batch], method, model, max_tokens, batch, None, False)  # first load, CUDA init: not timed
        _, t_load = timed(E.embed, fwd_texts[:1], method, model, max_tokens, batch, None, False)
        emb, t = timed(E.embed, fwd_texts, method, model, max_tokens, batch, None, False)
        rows[method] = emb
        speed[method] = n_forward / max(t - t_load, 1e-9)
        print(f"{method}: {n_forward / t:,.1f} docs/s incl. model load ({t_load:.2f} s), "
              f"{n_forward / max(t - t_load, 1e-9):,.1f} docs/s net of it")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        print("sentence-transformers: unavailable (not importable); no side-by-side figure")
        return
    st = reference_model(SentenceTransformer, path, max_tokens)
    st.encode(fwd_texts[:batch], batch_size=batch)  # warm-up (CUDA kernels), not timed
    best = 0.0
    for b in sorted({8, 32, batch}):  # its own best batch size, not only ours
        ref, t_st = timed(st.encode, fwd_texts, batch_size=b, normalize_embeddings=True)
        best = max(best, n_forward / t_st)
        print(f"sentence-transformers encode, batch_size {b} (model already loaded): {n_forward / t_st:,.1f} docs/s; "
              f"max |ours - ST| = {np.abs(rows['sentence'] - ref).max():.2e}")
    print(f"sentence: {speed['sentence'] / best:.2f}x sentence-transformers at its best batch size (net of model load)")


def topic_recovery(docs: list[dict], n: int, model: str, max_tokens: int, batch: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    domains = np.array([d["domain"] for d in docs])
    uniform = np.sort(rng.choice(len(docs), n, replace=False))
    per = max(1, n // (2 * len(np.unique(domains))))
    balanced = np.sort(np.concatenate([rng.permutation(np.flatnonzero(domains == dom))[:per] for dom in np.unique(domains)]))
    for name, idx in (("uniform", uniform), ("domain-balanced", balanced)):
        texts = [docs[i]["text"] for i in idx]
        print(f"\n{name} sample: {idx.size} docs")
        print(f"{'representation':<16}{'label':<11}{'k':>5}{'ARI':>8}{'NMI':>8}")
        for method in ("shallow", "sentence", "deep"):
            emb = E.embed(texts, method, model, max_tokens, batch, None, False)
            for label in ("domain", "subdomain"):
                labels = np.array([docs[i][label] for i in idx])
                k = int(np.unique(labels).size)
                assign, _ = kmeans(emb, k, seed=seed, spherical=True)
                r = label_agreement(assign, labels)
                print(f"{method:<16}{label:<11}{k:>5}{r['ari']:>8.3f}{r['nmi']:>8.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=20000, help="documents for the shallow timing")
    ap.add_argument("--forward-docs", type=int, default=1000, help="documents for sentence/deep/ST timings")
    ap.add_argument("--model", default="", help="HF model dir (default all-MiniLM-L6-v2)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--labels", type=int, default=0, help="sample size for the ARI/NMI-vs-labels table (0 = skip)")
    ap.add_argument("--skip-throughput", action="store_true")
    args = ap.parse_args()
    docs = load_corpus()
    if not args.skip_throughput:
        throughput([d["text"] for d in docs], args.docs, args.forward_docs, args.model, args.max_tokens, args.batch_size)
    if args.labels:
        topic_recovery(docs, args.labels, args.model, args.max_tokens, args.batch_size)


if __name__ == "__main__":
    main()
