"""Per-corpus-shard stages (tokens, embeddings) as work units, on either engine, in bounded memory.

Every corpus shard (a row of ``corpus/shards.parquet``) has its own artifacts per stage, named by
the shard's documents (``docs_digest``) and the producer's fingerprint, e.g.
``tokens/shards/<docs_digest>-<tokenizer>.bin``. A rerun computes only the shards whose artifacts
are missing (new or edited shards, or a new tokenizer / model) and reuses the rest.

A shard to compute is cut into work units of ``cfg.shard_docs`` consecutive documents — the same
units on both engines, so every embedding batch holds the same documents and the bytes are
identical — and :func:`pipeline.distributed.engine.map_shards` runs the pure unit function on each.
A unit's inputs are read only when it is submitted (:attr:`Shard.load`), its result is written to
``work/<stage>/`` as soon as it arrives, and once all units of a shard are in, ``assemble`` writes
the shard's artifacts and the unit files are removed. Memory: the units in flight. A run killed
midway leaves complete unit and shard files; a rerun resumes from them.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import polars as pl
from tqdm import tqdm

from pipeline.distributed.engine import Shard, map_shards
from pipeline.storage.atomic import atomic_path


@lru_cache(maxsize=2)
def _backend(tokenizer_json: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json)


def tokenize_unit(tokenizer_json: str, eos_id: int, dtype: str, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(flat ids with EOS after each document, n_tokens, n_chars, n_bytes)`` of ``texts``: the ids
    :func:`pipeline.data.tokens.tokenize_documents` gives, from the tokenizer's serialized form
    (the Rust batch encoder runs on every core)."""
    dt = np.dtype(dtype)
    backend = _backend(tokenizer_json)
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # no character offsets: ~20% faster
    encs = encode(texts, add_special_tokens=False)
    n_tokens = np.fromiter((len(e.ids) for e in encs), dtype=np.int64, count=len(encs))
    flat = np.empty(int(n_tokens.sum()) + len(encs), dtype=dt)
    ends = np.cumsum(n_tokens + 1) - 1
    body = np.ones(flat.size, bool)
    body[ends] = False
    flat[body] = np.fromiter((i for e in encs for i in e.ids), dtype=dt, count=int(n_tokens.sum()))
    flat[ends] = eos_id
    s = pl.Series(texts, dtype=pl.String)
    return flat, n_tokens, s.str.len_chars().cast(pl.Int64).to_numpy(), s.str.len_bytes().cast(pl.Int64).to_numpy()


def embed_unit(method: str, model: str, max_tokens: int, batch_size: int, progress: bool, texts: list[str]) -> np.ndarray:
    """Unit-norm embeddings of one unit's texts (:func:`pipeline.represent.embeddings.embed`, no
    checkpoints: a unit is the unit of resumption, so its batches never depend on an interruption)."""
    from pipeline.represent.embeddings import embed

    return embed(texts, method, model, max_tokens, batch_size, work_dir=None, progress=progress)


def embed_unit_from_ids(model: str, max_tokens: int, ids: np.ndarray, n_tokens: np.ndarray) -> np.ndarray:
    """``shallow`` embeddings of one unit from its token-store ids (the pipeline's tokenizer is the
    model's): equal to :func:`embed_unit` on the texts, without tokenizing again."""
    from pipeline.represent.embeddings import shallow_from_ids

    return shallow_from_ids(model, max_tokens, ids, n_tokens)


@lru_cache(maxsize=4)
def _row_starts(path: str, mtime_ns: int, size: int) -> np.ndarray:
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    return np.concatenate([[0], np.cumsum([meta.row_group(i).num_rows for i in range(meta.num_row_groups)])]).astype(np.int64)


def read_docs(corpus_path: Path, start: int, stop: int, columns: Sequence[str] = ("text",)) -> pl.DataFrame:
    """Rows ``start:stop`` (doc ids) of ``corpus.parquet``, reading only the row groups they lie in."""
    import pyarrow.parquet as pq

    st = Path(corpus_path).stat()
    starts = _row_starts(str(corpus_path), st.st_mtime_ns, st.st_size)
    first = int(np.searchsorted(starts, start, side="right")) - 1
    last = int(np.searchsorted(starts, stop, side="left"))
    table = pq.ParquetFile(corpus_path).read_row_groups(list(range(first, last)), columns=list(columns))
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    return df.slice(start - int(starts[first]), stop - start)


def _save(shard: Shard, result: Any) -> None:
    arrays = result if isinstance(result, tuple) else (result,)
    with atomic_path(shard.outputs[0]) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, *arrays)


def load_unit(path: Path) -> tuple[np.ndarray, ...]:
    """A unit's result arrays, as the unit function returned them."""
    with np.load(path, allow_pickle=False) as z:
        return tuple(z[f"arr_{i}"] for i in range(len(z.files)))


def map_corpus_shards(
    manifest: Sequence[dict],
    fn: Callable[..., Any],
    unit_args: Callable[[int, int], tuple],
    assemble: Callable[[dict, list[Path]], None],
    done: Callable[[dict], bool],
    *,
    stage: str,
    key: str,
    work_dir: Path,
    cfg,
    actors: bool = False,
) -> dict[str, int]:
    """Compute the artifacts of every shard of ``manifest`` for which ``done(shard)`` is false.

    ``unit_args(start, stop)`` gives ``fn``'s arguments for documents ``start:stop`` (global doc
    ids); ``assemble(shard, unit_files)`` writes a shard's artifacts from its units' results (files
    holding ``fn``'s return value, read with :func:`load_unit`). Returns ``shards``,
    ``shards_computed``, ``shards_reused``, ``units`` (of the shards computed) and ``units_resumed``
    (found complete from an earlier run)."""
    n = cfg.shard_docs
    todo = [s for s in manifest if int(s["n_docs"]) and not done(s)]
    units: dict[str, list[Shard]] = {}
    for s in todo:
        lo, hi = int(s["doc_start"]), int(s["doc_start"]) + int(s["n_docs"])
        units[s["docs_digest"]] = [
            Shard(f"{stage}[{s['path']}:{a - lo}]", (), (work_dir / f"{stage}-{s['docs_digest']}-{key}-{a - lo}.npz",),
                  load=lambda a=a, b=min(a + n, hi): unit_args(a, b))
            for a in range(lo, hi, n)
        ]
    by_digest = {s["docs_digest"]: s for s in todo}
    owner = {u.outputs[0]: d for d, us in units.items() for u in us}
    work_dir.mkdir(parents=True, exist_ok=True)

    def finish(digest: str) -> None:
        files = [u.outputs[0] for u in units.pop(digest)]
        assemble(by_digest[digest], files)
        for f in files:
            f.unlink(missing_ok=True)

    resumed = sum(u.done() for us in units.values() for u in us)
    for digest in [d for d, us in units.items() if all(u.done() for u in us)]:  # complete from an interrupted run
        finish(digest)
    flat = [u for us in units.values() for u in us]
    bar = tqdm(total=len(flat), initial=sum(u.done() for u in flat), desc=f"{stage}[{cfg.engine}]", unit="unit", disable=len(flat) < 2)

    def save(unit: Shard, result: Any) -> None:
        _save(unit, result)
        bar.update(1)
        digest = owner[unit.outputs[0]]
        if all(u.done() for u in units[digest]):
            finish(digest)

    map_shards(fn, flat, save, engine=cfg.engine, ray_cfg=cfg.ray, actors=actors)
    bar.close()
    return {"shards": len(manifest), "shards_computed": len(todo), "shards_reused": len(manifest) - len(todo), "units": len(owner),
            "units_resumed": resumed}


def prune(shard_dir: Path, keep: set[str]) -> int:
    """Remove a stage's shard artifacts not named in ``keep`` (shards no longer in the corpus); their count."""
    gone = 0
    for p in shard_dir.iterdir() if shard_dir.is_dir() else ():
        if p.is_file() and p.name not in keep:
            p.unlink()
            gone += 1
    return gone
