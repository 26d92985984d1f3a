"""The clean stage: each corpus shard scanned on its own (``clean_shards``: normalized-text hashes,
MinHash signatures, n-gram hits against the fixed evaluation sets, :mod:`pipeline.clean.shards`),
then the gather (``clean``) across shards, in doc_id order: a document is an exact or near
duplicate of any earlier one, whichever shard holds it; the held-out split's n-grams; SemDeDup
over the clusters. Writes ``clean/documents.parquet`` (what :func:`removed_documents` reads for the
packing and the orderings), what the decontamination left out as boilerplate
(``clean/skipped_ngrams.parquet``: one row an n-gram; ``clean/skipped_hits.parquet``: one row a
document holding one) and DuckDB ``duplicates``, ``contamination``, ``contamination_skipped`` and
``clean_removed``."""

from __future__ import annotations

import contextlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from pipeline.clean.clean_tasks import clean_tasks_exact, clean_tasks_semantic
from pipeline.clean.decontam import EvalNgrams, eval_sources, trained_boilerplate
from pipeline.clean.exact import exact_representatives
from pipeline.clean.groups import components
from pipeline.clean.near import EMPTY, band_keys, lsh_pairs
from pipeline.clean.near_bands import near_by_bands
from pipeline.clean.plan import REASONS, plan
from pipeline.clean.removals import clean_file
from pipeline.clean.report import plot_clean
from pipeline.clean.semantic import semantic_pairs
from pipeline.clean.shards import ShardScan, eval_cache, scan_shards, scan_spec
from pipeline.data.gather import Gathered, gather_shards, partition_shard
from pipeline.data.shard_docs import ShardDocs
from pipeline.data.stage import CorpusShardParams
from pipeline.peak_memory import PartPeaks
from pipeline.render.markdown import frame_table, image_markdown
from pipeline.represent.embedding_index import open_embeddings
from pipeline.stage import Connect, EngineParams, Markdown, StageResult, setting
from pipeline.storage.atomic import atomic_writer, write_parquet
from pipeline.storage.warehouse import replace_rows

BATCH = 4096  # documents whose signatures are read (and cut into band keys) at a time


@dataclass(frozen=True)
class CleanParams(EngineParams):
    """The clean stage's settings (``clean_shards`` and ``clean``); its shard scans take them as their ``cfg``."""

    dedup: Any = setting()  # pipeline.config.DedupConfig
    decontam: Any = setting()  # pipeline.config.DecontamConfig
    wikitext_path: str = setting()  # the evaluation sets checked for contamination
    paloma_dir: str = setting()
    dclm_dir: str = setting()
    seed: int = setting()  # the MinHash permutations
    corpus_shard: CorpusShardParams = setting(versioned=False, convert=CorpusShardParams)  # a partition's shard (corpus_shards')
    near_band_tasks: int = setting(versioned=False)  # the near-pair gather's band groups, each a task (0: one index here)
    clean_tasks: int = setting(versioned=False)  # exact hash ranges and SemDeDup cluster groups, each a task (0: all here)


def _specs(layout, params: CleanParams) -> tuple:
    """The partitions' scan (exact, near, the fixed evaluation sets) and the gather's held-out scan
    (None without a held-out set), with the evaluation sets' names in the order the tables use."""
    sources = eval_sources(params, layout.heldout) if params.decontam.enabled else {}
    fixed = {k: v for k, v in sources.items() if k != "heldout"}
    main = scan_spec(params, eval_cache(layout, fixed, params.decontam.ngram))
    held = None
    if "heldout" in sources:
        held = scan_spec(params, eval_cache(layout, {"heldout": sources["heldout"]}, params.decontam.ngram), dedup=False)
    return main, held, tuple(sources)


def scan_shard(layout, params: CleanParams, partition_key: str) -> StageResult:
    """One corpus shard's ``clean_shards`` partition: its documents' normalized-text hashes, MinHash
    signatures and n-gram hits against WikiText, Paloma and DCLM-core (those configured), under
    ``clean/shards/`` (:mod:`pipeline.clean.shards`); a shard already scanned with the same
    parameters and evaluation files is not read again."""
    shard = partition_shard(layout, params.corpus_shard, partition_key)
    main, _, _ = _specs(layout, params)
    run = scan_shards([shard], main, layout.shard_dir("clean"), layout.inside("work", "clean"), params)
    files = main.files(layout.shard_dir("clean"), shard) if shard.n_docs else {}
    facts: dict = {"validated": shard.name, "key": main.key, "reused": run["shards_reused"] > 0 or not shard.n_docs,
                   "units": run["units"]}
    if "hashes" in files:
        facts["exact_duplicates_in_shard"] = int(shard.n_docs - np.unique(np.load(files["hashes"])).size)
    if "hits" in files:
        hits, names = np.load(files["hits"]), EvalNgrams.load(Path(main.evals)).names
        facts.update({f"documents_sharing_ngrams_{s}": int(np.unique(hits[hits[:, 1] == j, 0]).size) for j, s in enumerate(names)})
    return StageResult(outputs=list(files.values()), rows={"documents": shard.n_docs},
                       parameters={"shard": shard.unit, "dedup": params.dedup.model_dump(), "decontam": params.decontam.model_dump(),
                                   "seed": params.seed},
                       facts=facts)


def _gather(layout, params: CleanParams) -> tuple[list, tuple, list, tuple[str, ...], Gathered]:
    """Every shard of the corpus scanned (the partitions' files, a missing one scanned here;
    :func:`pipeline.data.gather.gather_shards`) as :class:`~pipeline.clean.shards.ShardScan` objects
    in doc_id order; the two scan specs; the held-out scans; the evaluation sets' names; the gather
    (what the scans of the main spec reused, the shards read)."""
    main, held, names = _specs(layout, params)
    shard_dir, work = layout.shard_dir("clean"), layout.inside("work", "clean")

    def scan(docs: list[ShardDocs]) -> dict:
        t0 = time.perf_counter()
        run = scan_shards(docs, main, shard_dir, work, params)
        t1 = time.perf_counter()
        run["heldout_shards_computed"] = scan_shards(docs, held, shard_dir, work, params)["shards_computed"] if held else 0
        run["scan_s"], run["heldout_scan_s"] = round(t1 - t0, 2), round(time.perf_counter() - t1, 2)
        return run

    g = gather_shards(layout, "clean", scan,
                      lambda s: [f for spec in (main, held) if spec is not None for f in spec.files(shard_dir, s).values()])
    for old in layout.inside("clean", "evals").glob("*") if layout.inside("clean", "evals").is_dir() else ():
        if old.name not in {Path(spec.evals).name for spec in (main, held) if spec is not None and spec.evals}:
            shutil.rmtree(old, ignore_errors=True)
    scans, held_scans, start = [], [], 0
    for row, shard, rows in g.parts():
        n = int(row["n_docs"])
        scans.append(ShardScan(start, n, rows, main.files(shard_dir, shard)))
        if held is not None:
            held_scans.append(ShardScan(start, n, rows, held.files(shard_dir, shard)))
        start += n
    return scans, (main, held), held_scans, names, g


def _near_pairs(params: CleanParams, scans: list, exact_rep: np.ndarray) -> tuple[np.ndarray, int]:
    """Near pairs among the exact representatives, each against every other (across shards), from
    the stored signatures (memory-mapped: one band key a document and band is held, and the
    signatures of a chunk of candidate pairs at a time)."""
    d = params.dedup
    rows = d.near_rows
    keys, keyed = [], []
    for scan in scans:
        ids = np.arange(scan.start, scan.start + scan.n, dtype=np.int64)
        local = np.flatnonzero(exact_rep[ids] == ids)
        for a in range(0, local.size, BATCH):
            sig = scan.signatures(local[a:a + BATCH])
            real = ~(sig == EMPTY).all(axis=1)  # an empty text's signature is no document's near duplicate
            keys.append(scan.start + local[a:a + BATCH][real])
            keyed.append(band_keys(sig[real], d.near_num_perm // rows, rows))
    if not keys:
        return np.zeros((0, 2), np.int64), 0
    keys_all = np.concatenate(keys)
    starts = np.array([s.start for s in scans], np.int64)

    def fetch(positions: np.ndarray) -> np.ndarray:
        docs = keys_all[positions]
        out = np.empty((docs.size, d.near_num_perm), np.uint32)
        which = np.searchsorted(starts, docs, side="right") - 1
        for j in np.unique(which):
            at = np.flatnonzero(which == j)
            order = np.argsort(docs[at], kind="stable")
            out[at[order]] = scans[j].signatures(docs[at][order] - scans[j].start)
        return out

    return lsh_pairs(keys_all, np.concatenate(keyed), fetch, d.near_threshold)


SKIPPED_SCHEMA = {"eval_set": pl.String, "ngram": pl.UInt64, "doc_id": pl.Int64}  # clean/skipped_hits.parquet
SKIPPED_NGRAMS_SCHEMA = {"eval_set": pl.String, "ngram": pl.UInt64, "eval_units": pl.Int64, "training_docs": pl.Int64,
                         "reason": pl.String}  # clean/skipped_ngrams.parquet
REASON_UNITS, REASON_TRAINING = "in many units of the set", "in many training documents and several units of the set"


def _skip_masks(evals: EvalNgrams, docs_with: list[np.ndarray], n: int, share: float, names: tuple[str, ...],
                common: list[int], rows: list[pl.DataFrame]) -> list[np.ndarray]:
    """Per set of ``evals``, which of its n-grams are boilerplate (:mod:`pipeline.clean.decontam`: in
    many of its units, or in several of them and many of the ``n`` training documents); their count
    goes to ``common`` and one row each (SKIPPED_NGRAMS_SCHEMA) to ``rows``."""
    skip = []
    for local, (name, boiler) in enumerate(zip(evals.names, evals.boilerplate(share))):
        trained = trained_boilerplate(docs_with[local], n, share, evals.units_with[local]) & ~boiler
        common[names.index(name)] = int(boiler.sum()) + int(trained.sum())
        skip.append(boiler | trained)
        at = np.flatnonzero(boiler | trained)
        rows.append(pl.DataFrame({"eval_set": [name] * at.size, "ngram": np.asarray(evals.hashes[local])[at],
                                  "eval_units": np.asarray(evals.units_with[local])[at].astype(np.int64),
                                  "training_docs": docs_with[local][at],
                                  "reason": np.where(boiler[at], REASON_UNITS, REASON_TRAINING).tolist()},
                                 schema=SKIPPED_NGRAMS_SCHEMA))
    return skip


def _contamination(params: CleanParams, n: int, names: tuple[str, ...], parts: list[tuple[object, list]], sink=None
                   ) -> tuple[np.ndarray, list[int], np.ndarray, pl.DataFrame]:
    """(n, sets) distinct shared n-grams per document and set, the boilerplate left out
    (:func:`_skip_masks`), the n-grams left out of each set, (n, sets) the distinct left-out
    n-grams each document holds, and one row a left-out n-gram (SKIPPED_NGRAMS_SCHEMA). ``parts``:
    (scan spec, its shard scans). ``sink``, when given, receives each shard's (eval_set, ngram, doc_id) rows of
    left-out n-grams (SKIPPED_SCHEMA). Two passes over the shards' hits, one shard in memory at a
    time: the training documents holding each n-gram, then each document's count of the n-grams
    that are not boilerplate and of those that are."""
    counts, common = np.zeros((n, len(names)), np.int64), [0] * len(names)
    skipped, rows = np.zeros((n, len(names)), np.int64), []
    for spec, scans in parts:
        if spec is None or not spec.evals:
            continue
        evals = EvalNgrams.load(Path(spec.evals))
        sizes = [h.size for h in evals.hashes]
        docs_with = [np.zeros(k, np.int64) for k in sizes]  # training documents holding each n-gram (a (doc, n-gram) hit is once)
        for scan in scans:
            hits = scan.hits()
            for local, k in enumerate(sizes):
                docs_with[local] += np.bincount(hits[hits[:, 1] == local, 2], minlength=k)
        skip = _skip_masks(evals, docs_with, n, params.decontam.common_share, names, common, rows)
        for scan in scans:
            hits = scan.hits()
            for local, name in enumerate(evals.names):
                found = hits[hits[:, 1] == local]
                left = skip[local][found[:, 2]]
                counts[:, names.index(name)] += np.bincount(found[~left, 0], minlength=n)  # distinct shared n-grams per document
                out = found[left]
                skipped[:, names.index(name)] += np.bincount(out[:, 0], minlength=n)
                if sink is not None and out.shape[0]:
                    sink(pl.DataFrame({"eval_set": [name] * out.shape[0], "ngram": np.asarray(evals.hashes[local])[out[:, 2]],
                                       "doc_id": out[:, 0]}, schema=SKIPPED_SCHEMA))
    return counts, common, skipped, pl.concat(rows) if rows else pl.DataFrame(schema=SKIPPED_NGRAMS_SCHEMA)


@contextlib.contextmanager
def _skipped_sink(path: Path):
    """A function that appends (eval_set, ngram, doc_id) frames to the Parquet file ``path``, written
    atomically (an empty file with the columns when none came)."""
    schema = pl.DataFrame(schema=SKIPPED_SCHEMA).to_arrow().schema
    with atomic_writer(path) as fh:
        writer = pq.ParquetWriter(fh, schema, compression="zstd", write_statistics=False)
        try:
            yield lambda frame: writer.write_table(frame.to_arrow().cast(schema))
        finally:
            writer.close()


def semantic_candidates(layout, params: CleanParams, survivors: np.ndarray) -> tuple[np.ndarray, int]:
    """SemDeDup among ``survivors`` (sorted doc ids) within their k-means clusters, as one pair a
    grouped document (its group's smallest doc id, it), and the largest cluster searched; with
    ``clean_tasks``, the clusters in groups, each a task (:mod:`pipeline.clean.clean_tasks`)."""
    cluster = pl.read_parquet(layout.clusters, columns=["doc_id", "cluster"]).sort("doc_id")["cluster"].to_numpy()
    if params.clean_tasks:
        return clean_tasks_semantic(layout, params, cluster, survivors)
    return semantic_pairs(open_embeddings(layout).take, cluster, survivors, params.dedup.semantic_threshold, forest=True)


def clean_documents(layout, params: CleanParams, connect: Connect) -> StageResult:
    """The gather across shards: exact (normalized-text hash), near (MinHash + LSH over word
    ``dedup.near_ngram``-grams, ``dedup.near_threshold``) and semantic (within each cluster, cosine
    above ``dedup.semantic_threshold``) duplicates, each level over the previous level's
    representatives, each document against every earlier one whichever shard holds it;
    ``decontam.ngram``-gram overlap with every configured evaluation set and the held-out split.
    Reads the ``clean_shards`` files (scans a shard whose files are missing; its ``deps`` name every
    shard read). ``dedup.action`` and ``decontam.action`` decide who leaves training (``removed``)."""
    peaks = PartPeaks()  # each part's peak resident memory, in the asset's metadata
    with peaks.part("gather"):
        scans, (main, held), held_scans, names, gathered = _gather(layout, params)
    run = gathered.run
    n, t0 = sum(s.n for s in scans), time.perf_counter()
    with peaks.part("exact"):
        exact_rep = _exact_representatives(scans, n, layout, params) if main.exact and n else np.arange(n, dtype=np.int64)
    t1 = time.perf_counter()
    near_of = near_by_bands if params.near_band_tasks else lambda _, *args: _near_pairs(*args)  # band groups as tasks, or one index here
    with peaks.part("near"):
        near, candidates = near_of(layout, params, scans, exact_rep) if main.near and n else (np.zeros((0, 2), np.int64), 0)
    t2 = time.perf_counter()
    hits_file = layout.inside("clean", "skipped_hits.parquet")
    with peaks.part("decontam"), _skipped_sink(hits_file) as sink:
        counts, common, skipped, skipped_ngrams = _contamination(params, n, names, [(main, scans), (held, held_scans)], sink)
    t3 = time.perf_counter()
    with peaks.part("semantic"):
        semantic, largest = _semantic_pairs(layout, params, n, exact_rep, near)
    t4 = time.perf_counter()
    flags = counts >= params.decontam.min_overlap
    with peaks.part("tables"):
        table = plan(n, exact_rep, near, semantic, flags, names, params.dedup.action, params.decontam.action == "drop")
        out = write_parquet(table, clean_file(layout))
        skipped_file = write_parquet(skipped_ngrams, layout.inside("clean", "skipped_ngrams.parquet"))
        dups, contam, removed, held_skipped = _clean_tables(layout, table, flags, counts, skipped, names, n)
        _record_tables(connect, dups, contam, held_skipped, removed)
        png = plot_clean({"duplicates": dups, "contamination": contam}, layout.inside("clean", "clean.png"))
    kinds = dict(dups.group_by("dup_kind").len().iter_rows())
    per_set = dict(contam.group_by("eval_set").len().iter_rows())
    gone = dict(zip(removed["reason"], removed["tokens"]))
    return StageResult(
        outputs=[out, png, skipped_file, hits_file],
        rows={"documents": n, "duplicate_docs": dups.height, "contaminated_docs": int(flags.any(axis=1).sum()),
              "removed_docs": int(removed["documents"].sum())},
        parameters={"dedup": params.dedup.model_dump(), "decontam": params.decontam.model_dump(), "seed": params.seed,
                    "eval_sets": list(names)},
        facts={**{f"{k}_duplicates": int(kinds.get(k, 0)) for k in ("exact", "near", "semantic")},
               **{f"contaminated_{s}": int(per_set.get(s, 0)) for s in names},
               **{f"boilerplate_ngrams_{s}": c for s, c in zip(names, common)},
               **_left_out_facts(skipped_ngrams, held_skipped, skipped, names),
               **{f"tokens_removed_{r}": int(gone.get(r, 0)) for r in REASONS},
               "checked_against": ", ".join(names) or "none", "lsh_candidates": candidates, "largest_cluster_searched": largest,
               "shards_scanned_here": run["shards_computed"], "shards_reused": run["shards_reused"],
               "heldout_shards_scanned": run["heldout_shards_computed"],
               # where the gather's time went (the whole asset's is its wall_s)
               **{f"{k}_s": round(v, 2) for k, v in (("scan", run["scan_s"]), ("heldout_scan", run["heldout_scan_s"]),
                                                     ("exact", t1 - t0), ("near", t2 - t1), ("decontam", t3 - t2), ("semantic", t4 - t3))},
               **peaks.facts(),  # where the gather's memory went: each part's peak resident MiB
               "removed": Markdown(frame_table(removed)),
               "by_source_and_cluster": Markdown(image_markdown(png, "duplicates and contamination by source and by cluster"))},
        deps=gathered.deps("clean_shards"),
    )


def _record_tables(connect: Connect, dups: pl.DataFrame, contam: pl.DataFrame, held_skipped: pl.DataFrame,
                   removed: pl.DataFrame) -> None:
    """The clean plan's DuckDB tables (:func:`_clean_tables`), each replaced whole."""
    with connect() as con:
        for name, frame in (("duplicates", dups), ("contamination", contam), ("contamination_skipped", held_skipped),
                            ("clean_removed", removed)):
            replace_rows(con, name, frame, {})


def _exact_representatives(scans: list, n: int, layout=None, params: CleanParams | None = None) -> np.ndarray:
    """Each document's exact-duplicate representative (the first document of its normalized-text
    hash), over every shard's documents in corpus order; with ``clean_tasks``, the hash space in
    ranges, each a task (:mod:`pipeline.clean.clean_tasks`)."""
    if params is not None and params.clean_tasks:
        return clean_tasks_exact(layout, params, scans, n)
    return exact_representatives(np.concatenate([np.asarray(s.take("hashes")) for s in scans]))


def _semantic_pairs(layout, params, n: int, exact_rep: np.ndarray, near: np.ndarray) -> tuple[np.ndarray, int]:
    """``(semantic duplicate pairs, the largest cluster searched)`` among the near-duplicate
    representatives (SemDeDup within each cluster), or none when semantic dedup is off."""
    semantic, largest = np.zeros((0, 2), np.int64), 0
    if params.dedup.enabled and params.dedup.semantic and n:
        near_rep = components(n, near)[exact_rep]
        semantic, largest = semantic_candidates(layout, params, np.flatnonzero(near_rep == np.arange(n)))
    return semantic, largest


def _clean_tables(layout, table: pl.DataFrame, flags: np.ndarray, counts: np.ndarray, skipped: np.ndarray, names: list[str],
                  n: int) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The DuckDB tables of the clean plan ``table``: ``duplicates`` (each duplicate with its
    source, cluster and stream tokens), ``contamination`` (each flagged document and evaluation
    set), ``clean_removed`` (documents and tokens that leave training, per reason) and
    ``contamination_skipped`` (each document and set whose n-grams the decontamination left out as
    boilerplate, ``skipped``: their count per document and set)."""
    docs = pl.read_parquet(layout.documents, columns=["doc_id", "source"]).sort("doc_id")
    stream = np.diff(np.load(layout.doc_offsets, allow_pickle=False))
    clusters = pl.read_parquet(layout.clusters, columns=["doc_id", "cluster"])
    full = (table.join(docs, on="doc_id", how="left").join(clusters, on="doc_id", how="left")
            .with_columns(n_tokens=pl.Series(stream[:n].astype(np.int64))))  # stream tokens: the document's ids and its EOS
    dups = full.filter(pl.col("dup_group") >= 0)
    row, col = np.nonzero(flags)  # the flagged (document, set) pairs alone
    contam = pl.DataFrame({"doc_id": row.astype(np.int64), "eval_set": [names[c] for c in col.tolist()], "ngrams": counts[row, col]},
                          schema={"doc_id": pl.Int64, "eval_set": pl.String, "ngrams": pl.Int64})
    contam = contam.join(
        full.select("doc_id", "source", "cluster", "n_tokens", "removed"), on="doc_id", how="left")
    removed = (full.filter(pl.col("removed").is_not_null()).group_by("removed").agg(documents=pl.len(), tokens=pl.col("n_tokens").sum())
               .rename({"removed": "reason"}))
    removed = pl.DataFrame({"reason": list(REASONS)}).join(removed, on="reason", how="left").fill_null(0)
    srow, scol = np.nonzero(skipped)  # the documents holding n-grams left out as boilerplate, per set
    held_skipped = pl.DataFrame({"doc_id": srow.astype(np.int64), "eval_set": [names[c] for c in scol.tolist()],
                                 "skipped_ngrams": skipped[srow, scol]},
                                schema={"doc_id": pl.Int64, "eval_set": pl.String, "skipped_ngrams": pl.Int64})
    held_skipped = held_skipped.join(full.select("doc_id", "source", "removed"), on="doc_id", how="left")
    return dups, contam, removed, held_skipped


def _left_out_facts(skipped_ngrams: pl.DataFrame, held_skipped: pl.DataFrame, skipped: np.ndarray,
                    names: tuple[str, ...]) -> dict[str, Any]:
    """What the UI shows of the n-grams left out as boilerplate: per set the documents holding one,
    and a table per set and reason (n-grams, the most training documents one is in, documents)."""
    left_out = (skipped_ngrams.group_by("eval_set", "reason").agg(ngrams=pl.len(), most_training_docs=pl.col("training_docs").max())
                .join(held_skipped.group_by("eval_set").agg(documents_holding=pl.len()), on="eval_set", how="left")
                .fill_null(0).sort("eval_set", "reason"))
    return {**{f"documents_holding_boilerplate_{s}": int((skipped[:, j] > 0).sum()) for j, s in enumerate(names)},
            "boilerplate_left_out": Markdown(frame_table(left_out) if left_out.height else "none")}


