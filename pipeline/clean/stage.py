"""The clean stage (``clean``): every training document checked for exact, near and semantic
duplicates and for n-gram overlap with the evaluation sets, in one pass over the texts in doc_id
order (cross-shard by construction: a document is a duplicate of any earlier one, whichever shard
holds it), then SemDeDup over the clusters. Writes ``clean/documents.parquet`` (what
:func:`removed_documents` reads for the packing and the orderings) and DuckDB ``duplicates``,
``contamination`` and ``clean_removed``."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import polars as pl

from pipeline.stage import Connect, Markdown, StageResult

BATCH = 4096  # documents a batch of the text pass


def clean_file(layout) -> Path:
    """The clean stage's per-document table."""
    return layout.inside("clean", "documents.parquet")


def _text_batches(layout) -> Iterator[tuple[np.ndarray, list[str]]]:
    """(doc ids, texts) of every training document in doc_id order, BATCH at a time."""
    from pipeline.data.shard_docs import chosen_texts

    texts = chosen_texts(layout.corpus, pl.read_parquet(layout.shards), layout.shard_dir("corpus"), lambda n: None)
    start, batch = 0, []
    for text in texts:
        batch.append(text)
        if len(batch) == BATCH:
            yield np.arange(start, start + len(batch), dtype=np.int64), batch
            start, batch = start + len(batch), []
    if batch:
        yield np.arange(start, start + len(batch), dtype=np.int64), batch


def scan_texts(layout, cfg, sets: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, tuple[str, ...], tuple[int, ...]]:
    """One pass over the texts: each document's exact representative (the first document with its
    normalized text), the near pairs among the representatives, the contamination counts
    (documents x sets: distinct n-grams shared, boilerplate left out) and the LSH candidates
    checked; the set names and the n-grams left out of each as boilerplate."""
    from pipeline.clean.decontam import EvalNgrams, common_grams
    from pipeline.clean.exact import text_hashes
    from pipeline.clean.near import NearIndex

    d = cfg.dedup
    evals = EvalNgrams.build(sets, cfg.decontam.ngram, common_share=cfg.decontam.common_share) \
        if cfg.decontam.enabled and sets else None
    near = NearIndex(d.near_threshold, d.near_num_perm, d.near_ngram, seed=cfg.seed + 1) if d.enabled and d.near else None
    seen: dict[int, int] = {}
    reps, pairs, hits = [], [], {}
    for ids, texts in _text_batches(layout):
        rep = ids.copy()
        if d.enabled and d.exact:
            for i, h in enumerate(text_hashes(texts).tolist()):
                rep[i] = seen.setdefault(h, int(ids[i]))
        reps.append(rep)
        if near is not None:
            first = np.flatnonzero(rep == ids)
            pairs.append(near.add(ids[first].tolist(), [texts[i] for i in first]))
        if evals is not None:
            for j, found in enumerate(evals.hits(texts)):
                found[:, 0] = ids[found[:, 0]]
                hits.setdefault(j, []).append(found)
    n = int(sum(r.size for r in reps))
    names = evals.names if evals is not None else ()
    counts, common = np.zeros((n, len(names)), np.int64), list(evals.common if evals is not None else ())
    for j in range(len(names)):
        found = np.concatenate(hits[j]) if hits.get(j) else np.zeros((0, 2), np.int64)
        boiler = common_grams(found, evals.hashes[j].size, n, cfg.decontam.common_share)
        common[j] += int(boiler.sum())
        kept = found[~boiler[found[:, 1]]]
        counts[:, j] = np.bincount(kept[:, 0], minlength=n)  # distinct shared n-grams per document
    return (np.concatenate(reps) if reps else np.zeros(0, np.int64),
            np.concatenate(pairs) if pairs else np.zeros((0, 2), np.int64),
            counts, near.candidates if near is not None else 0, names, tuple(common))


def semantic_candidates(layout, cfg, survivors: np.ndarray) -> tuple[np.ndarray, int]:
    """SemDeDup pairs among ``survivors`` (sorted doc ids) within their k-means clusters, and the
    largest cluster searched."""
    from pipeline.clean.semantic import semantic_pairs
    from pipeline.represent.embedding_index import open_embeddings

    cluster = pl.read_parquet(layout.clusters, columns=["doc_id", "cluster"]).sort("doc_id")["cluster"].to_numpy()
    return semantic_pairs(open_embeddings(layout).take, cluster, survivors, cfg.dedup.semantic_threshold)


def clean_documents(layout, cfg, connect: Connect) -> StageResult:
    """Exact (normalized-text hash), near (MinHash + LSH over word ``dedup.near_ngram``-grams,
    ``dedup.near_threshold``) and semantic (within each cluster, cosine above
    ``dedup.semantic_threshold``) duplicates, each level over the previous level's representatives;
    ``decontam.ngram``-gram overlap with every configured evaluation set and the held-out split.
    ``dedup.action`` and ``decontam.action`` decide who leaves training (``removed``)."""
    from pipeline.clean.decontam import eval_sets
    from pipeline.clean.groups import components
    from pipeline.clean.plan import REASONS, plan
    from pipeline.reports.markdown import frame_table
    from pipeline.storage.atomic import write_parquet
    from pipeline.storage.warehouse import replace_rows

    sets = eval_sets(cfg, layout.heldout)
    exact_rep, near, counts, candidates, names, common = scan_texts(layout, cfg, sets)
    n = exact_rep.size
    semantic, largest = np.zeros((0, 2), np.int64), 0
    if cfg.dedup.enabled and cfg.dedup.semantic and n:
        near_rep = components(n, near)[exact_rep]
        semantic, largest = semantic_candidates(layout, cfg, np.flatnonzero(near_rep == np.arange(n)))
    flags = counts >= cfg.decontam.min_overlap
    table = plan(n, exact_rep, near, semantic, flags, names, cfg.dedup.action, cfg.decontam.action == "drop")
    docs = pl.read_parquet(layout.documents, columns=["doc_id", "source"]).sort("doc_id")
    stream = np.diff(np.load(layout.doc_offsets, allow_pickle=False))
    clusters = pl.read_parquet(layout.clusters, columns=["doc_id", "cluster"])
    full = (table.join(docs, on="doc_id", how="left").join(clusters, on="doc_id", how="left")
            .with_columns(n_tokens=pl.Series(stream[:n].astype(np.int64))))  # stream tokens: the document's ids and its EOS
    out = write_parquet(table, clean_file(layout))
    dups = full.filter(pl.col("dup_group") >= 0)
    row, col = np.nonzero(flags)  # the flagged (document, set) pairs alone
    contam = pl.DataFrame({"doc_id": row.astype(np.int64), "eval_set": [names[c] for c in col.tolist()], "ngrams": counts[row, col]},
                          schema={"doc_id": pl.Int64, "eval_set": pl.String, "ngrams": pl.Int64})
    contam = contam.join(
        full.select("doc_id", "source", "cluster", "n_tokens", "removed"), on="doc_id", how="left")
    removed = (full.filter(pl.col("removed").is_not_null()).group_by("removed").agg(documents=pl.len(), tokens=pl.col("n_tokens").sum())
               .rename({"removed": "reason"}))
    removed = pl.DataFrame({"reason": list(REASONS)}).join(removed, on="reason", how="left").fill_null(0)
    with connect() as con:
        replace_rows(con, "duplicates", dups, {})
        replace_rows(con, "contamination", contam, {})
        replace_rows(con, "clean_removed", removed, {})
    kinds = dict(dups.group_by("dup_kind").len().iter_rows())
    per_set = dict(contam.group_by("eval_set").len().iter_rows())
    gone = dict(zip(removed["reason"], removed["tokens"]))
    return StageResult(
        [out],
        {"documents": n, "duplicate_docs": dups.height, "contaminated_docs": int(flags.any(axis=1).sum()),
         "removed_docs": int(removed["documents"].sum())},
        {"dedup": cfg.dedup.model_dump(), "decontam": cfg.decontam.model_dump(), "seed": cfg.seed, "eval_sets": list(names)},
        {**{f"{k}_duplicates": int(kinds.get(k, 0)) for k in ("exact", "near", "semantic")},
         **{f"contaminated_{s}": int(per_set.get(s, 0)) for s in names},
         **{f"boilerplate_ngrams_{s}": c for s, c in zip(names, common)},
         **{f"tokens_removed_{r}": int(gone.get(r, 0)) for r in REASONS},
         "checked_against": ", ".join(names) or "none", "lsh_candidates": candidates, "largest_cluster_searched": largest,
         "removed": Markdown(frame_table(removed))},
    )


def removed_documents(layout) -> pl.DataFrame | None:
    """doc_id and removed (the reason) of the documents the clean stage takes out of training, or
    None when there is no clean table (a data root cleaned by no run) or it removes nothing."""
    path = clean_file(layout)
    if not path.is_file():
        return None
    gone = pl.read_parquet(path, columns=["doc_id", "removed"]).filter(pl.col("removed").is_not_null())
    return gone if gone.height else None


def removed_mask(layout, n_docs: int) -> np.ndarray | None:
    """Boolean per doc_id: the document leaves training (None: none does)."""
    gone = removed_documents(layout)
    if gone is None:
        return None
    mask = np.zeros(n_docs, bool)
    mask[gone["doc_id"].to_numpy()] = True
    return mask


def removed_tokens(layout, stream: np.ndarray) -> dict[str, int]:
    """Stream tokens (ids and EOS) of the removed documents by reason (every reason, 0 where none)."""
    from pipeline.clean.plan import REASONS

    gone = removed_documents(layout)
    out = dict.fromkeys(REASONS, 0)
    if gone is not None:
        tok = np.asarray(stream, np.int64)[gone["doc_id"].to_numpy()]
        for reason, t in zip(gone["removed"].to_list(), tok.tolist()):
            out[reason] += int(t)
    return out


def group_keys(layout) -> pl.DataFrame | None:
    """doc_id and dup_group of the documents in a duplicate group (for ``dedup.action: separate``)."""
    path = clean_file(layout)
    if not path.is_file():
        return None
    return pl.read_parquet(path, columns=["doc_id", "dup_group"]).filter(pl.col("dup_group") >= 0)


def packed_stream(layout, stream: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
    """The stream lengths the packing had to hold (the documents the clean stage removed at 0, when
    ``sequences/meta.json`` says the packing left them out) and their tokens by reason: what the
    token-conservation check accounts every token of the corpus with."""
    import json

    from pipeline.clean.plan import REASONS

    meta = json.loads(layout.sequences_meta.read_text(encoding="utf-8")) if layout.sequences_meta.is_file() else {}
    gone = removed_documents(layout) if meta.get("cleaned") else None
    if gone is None:
        return stream, dict.fromkeys(REASONS, 0)
    kept = np.array(stream, np.int64, copy=True)
    by_reason = removed_tokens(layout, kept)
    kept[gone["doc_id"].to_numpy()] = 0
    return kept, by_reason


def training_documents(layout, docs: pl.DataFrame) -> pl.DataFrame:
    """The ordering's documents table without the documents the packing left out (the clean
    stage's removals, when ``sequences/meta.json`` says it applied them), and with a
    ``content_hash`` column (when it has one) equal within each duplicate group, so
    ``duplicate_separated`` separates near and semantic duplicates as it does exact ones."""
    import json

    meta = json.loads(layout.sequences_meta.read_text(encoding="utf-8")) if layout.sequences_meta.is_file() else {}
    gone = removed_documents(layout) if meta.get("cleaned") else None
    if gone is not None:
        docs = docs.filter(~pl.col("doc_id").is_in(gone["doc_id"].implode()))
    groups = group_keys(layout) if "content_hash" in docs.columns else None
    if groups is not None and groups.height:
        docs = (docs.join(groups, on="doc_id", how="left")
                .with_columns(content_hash=pl.when(pl.col("dup_group").is_not_null())
                              .then(pl.format("group:{}", pl.col("dup_group"))).otherwise(pl.col("content_hash")))
                .drop("dup_group").sort("doc_id"))
    return docs
