"""Token ids per corpus shard (the ``token_shards`` partitions) and the store gathered from them.

Each validated shard's training rows are tokenized on their own into
``tokens/shards/<validated>-<tokenizer>.bin`` (the flat ids, EOS after each document) and ``.parquet``
(per-document ``n_tokens``, ``n_chars``, ``n_bytes``), in work units of ``shard_docs`` documents on
the configured engine (:mod:`pipeline.distributed.units`). :func:`gather_tokens` writes the
whole-corpus store of :mod:`pipeline.data.tokens` from them in ``corpus.parquet`` order, as an
index over the shards' own files (:mod:`pipeline.data.token_index`): no id is copied.
"""

from __future__ import annotations

from functools import lru_cache, partial
from itertools import chain
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.data.shard_docs import ShardDocs, kept_rows, read_docs, read_shard_docs
from pipeline.data.text_pieces import PIECE_CHARS, pieces, splits_cleanly
from pipeline.data.token_index import TokenRuns, shard_runs, write_token_runs
from pipeline.data.tokens import token_dtype, tokenizer_fingerprint
from pipeline.distributed.units import map_corpus_shards
from pipeline.storage.atomic import atomic_writer, write_npy, write_parquet
from pipeline.storage.fingerprints import fingerprint_digest
from pipeline.storage.integrity import intact
from pipeline.threads import ahead, cores, parallel_map, task_size

TOKEN_STATS = {"n_tokens": pl.Int64, "n_chars": pl.Int64, "n_bytes": pl.Int64}


@lru_cache(maxsize=2)
def _backend(tokenizer_json: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json)


def _long_ids(backend, dt: np.dtype, text: str) -> np.ndarray:
    """The ids of a text longer than ``PIECE_CHARS``, encoded piece by piece (:mod:`pipeline.data.text_pieces`:
    the same ids as the whole text, with the encoder's memory for one piece instead of the whole text)."""
    out = [np.asarray(backend.encode_batch_fast([piece], add_special_tokens=False)[0].ids, dtype=dt) for piece in pieces(text, PIECE_CHARS)]
    return np.concatenate(out) if out else np.empty(0, dt)


def _encode_block(backend, eos_id: int, dt: np.dtype, texts: list[str], split: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(flat ids with EOS after each document, n_tokens)`` of ``texts``; with ``split``, a text
    longer than ``PIECE_CHARS`` is encoded in pieces (the tokenizer :func:`splits_cleanly`)."""
    long = {i for i, t in enumerate(texts) if len(t) > PIECE_CHARS} if split else set()
    batch = [("" if i in long else t) for i, t in enumerate(texts)] if long else texts
    ids = [e.ids for e in backend.encode_batch_fast(batch, add_special_tokens=False)]  # no character offsets: less work
    for i in long:
        ids[i] = _long_ids(backend, dt, texts[i])
    n_tokens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.empty(int(n_tokens.sum()) + len(ids), dtype=dt)
    ends = np.cumsum(n_tokens + 1) - 1
    if long:
        for i, (row, end) in enumerate(zip(ids, ends)):
            flat[end - n_tokens[i] : end] = row
    else:
        body = np.ones(flat.size, bool)
        body[ends] = False
        flat[body] = np.fromiter(chain.from_iterable(ids), dtype=dt, count=int(n_tokens.sum()))
    flat[ends] = eos_id
    return flat, n_tokens


def tokenize_unit(tokenizer_json: str, eos_id: int, dtype: str, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(flat ids with EOS after each document, n_tokens, n_chars, n_bytes)`` of ``texts``: the ids
    :func:`pipeline.data.tokens.tokenize_documents` gives, from the tokenizer's serialized form.

    The Rust encoder releases the GIL, so blocks of texts are encoded on a thread a core, whatever
    ``TOKENIZERS_PARALLELISM`` says (Strata sets it off to keep the library quiet across forks);
    one thread's Python work on its block's ids overlaps the others' encoding. A document longer
    than ``PIECE_CHARS`` characters is encoded in pieces cut before whitespace when the tokenizer
    gives the same ids that way (:mod:`pipeline.data.text_pieces`), so its memory stays bounded.
    """
    dt = np.dtype(dtype)
    backend = _backend(tokenizer_json)
    step = task_size(len(texts), 1024)
    split = splits_cleanly(tokenizer_json) and any(len(t) > PIECE_CHARS for t in texts)
    parts = parallel_map(partial(_encode_block, backend, eos_id, dt, split=split),
                         [texts[i : i + step] for i in range(0, len(texts), step)])
    flat = np.concatenate([p[0] for p in parts]) if parts else np.empty(0, dt)
    n_tokens = np.concatenate([p[1] for p in parts]) if parts else np.empty(0, np.int64)
    s = pl.Series(texts, dtype=pl.String)
    return flat, n_tokens, s.str.len_chars().cast(pl.Int64).to_numpy(), s.str.len_bytes().cast(pl.Int64).to_numpy()


def tokenizer_key(tok) -> str:
    """What names a tokenizer's shard files: a digest of its fingerprint."""
    return fingerprint_digest(tokenizer_fingerprint(tok))


def token_files(shard_dir: Path, shard: ShardDocs, key: str) -> tuple[Path, Path]:
    """A shard's ``.bin`` (ids) and ``.parquet`` (per-document counts) under ``shard_dir``."""
    return shard_dir / f"{shard.name}-{key}.bin", shard_dir / f"{shard.name}-{key}.parquet"


def tokenize_shards(shards: list[ShardDocs], tok, shard_dir: Path, work_dir: Path, cfg) -> dict[str, int]:
    """Tokenize every shard whose files are missing or changed since they were written
    (:func:`pipeline.storage.integrity.intact`); returns :func:`map_corpus_shards`'s counts."""
    key, dtype = tokenizer_key(tok), token_dtype(len(tok))
    args = (tok.backend_tokenizer.to_str(), tok.eos_token_id, dtype.str)
    shard_dir.mkdir(parents=True, exist_ok=True)

    def assemble(shard: ShardDocs, results: Iterator[tuple]) -> None:
        out_bin, out_stats = token_files(shard_dir, shard, key)
        stats = []
        with atomic_writer(out_bin) as fh:
            for flat, n_tokens, n_chars, n_bytes in results:
                fh.write(np.ascontiguousarray(flat))
                stats.append(pl.DataFrame({"n_tokens": n_tokens, "n_chars": n_chars, "n_bytes": n_bytes}, schema=TOKEN_STATS))
        write_parquet(pl.concat(stats), out_stats)

    return map_corpus_shards(
        shards, tokenize_unit, lambda s, a, b: (*args, read_shard_docs(s, a, b)["text"].to_list()), assemble,
        lambda s: intact(token_files(shard_dir, s, key)), stage="tokens", key=key, work_dir=work_dir, cfg=cfg,
        checkpoint=False,
    )


def gather_tokens(shards: list[tuple[dict, ShardDocs]], key: str, dtype: np.dtype, shard_dir: Path, corpus_path: Path,
                  runs_path: Path, offsets_path: Path, documents_path: Path, extra: Sequence[str] = ()) -> np.ndarray:
    """Write the token store's index over the shards' files (``runs_path``, see
    :mod:`pipeline.data.token_index`: no copy of the ids), ``doc_offsets.npy`` and
    ``documents.parquet`` (doc_id, id, source, subdomain and the ``extra`` columns of
    ``corpus.parquet``, the declared ``corpus.columns``, plus token/char/byte counts; the content
    hashes stay in ``corpus.parquet``); returns ``n_tokens`` per document. Memory: the counts, runs and documents rows of the shards read
    ahead (two a core, :func:`pipeline.threads.ahead`)."""
    cols = ["doc_id", "id", "source", "subdomain", *extra]

    def part(item: tuple[dict, ShardDocs]) -> tuple[Path, np.ndarray, np.ndarray, np.ndarray, pa.Table]:
        """One shard's token file, runs (local starts, lengths), kept counts and documents rows."""
        row, shard = item
        bin_path, stats_path = token_files(shard_dir, shard, key)
        stats = pl.read_parquet(stats_path)
        n_all = stats["n_tokens"].to_numpy()
        if bin_path.stat().st_size != int(n_all.sum() + n_all.size) * dtype.itemsize:
            raise RuntimeError(f"{bin_path}: size does not match its {stats_path.name}; delete {shard_dir} and rerun")
        rows = kept_rows(corpus_path, row, shard)
        local, lengths = shard_runs(n_all + 1, rows)
        if rows is not None:
            stats = stats[rows]
        lo = int(row["doc_start"])
        table = read_docs(corpus_path, lo, lo + int(row["n_docs"]), cols).with_columns(
            stats.select(["n_chars", "n_bytes", "n_tokens"])).to_arrow()
        return bin_path, local, lengths, stats["n_tokens"].to_numpy(), table

    counts, paths, starts, files, locals_ = [], [], [], [], []
    at = 0
    with atomic_writer(documents_path) as docs_sink:
        writer = None
        try:
            # the shards read on a thread a core, up to two a core ahead of this loop, which writes
            # (compresses) each one's rows in order
            workers = cores()
            for bin_path, local, lengths, kept, table in ahead(part, [s for s in shards if int(s[0]["n_docs"])],
                                                               depth=2 * workers, workers=workers):
                starts.append(at + np.cumsum(lengths) - lengths)
                files.append(np.full(local.size, len(paths), np.int64))
                locals_.append(local)
                paths.append(bin_path)
                at += int(lengths.sum())
                counts.append(kept)
                if writer is None:
                    writer = pq.ParquetWriter(docs_sink, table.schema, compression="zstd", write_statistics=False)
                writer.write_table(table)
        finally:
            if writer is not None:
                writer.close()
    n_tokens = np.concatenate(counts)
    offsets = np.zeros(n_tokens.size + 1, dtype=np.int64)
    np.cumsum(n_tokens + 1, out=offsets[1:])
    write_npy(offsets, offsets_path)
    write_token_runs(TokenRuns(paths, np.append(np.concatenate(starts), at), np.concatenate(files), np.concatenate(locals_)), dtype,
                     runs_path)
    return n_tokens
