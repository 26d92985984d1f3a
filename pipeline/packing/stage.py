"""The packing stage: the documents packed into ``seq_len``-token sequences (``sequences``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from pipeline.clean.removals import applied_file, packed_stream, removed_documents, tokens_by_reason
from pipeline.data.tokenizer import load_tokenizer
from pipeline.data.tokens import open_tokens
from pipeline.packing import frozen
from pipeline.packing.frozen import load_all
from pipeline.packing.pack import (
    SequenceStore,
    conservation_file,
    narrow_lengths,
    pack,
    pack_concat_file,
    packing_stats,
    parse_packing,
)
from pipeline.stage import CheckFact, Connect, StageParams, StageResult, setting
from pipeline.storage.atomic import write_json, write_parquet
from pipeline.storage.layout import tokens_fingerprint
from pipeline.storage.warehouse import replace_rows


@dataclass(frozen=True)
class PackParams(StageParams):
    """The packing stage's settings (``sequences``)."""

    seq_len: int = setting()
    packing: str = setting()  # concat | padding | best_fit, atom shuffles as e.g. "concat-x0.5"
    seed: int = setting()  # the documents' shuffle before packing
    freeze_prefix: int | str = setting()  # a frozen prefix kept (docs/reliability.md); 0 = off
    quality: bool = setting("quality.enabled", versioned=False)  # the quality filter's removals applied (quality's parameter)


def pack_sequences(layout, params: PackParams, connect: Connect) -> StageResult:
    """Pack the documents (seeded shuffle) into ``seq_len``-token sequences with ``packing``:
    ``sequences/segments.parquet`` (each sequence's pieces as offsets into the token store),
    ``sequences/meta.json`` (seq_len, packing, freeze_prefix and the token store's fingerprint) and
    DuckDB ``packing_stats`` (with the tokens the clean stage removed, by reason: those documents
    are not packed, ``sequences/removed.parquet``; docs/cleaning.md). With ``freeze_prefix`` P the
    frozen prefixes recorded under ``frozen/`` keep their sequences and only the other tokens are
    packed (``pipeline/packing/frozen.py``): a removed document a frozen prefix holds stays (it was
    trained on); ``freeze_prefix: 0`` forgets every frozen prefix."""
    variant, atom = parse_packing(params.packing)
    n_frozen = frozen.frozen_count(params.freeze_prefix)
    if not n_frozen:
        frozen.unfreeze(layout, connect)
    records = frozen.load_all(layout)
    stream = np.diff(np.load(layout.doc_offsets, allow_pickle=False))
    gone, kept_frozen, keys = _removals(layout, records, params.quality)
    mask = None
    if gone is not None:
        mask = np.zeros(stream.size, bool)
        mask[gone["doc_id"].to_numpy()] = True
    removed = tokens_by_reason(gone, stream) if gone is not None else {}
    if variant == "concat" and atom is None and not records:  # the default: written as it is cut, a stretch at a time
        stream = narrow_lengths(stream)
        packed, report = pack_concat_file(_doc_order(stream.size, params.seed, mask), stream, params.seq_len, layout.segments)
    else:
        packed, records = _packed(records, keys, stream, variant, atom, params, mask)
        if records:  # before anything is overwritten
            tokens, offsets = open_tokens(layout.tokens, layout.doc_offsets)
            pad_id = load_tokenizer(layout.tokenizer).pad_token_id
            frozen.verify(records, SequenceStore(tokens, offsets, packed.segments, params.seq_len, pad_id=pad_id), tokens.dtype)
            del tokens, offsets
        report = packing_stats(packed)
    del stream, mask  # per-document arrays: not held while the segments are written
    applied, saved, kept = _write_sequences(layout, params, packed, gone, records, n_frozen)
    numbers = {k: float(v) for k, v in report.items() if not isinstance(v, str)}
    numbers.update({f"tokens_removed_{reason}": float(t) for reason, t in removed.items()})
    stats = pl.DataFrame({"metric": list(numbers), "value": list(numbers.values())})
    with connect() as con:
        replace_rows(con, "packing_stats", stats, {})
    return StageResult(
        outputs=[layout.segments, layout.sequences_meta, *applied, *saved],
        rows={"sequences": packed.n_sequences, "segments": int(report["segments"])},
        parameters={"seq_len": params.seq_len, "seed": params.seed, "packing": params.packing, "freeze_prefix": n_frozen},
        facts={"packing": params.packing, "tokens_in": packed.tokens_in, "tokens_dropped": packed.tokens_dropped,
               "padding_fraction": numbers["padding_fraction"], "docs_cut": int(numbers["docs_cut"]),
               "frozen_sequences_kept": kept, "flagged_kept_in_frozen_prefix": kept_frozen,
               **{f"tokens_removed_{reason}": t for reason, t in removed.items()}},
    )


def token_conservation(layout, params: PackParams, connect: Connect) -> CheckFact:
    """The ``sequences`` check: every token of every document appears exactly once in the sequences,
    except the reported dropped tail and the documents the clean stage removed (their tokens by
    reason, docs/cleaning.md); around a frozen prefix, dropped tails may lie mid-document
    (``pipeline/packing/frozen.py``)."""
    corpus_stream = narrow_lengths(np.diff(np.load(layout.doc_offsets, allow_pickle=False)))
    stream, removed = packed_stream(layout, corpus_stream)
    result = conservation_file(layout.segments, stream, params.seq_len, gaps=bool(load_all(layout)))
    with connect() as con:
        reported = dict(con.execute("SELECT metric, value FROM packing_stats").fetchall())
    passed = (bool(result["ok"]) and result["tokens_dropped"] == reported.get("tokens_dropped")
              and all(t == reported.get(f"tokens_removed_{r}", 0) for r, t in removed.items()))
    meta = ({k: v for k, v in result.items() if k != "ok"} | {"reported_dropped": reported.get("tokens_dropped")}
            | {"tokens_in_corpus": int(corpus_stream.sum())} | {f"tokens_removed_{r}": t for r, t in removed.items()})
    return CheckFact("token_conservation", passed, meta)


def _removals(layout, records: list, quality: bool) -> tuple[pl.DataFrame | None, int, object]:
    """``(the documents the clean stage (and with ``quality`` the quality filter) removes, how many of them a frozen prefix holds, the
    frozen documents' keys)``: a document a frozen prefix holds stays (it was trained on already);
    None without removals (docs/cleaning.md)."""

    gone, kept_frozen = removed_documents(layout, quality), 0
    keys = frozen.doc_keys(layout) if records else None
    if gone is not None and records:
        held = gone["doc_id"].is_in(pl.Series(frozen.frozen_docs(records, keys)).implode())
        kept_frozen, gone = int(held.sum()), gone.filter(~held)
    return gone, kept_frozen, keys


def _packed(records: list, keys, stream: np.ndarray, variant: str, atom, params: PackParams, mask: np.ndarray | None):
    """``(the packing, the frozen records)``: the frozen prefixes' sequences kept and the other
    tokens packed after them, or every document in a seeded shuffle; documents ``mask`` marks
    are left out."""

    if records:
        return frozen.pack_frozen(records, keys, stream, variant, atom, params.seq_len, params.packing, params.seed, leave_out=mask)
    order = _doc_order(stream.size, params.seed, mask)
    return pack(variant, order, stream, params.seq_len, atom_multiple=atom, seed=params.seed), records


def _doc_order(n_docs: int, seed: int, mask: np.ndarray | None) -> np.ndarray:
    """The documents in the packing's seeded shuffle, those ``mask`` marks left out (the rest keep their order)."""
    order = np.random.default_rng(seed).permutation(n_docs)
    return order if mask is None else order[~mask[order]]


def _write_sequences(layout, params: PackParams, packed, gone: pl.DataFrame | None, records: list, n_frozen: int) -> tuple[list, list, int]:
    """``sequences/segments.parquet``, the removals applied (``sequences/removed.parquet``, or an
    earlier one deleted), the frozen records and ``sequences/meta.json``: ``(applied, frozen
    files, sequences the frozen prefixes keep)``."""

    if packed.segments is not None:  # else written as it was made (pack_concat_file)
        write_parquet(packed.segments, layout.segments)
    applied = [write_parquet(gone.select(pl.col("doc_id").cast(pl.Int64), pl.col("removed").cast(pl.String)), applied_file(layout))] \
        if gone is not None else []
    if gone is None:
        applied_file(layout).unlink(missing_ok=True)  # an earlier packing's, which this one does not apply
    saved = [path for record in records for path in frozen.save(layout, record)]
    kept = int(np.unique(np.concatenate([r.sequence_ids for r in records])).size) if records else 0
    write_json({"seq_len": params.seq_len, "packing": params.packing, "freeze_prefix": n_frozen, "tokens": tokens_fingerprint(layout),
                **({"cleaned": True} if gone is not None else {})}, layout.sequences_meta)
    return applied, saved, kept
