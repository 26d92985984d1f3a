"""Named sources with the same weights through megatron-core, OLMo-core and Strata's ``greedy_blend``.

Issue 45, item 4. One corpus: documents of 3-6 domains of the demo corpus
(``shared/data/corpus/demo_corpus.jsonl.gz``, its ``domain`` as the source), taken in file order
until each source holds its token quota (``--source-tokens``; a document's tokens = its
whitespace words + 1 for its EOS, as tests/test_blend.py counts them). Each source is packed on
its own (``pack_concat``, ``--seq-len`` tokens a sequence), so every packed sequence belongs to
one source: what a per-source dataset of Megatron or OLMo-core holds. Clusters are Strata's own:
``shallow`` embeddings of each document's first 64 tokens and k-means (``--k``), as a data root's
clusters are built; length bins are Strata's token-weighted quantile bins of document length
(``--length-bins``). The three schedulers get the same weights, the same schedule size
(``--budget`` x the corpus's tokens) and the same repetition cap (``--max-repetition`` for every
source), and return an order of the same packed sequences:

* **megatron-core** (``megatron.core.datasets``): each source's sequences written with its
  ``IndexedDatasetBuilder`` (one document of ``seq_len`` tokens per sequence, padding included, so
  one ``GPTDataset`` sample is one sequence: ``add_extra_token_to_sequence=False``), the blend
  built by its ``BlendedMegatronDatasetBuilder`` (``GPTDataset`` per source with its own shuffle
  and epochs, ``BlendedDataset`` with ``build_blending_indices``); the order is read back through
  the ``BlendedDataset`` sample by sample.
* **OLMo-core** (``olmo_core.data``): each source's sequences written as a raw token file (one
  EOS-terminated document of ``seq_len`` tokens per sequence), a ``SourceMixtureDatasetConfig``
  of one ``SourceMixtureConfig`` per source (``target_ratio``, ``max_repetition_ratio``) built by
  its ``NumpyFSLDatasetConfig.from_src_mix`` (its token allocation, its per-source instance
  sampling), then its ``NumpyFSLDataLoader`` with ``shuffle=True`` (its global shuffle); the order
  is read back through the loader's global indices and the dataset's instances.
* **Strata** ``greedy_blend`` (``pipeline/ordering/blend.py``) through ``run_strategy``.

The written tokens of a sequence are its id + 2 (0 pad, 1 EOS), so what a library returns names
the sequence. Per batch of ``--batch`` consecutive sequences (default: the config's batch_size),
the L1 distance of the batch's token shares from a reference, mean and worst over full batches:
sources against the weights; clusters and length bins against the scheduler's own whole-stream
shares (stationarity: the reweighting moves the global shares, the batches should not move from
them). Time to build: each library's index building from the written inputs (writing the inputs
and reading the order back not included), built twice in fresh folders: the second build is
reported (``first_build_seconds`` holds the first, with imports, numba's compilation where its
cache is cold, and the index files written); both orders must be equal.

    nice -n 15 python benchmarks/bench_mixture_anchors.py             # writes benchmarks/results/mixture_anchors.json
    nice -n 15 python benchmarks/bench_mixture_anchors.py --no-write  # print only
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gzip
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import polars as pl

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

DOMAINS = ("web", "code", "religious_text", "technical_docs", "quotes_humor")
SOURCE_TOKENS = (260_000, 300_000, 200_000, 300_000, 100_000)  # each source's quota: unequal, as real sources are
WEIGHTS = (0.30, 0.20, 0.15, 0.15, 0.20)  # quotes_humor (9% of the tokens) asked for 20%: repeated
PAD, EOS = 0, 1
RESULT = HERE / "results" / "mixture_anchors.json"
METHODS = ("megatron-core BlendedDataset", "OLMo-core source mixture + shuffle", "Strata greedy_blend")


def _fail(problem: str, fix: str) -> None:
    print(f"error: {problem}\nFix: {fix}", file=sys.stderr)
    sys.exit(2)


def corpus_path() -> Path:
    shared = Path(os.environ.get("STRATA_SHARED", REPO.parent / "shared"))
    return shared / "data" / "corpus" / "demo_corpus.jsonl.gz"


def load_sources(domains: tuple[str, ...], quotas: tuple[int, ...]) -> list[dict]:
    """Documents of each domain in file order until the domain holds its token quota."""
    path = corpus_path()
    if not path.is_file():
        _fail(f"the demo corpus is not at {path}", "set STRATA_SHARED to the folder holding data/corpus/")
    left = dict(zip(domains, quotas))
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            d = rec["domain"]
            if left.get(d, 0) > 0:
                n = len(rec["text"].split()) + 1
                out.append({"text": rec["text"], "source": d, "n_tokens": n})
                left[d] -= n
                if all(v <= 0 for v in left.values()):
                    break
    missing = [d for d in domains if left[d] == dict(zip(domains, quotas))[d]]
    if missing:
        _fail(f"the demo corpus holds no documents of the domains {missing}", "pass --domains among its domains (README of the data)")
    return out


@dataclasses.dataclass
class Corpus:
    """The benchmark's corpus: its documents, their per-source packing, and per sequence its tokens
    in each source, cluster and length bin."""

    docs: pl.DataFrame  # doc_id, cluster, n_tokens, source
    segments: pl.DataFrame  # the per-source packings (pipeline.packing SEGMENT_SCHEMA), sequence ids global
    seq_source: np.ndarray  # source index of each sequence
    by_source: np.ndarray  # (sequences x sources) tokens
    by_cluster: np.ndarray  # (sequences x clusters) tokens
    by_bin: np.ndarray  # (sequences x length bins) tokens
    names: list[str]


def build_corpus(recs: list[dict], domains: tuple[str, ...], seq_len: int, k: int, length_bins: int, seed: int) -> Corpus:
    import polars as pl

    from pipeline.ordering.features import length_bin_edges, length_bin_of
    from pipeline.packing.pack import pack_concat
    from pipeline.represent.clusters import kmeans
    from pipeline.represent.embeddings import embed

    n = len(recs)
    ntok = np.array([r["n_tokens"] for r in recs], dtype=np.int64)
    names = sorted(domains)
    src = np.searchsorted(names, [r["source"] for r in recs])
    emb = embed([r["text"] for r in recs], "shallow", max_tokens=64, progress=False)
    cluster, _ = kmeans(emb, k, seed=seed)
    parts, base = [], 0
    rng = np.random.default_rng(seed)
    for g in range(len(names)):
        ids = np.flatnonzero(src == g)
        seg = pack_concat(ids[rng.permutation(ids.size)], ntok, seq_len).segments
        parts.append(seg.with_columns(pl.col("sequence_id") + base))
        base += int(seg["sequence_id"].max()) + 1
    segments = pl.concat(parts)
    docs = pl.DataFrame({"doc_id": np.arange(n), "cluster": cluster.astype(np.int64), "n_tokens": ntok,
                         "source": [r["source"] for r in recs]})
    sid, did, tok = (segments[c].to_numpy() for c in ("sequence_id", "doc_id", "n_tokens"))
    doc_bin = length_bin_of(ntok, length_bin_edges(ntok, length_bins, "tokens"))

    def matrix(code: np.ndarray, width: int) -> np.ndarray:
        m = np.zeros((base, width))
        np.add.at(m, (sid, code[did]), tok)
        return m

    by_source = matrix(src, len(names))
    return Corpus(docs, segments, by_source.argmax(axis=1), by_source, matrix(cluster.astype(np.int64), k),
                  matrix(doc_bin, int(doc_bin.max()) + 1), names)


def batch_deviation(order: np.ndarray, tokens_by: np.ndarray, batch: int, target: np.ndarray | None = None) -> tuple[float, float]:
    """Mean and worst over the full batches of ``batch`` consecutive positions of ``order`` of the
    L1 distance between the batch's token shares (rows of ``tokens_by``: a sequence's tokens in
    each column) and ``target``; without ``target``, the order's own shares over all its positions."""
    n = order.size // batch
    if n == 0:
        raise ValueError(f"the order holds {order.size} positions, fewer than one batch of {batch}")
    t = tokens_by[order[: n * batch]].reshape(n, batch, -1).sum(axis=1)
    share = t / np.maximum(t.sum(axis=1, keepdims=True), 1e-300)
    ref = tokens_by[order].sum(axis=0) if target is None else np.asarray(target, dtype=np.float64)
    ref = ref / ref.sum()
    d = np.abs(share - ref).sum(axis=1)
    return float(d.mean()), float(d.max())


def source_sequences(c: Corpus) -> list[np.ndarray]:
    """Per source, its sequence ids in packing order (the per-source dataset's contents)."""
    return [np.flatnonzero(c.seq_source == g) for g in range(len(c.names))]


def megatron_order(c: Corpus, weights: np.ndarray, n_samples: int, seq_len: int, seed: int, work: Path) -> tuple[np.ndarray, float]:
    """The blend of megatron-core's ``BlendedMegatronDatasetBuilder`` over one ``GPTDataset`` per source."""
    import torch
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from megatron.core.tokenizers import MegatronTokenizer
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    prefixes = []
    for g, ids in enumerate(source_sequences(c)):
        prefix = str(work / f"megatron_{c.names[g]}")
        builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
        for s in ids:
            builder.add_item(torch.full((seq_len,), int(s) + 2, dtype=torch.int32))
            builder.end_document()
        builder.finalize(prefix + ".idx")
        prefixes.append(prefix)
    tok_dir = work / "tokenizer"
    vocab = {"<pad>": PAD, "<eos>": EOS, "a": 2}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="a")), pad_token="<pad>",
                            eos_token="<eos>").save_pretrained(str(tok_dir))
    tokenizer = MegatronTokenizer.from_pretrained(str(tok_dir), metadata_path={"library": "huggingface"})
    # no path_to_cache: BlendedDataset's cached build asks torch.distributed for the rank, and this
    # process has no process group; without it the same indices are built in memory
    config = GPTDatasetConfig(random_seed=seed, sequence_length=seq_len, blend=(prefixes, [float(w) for w in weights]),
                              split="100,0,0", path_to_cache=None, tokenizer=tokenizer,
                              create_attention_mask=False, reset_position_ids=False, reset_attention_mask=False,
                              eod_mask_loss=False, add_extra_token_to_sequence=False)
    t0 = time.perf_counter()
    blended = BlendedMegatronDatasetBuilder(GPTDataset, [n_samples, 0, 0], lambda: True, config).build()[0]
    seconds = time.perf_counter() - t0
    order = np.empty(len(blended), dtype=np.int64)
    for i in range(len(blended)):
        tokens = blended[i]["tokens"].numpy()
        if not (tokens == tokens[0]).all():
            raise RuntimeError(f"Megatron sample {i} spans two sequences: the per-source datasets were not one sample a sequence")
        order[i] = int(tokens[0]) - 2
    return order, seconds


def olmo_order(c: Corpus, weights: np.ndarray, requested_tokens: int, batch: int, max_repetition: float, seq_len: int, seed: int,
               work: Path) -> tuple[np.ndarray, float]:
    """OLMo-core's source mixture (``SourceMixtureDatasetConfig``) and its data loader's global shuffle."""
    from olmo_core.data import DataCollator, NumpyFSLDataLoader, NumpyFSLDatasetConfig, TokenizerConfig
    from olmo_core.data.source_mixture import SourceMixtureConfig, SourceMixtureDatasetConfig, SourceMixtureList

    n_seq = c.seq_source.size
    sources = []
    for g, ids in enumerate(source_sequences(c)):
        path = work / f"olmo_{c.names[g]}.npy"
        rows = np.repeat(ids.astype(np.uint32) + 2, seq_len).reshape(-1, seq_len)
        rows[:, -1] = EOS  # one EOS-terminated document of seq_len tokens a sequence: one instance
        rows.tofile(path)
        sources.append(SourceMixtureConfig(source_name=c.names[g], target_ratio=float(weights[g]), paths=[str(path)],
                                           max_repetition_ratio=float(max_repetition)))
    mix = SourceMixtureDatasetConfig(source_list=SourceMixtureList(sources=sources), requested_tokens=int(requested_tokens),
                                     global_batch_size=batch * seq_len, seed=seed, render_tables=False, quiet=True)
    tokenizer = TokenizerConfig(vocab_size=n_seq + 2, eos_token_id=EOS, pad_token_id=PAD)
    t0 = time.perf_counter()
    dataset = NumpyFSLDatasetConfig.from_src_mix(mix, sequence_length=seq_len, tokenizer=tokenizer, dtype="uint32",
                                                 work_dir=str(work / "olmo_work"), include_instance_metadata=False).build()
    dataset.prepare()
    loader = NumpyFSLDataLoader(dataset, collator=DataCollator(pad_token_id=PAD), global_batch_size=batch * seq_len,
                                work_dir=str(work / "olmo_work"), shuffle=True, seed=seed, dp_world_size=1, dp_rank=0)
    loader.reshuffle(epoch=1)
    indices = np.asarray(loader.get_global_indices())[: loader.total_size]
    seconds = time.perf_counter() - t0
    order = np.empty(indices.size, dtype=np.int64)
    for p, i in enumerate(indices):
        ids = dataset[int(i)]["input_ids"].numpy()
        if ids[-1] != EOS or not (ids[:-1] == ids[0]).all():
            raise RuntimeError(f"OLMo-core instance {i} is not one written sequence")
        order[p] = int(ids[0]) - 2
    return order, seconds


def strata_order(c: Corpus, weights: np.ndarray, budget_tokens: int, batch: int, max_repetition: float, seq_len: int,
                 length_bins: int, seed: int) -> tuple[np.ndarray, float]:
    """``greedy_blend`` of the same packing with the same weights, budget and cap."""
    from pipeline.config import StrataConfig
    from pipeline.ordering.engine import OrderParams, run_strategy

    copies = int(np.ceil(max_repetition))
    cfg = StrataConfig(length_bins=length_bins, batch_size=batch, seq_len=seq_len, mixture_budget_tokens=int(budget_tokens),
                       max_sequence_copies=copies,
                       mixture={"weights": dict(zip(c.names, map(float, weights))),
                                "max_repetition": {n: float(max_repetition) for n in c.names}})
    params = OrderParams.from_config(cfg)
    t0 = time.perf_counter()
    result = run_strategy("greedy_blend", c.docs, c.segments, seq_len, params, seed=seed)
    seconds = time.perf_counter() - t0
    return result.order["sequence_id"].to_numpy().astype(np.int64), seconds


def source_floor(weights: np.ndarray, batch: int) -> float:
    """The least L1 distance from ``weights`` that shares of ``batch`` whole sequences can have
    (largest remainders; sequences of equal tokens): no scheduler's per-batch source deviation
    averages below it."""
    want = np.asarray(weights, dtype=np.float64) * batch
    got = np.floor(want)
    got[np.argsort(-(want - got), kind="stable")[: int(round(batch - got.sum()))]] += 1
    return float(np.abs(got - want).sum() / batch)


def measure(order: np.ndarray, c: Corpus, weights: np.ndarray, batches: list[int], seconds: float) -> dict:
    """The row of one scheduler: per batch size the per-batch deviations; whole-stream source
    shares; per source its sequences, positions, distinct and repeated sequences; time to build."""
    total = c.by_source[order].sum(axis=0)
    per_batch = {}
    for b in batches:
        src, cl, bins = (batch_deviation(order, c.by_source, b, weights), batch_deviation(order, c.by_cluster, b),
                         batch_deviation(order, c.by_bin, b))
        per_batch[str(b)] = {"batches": int(order.size // b), "source_dev_mean": src[0], "source_dev_max": src[1],
                             "cluster_dev_mean": cl[0], "cluster_dev_max": cl[1], "bin_dev_mean": bins[0], "bin_dev_max": bins[1]}
    copies = np.bincount(order, minlength=c.seq_source.size)
    uses = {n: {"sequences": int((c.seq_source == g).sum()), "positions": int(copies[c.seq_source == g].sum()),
                "distinct": int((copies[c.seq_source == g] > 0).sum()), "repeated": int((copies[c.seq_source == g] > 1).sum())}
            for g, n in enumerate(c.names)}
    return {"positions": int(order.size), "tokens": int(total.sum()), "distinct_sequences": int(np.unique(order).size),
            "max_copies": int(copies.max()), "uses_by_source": uses,
            "stream_source_shares": dict(zip(c.names, (total / total.sum()).round(5).tolist())),
            "build_seconds": seconds, "per_batch": per_batch}


def main(argv: list[str] | None = None) -> int:
    from bench_order import _commit, _machine
    from tables import mixture_anchors

    from pipeline.config import StrataConfig

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--domains", default=",".join(DOMAINS), help="3-6 demo corpus domains, the sources")
    ap.add_argument("--source-tokens", default=",".join(map(str, SOURCE_TOKENS)), help="each source's token quota")
    ap.add_argument("--weights", default=",".join(map(str, WEIGHTS)), help="each source's target share of the tokens")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", default=f"{StrataConfig().batch_size},{4 * StrataConfig().batch_size}",
                    help="sequences a batch, one or more (default: the config's batch_size and 4x it); the first is OLMo-core's")
    ap.add_argument("--k", type=int, default=32, help="k-means clusters")
    ap.add_argument("--length-bins", type=int, default=8)
    ap.add_argument("--budget", type=float, default=1.0, help="schedule tokens as a multiple of the corpus's tokens")
    ap.add_argument("--max-repetition", type=float, default=3.0, help="every source's repetition cap")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    batches = [int(x) for x in str(a.batch).split(",")]
    domains = tuple(a.domains.split(","))
    quotas = tuple(int(x) for x in a.source_tokens.split(","))
    given = [float(x) for x in a.weights.split(",")]
    if not 3 <= len(domains) <= 6 or len(quotas) != len(domains) or len(given) != len(domains):
        _fail("--domains, --source-tokens and --weights disagree", "give 3-6 --domains and as many --source-tokens and --weights")
    logging.disable(logging.WARNING)
    machine = _machine()
    rev, dirty = _commit()
    t0 = time.perf_counter()
    recs = load_sources(domains, quotas)
    c = build_corpus(recs, domains, a.seq_len, a.k, a.length_bins, a.seed)
    prep = time.perf_counter() - t0
    weights = np.array([dict(zip(domains, given))[n] for n in c.names])
    weights = weights / weights.sum()
    corpus_tokens = int(c.by_source.sum())
    budget = int(a.budget * corpus_tokens)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="mixture_anchors_") as tmp:
        work = Path(tmp)
        builds = {
            METHODS[0]: lambda w: megatron_order(c, weights, -(-budget // a.seq_len), a.seq_len, a.seed, w),
            METHODS[1]: lambda w: olmo_order(c, weights, budget, batches[0], a.max_repetition, a.seq_len, a.seed, w),
            METHODS[2]: lambda w: strata_order(c, weights, budget, batches[0], a.max_repetition, a.seq_len, a.length_bins, a.seed),
        }
        for name, build in builds.items():
            (work / f"{name}.first").mkdir()
            (work / f"{name}.again").mkdir()
            order, first = build(work / f"{name}.first")
            again, s = build(work / f"{name}.again")
            if not np.array_equal(order, again):
                raise RuntimeError(f"{name}: two builds from the same inputs and seed gave different orders")
            runs[name] = {**measure(order, c, weights, batches, s), "first_build_seconds": first}
    corpus_shares = c.by_source.sum(axis=0) / corpus_tokens
    doc = {"benchmark": "benchmarks/bench_mixture_anchors.py", "commit": rev, "dirty_files": dirty,
           "date": datetime.date.today().isoformat(), "machine": machine,
           "loadavg_at_end": os.getloadavg()[0],
           "versions": {m: _version(m) for m in ("megatron-core", "ai2-olmo-core", "torch")},
           "sources": {n: {"weight": float(w), "corpus_share": float(s), "documents": int((c.docs["source"] == n).sum()),
                           "sequences": int((c.seq_source == g).sum())}
                       for g, (n, w, s) in enumerate(zip(c.names, weights, corpus_shares))},
           "documents": int(c.docs.height), "sequences": int(c.seq_source.size), "corpus_tokens": corpus_tokens,
           "schedule_tokens": budget, "seq_len": a.seq_len, "batches": batches,
           "source_floor": {str(b): source_floor(weights, b) for b in batches}, "k": a.k, "length_bins": a.length_bins,
           "max_repetition": a.max_repetition, "seed": a.seed, "prep_seconds": prep, "methods": {m: runs[m] for m in METHODS}}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / RESULT.name).write_text(json.dumps(doc))
        print(mixture_anchors(Path(tmp)))
    if not a.no_write:
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {RESULT.relative_to(REPO)}")
    return 0


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    sys.exit(main())
