"""What the claims read from a data root (``pipeline.claims.measure.ClaimData``), gathered in one place.

- The ordering claims of Don't Shuffle, Optimize compare the materialized ``greedy`` ordering of the
  base packing, whole (every position of ``orderings/greedy.parquet``: nothing is sampled or cut),
  with ``claims.shuffles`` fresh ``random`` orderings of the same packing (seeds ``seed``,
  ``seed + 1``, ...; each a permutation of every sequence), on the clusters and length bins the
  diagnostics use.
- Diversity-ordered training's table is rebuilt at ``claims.k`` clusters (k-means on the stored
  embeddings with the configured k-means settings; the pipeline's clusters when ``claims.k`` is 0
  or k): ``original`` is the corpus's own document order packed by concat (the order the paper
  starts from), ``round_robin``, ``stratified`` and ``bin_packing`` as the strategies compute them,
  and ``random`` and ``greedy`` beside them.
- The gradient claims read the ``stable_rank`` and ``fidelity`` tables; the claims' own runs read
  ``claim_runs_log``, ``claim_runs_heldout``, ``claim_runs_sequences`` and ``claim_runs_arms``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from pipeline.claims.measure import ClaimData
from pipeline.errors import StrataInputError
from pipeline.ordering import OrderParams, run_strategy
from pipeline.packing.pack import pack_concat
from pipeline.reports import diagnostics as D
from pipeline.represent.clusters import diversity_clusters
from pipeline.represent.embedding_index import has_embeddings
from pipeline.storage.documents import document_features
from pipeline.storage.layout import Layout, Store


def diversity_schedules(docs: pl.DataFrame, cluster: np.ndarray, segments: pl.DataFrame, seq_len: int, params: OrderParams,
                        seed: int, edges: np.ndarray) -> dict[str, D.Schedule]:
    """Diversity-ordered training's strategies (and random, greedy) on ``cluster``: {name: Schedule}."""
    lengths = docs["stream_length"].to_numpy()
    frame = docs.select("doc_id", n_tokens="stream_length").with_columns(cluster=pl.Series(cluster))
    out: dict[str, D.Schedule] = {}
    original = pack_concat(docs["doc_id"].to_numpy(), lengths, seq_len).segments
    out["original"] = D.prepare(original, np.unique(original["sequence_id"].to_numpy()), cluster, lengths, bin_edges=edges)
    for name in ("round_robin", "stratified", "bin_packing", "random", "greedy"):
        res = run_strategy(name, frame, segments, seq_len, params, seed)
        seg = res.segments if res.segments is not None else segments
        out[name] = D.prepare(seg, res.order, cluster, lengths, bin_edges=edges)
    return out


def permutation_positions(order: pl.DataFrame | np.ndarray, n_sequences: int) -> np.ndarray:
    """The position of each of ``n_sequences`` sequences in ``order`` (an ordering frame
    ``position, sequence_id`` or the ids in training order), which must hold every one exactly
    once (a shuffle of the whole packing, not a sample of it)."""
    order = D.ordering_ids(order)
    position = np.full(n_sequences, -1, dtype=np.int64)
    if order.size == n_sequences and n_sequences and order.min() >= 0 and order.max() < n_sequences:
        position[order] = np.arange(n_sequences, dtype=np.int64)
    if order.size != n_sequences or (position < 0).any():
        raise StrataInputError(f"a random shuffle orders {order.size} ids, not each of the {n_sequences} sequences once",
                               fix="shuffle the whole packing the greedy ordering orders")
    return position


def claim_data(layout: Layout, cfg, params: OrderParams, read_table: Callable[[str], pl.DataFrame | None],
               out_dir: Path, log: Callable[[str], None] = print) -> ClaimData:
    """Everything the registered claims need that this data root has (see the module docstring)."""
    data = ClaimData(out_dir=out_dir, batch_size=cfg.batch_size, n_boot=cfg.bootstrap_samples, seed=cfg.seed, table=read_table,
                     prefix=cfg.max_steps * cfg.batch_size)
    have_base = layout.documents.exists() and layout.clusters.exists() and layout.segments.exists()
    if have_base:
        docs = document_features(layout)
        segments = pl.read_parquet(layout.segments)
        lengths = docs["stream_length"].to_numpy()
        edges = D.length_bin_edges(lengths, cfg.length_bins)
        cluster = docs["cluster"].to_numpy()
        frame = docs.select("doc_id", "cluster", n_tokens="stream_length")
        if layout.ordering("greedy").exists():
            greedy = Store(layout).ordering("greedy")  # every position of the stored ordering, with the packing it orders
            packing = greedy.segments if greedy.repacked else segments
            data.schedule = D.prepare(packing, greedy.order, cluster, lengths, bin_edges=edges, doc_source=docs["source"])
            log(f"ordering claims: greedy's whole ordering ({data.schedule.n_sequences:,} sequences) vs "
                f"{cfg.claims_shuffles} random shuffles of the same sequences")
            data.random_positions = [
                permutation_positions(run_strategy("random", frame, packing, cfg.seq_len, params, cfg.seed + i).order,
                                      data.schedule.n_sequences)
                for i in range(cfg.claims_shuffles)
            ]
        if has_embeddings(layout) or (cfg.claims_k or cfg.k) == cfg.k:
            k_cluster, k = diversity_clusters(layout, cfg, docs)
            log(f"Diversity-ordered training's table at k={k}")
            data.diversity = diversity_schedules(docs, k_cluster, segments, cfg.seq_len, params, cfg.seed, edges)
            data.diversity_k = k
    ranks = read_table("stable_rank")
    if ranks is not None:
        data.stable_rank = ranks.filter(pl.col("strategy").is_in(["greedy", "random"]) & pl.col("seed").is_in(cfg.seeds))
    fid = read_table("fidelity")
    if fid is not None and fid.height:
        for strategy in ("greedy", "random"):
            f = fid.filter(pl.col("strategy") == strategy)
            if f.height:
                n = int(f["chunk_i"].max()) + 1
                m = np.zeros((n, n))
                m[f["chunk_i"].to_numpy(), f["chunk_j"].to_numpy()] = f["cosine"].to_numpy()
                data.fidelity[strategy] = m
    data.claim_log = read_table("claim_runs_log")
    data.claim_heldout = read_table("claim_runs_heldout")
    data.claim_arms = read_table("claim_runs_arms")
    data.claim_sequences = read_table("claim_runs_sequences")
    return data
