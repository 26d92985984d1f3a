"""A small data root holding what `strata export` and the ODM sampler read: tokens, document
offsets, the packing's segments and meta.json, clusters, a tokenizer (orderings are added by
the tests). Documents are grouped by cluster before packing, so most sequences hold one cluster."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.data.token_index import write_single_run
from pipeline.packing.pack import SequenceStore, pack
from pipeline.storage.layout import Layout

PAD, EOS, VOCAB = 0, 1, 64


def write_packing(root: Path, tokens: np.ndarray, offsets: np.ndarray, segments: pl.DataFrame, seq_len: int, packing: str) -> Layout:
    """A data root's token store, document offsets, segments and packing record: what an export reads of a packing."""
    layout = Layout(root)
    for d in ("tokens", "sequences", "orderings"):
        (root / d).mkdir(parents=True, exist_ok=True)
    write_single_run(tokens, layout.tokens)
    np.save(layout.doc_offsets, offsets)
    segments.write_parquet(layout.segments)
    layout.sequences_meta.write_text(json.dumps({"seq_len": seq_len, "packing": packing, "freeze_prefix": 0}))
    return layout


def cluster_tokens(rng: np.random.Generator, cluster: int, n: int) -> np.ndarray:
    """Cluster 0: uniform random tokens (its loss stays high); the others: one short pattern of
    their own repeated (learned within a few steps)."""
    if cluster == 0:
        return rng.integers(2, VOCAB, n)
    pattern = np.random.default_rng(100 + cluster).integers(2, VOCAB, 5)
    return np.resize(pattern, n)


def build_root(root: Path, seq_len: int, n_clusters: int = 3, docs_per_cluster: int = 30,
               seed: int = 0) -> tuple[pl.DataFrame, pl.DataFrame, SequenceStore]:
    """Write the data root; returns (documents table doc_id/cluster/n_tokens, segments, the store)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    rng = np.random.default_rng(seed)
    cluster = np.repeat(np.arange(n_clusters), docs_per_cluster)
    lengths = rng.integers(20, 90, cluster.size)  # stream lengths, EOS included
    tokens = np.concatenate([np.r_[cluster_tokens(rng, c, n - 1), EOS] for c, n in zip(cluster, lengths)]).astype(np.uint16)
    offsets = np.r_[0, np.cumsum(lengths)]
    segments = pack("concat", np.arange(cluster.size), lengths, seq_len, seed=seed).segments
    store = SequenceStore(tokens, offsets, segments, seq_len, pad_id=PAD)
    layout = write_packing(root, tokens, offsets, segments, seq_len, "concat")
    docs = pl.DataFrame({"doc_id": np.arange(cluster.size), "cluster": cluster, "n_tokens": lengths})
    docs.select("doc_id", "cluster").write_parquet(layout.clusters)
    vocab = {"<pad>": PAD, "<eos>": EOS, **{f"t{i}": i for i in range(2, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t2"))
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>").save_pretrained(str(layout.tokenizer))
    return docs, segments, store


def write_ordering(root: Path, strategy: str, sequence_ids: np.ndarray) -> None:
    pl.DataFrame({"position": np.arange(sequence_ids.size), "sequence_id": np.asarray(sequence_ids, dtype=np.int64)}).write_parquet(
        Layout(root).ordering(strategy))
