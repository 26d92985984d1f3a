"""sequences: packing of the documents (seeded random order) into L-token sequences."""


import dagster as dg
import numpy as np
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.params import PARAM_CLASSES, asset_config
from assets.common import Recorder, StrataSettings
from pipeline.storage.atomic import write_json, write_parquet
from pipeline.packing import frozen
from pipeline.packing.pack import SequenceStore, pack, packing_stats, parse_packing
from pipeline.data.tokenizer import load_tokenizer
from pipeline.data.tokens import open_tokens
from pipeline.storage.layout import tokens_fingerprint
from pipeline.storage.warehouse import replace_rows


SequencesParams = PARAM_CLASSES["sequences"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="data", deps=["tokens", "clusters"], code_version="1", kinds={"parquet"})
def sequences(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
              config: SequencesParams) -> dg.MaterializeResult:
    """Pack documents (seeded shuffle) into ``seq_len``-token sequences with the configured
    ``packing`` (concat, padding, best_fit, atom-size shuffles; see pipeline/packing/pack.py).

    Writes ``sequences/segments.parquet`` (each sequence's pieces as offsets into the token store:
    no copy of the tokens; readers gather rows through ``SequenceStore``, e.g.
    ``pipeline.packing.stored.sequence_store(layout)``) and ``sequences/meta.json`` (seq_len, packing and the
    fingerprint of the token store packed: what readers of the sequences need to know).

    With ``freeze_prefix`` P (recorded in ``meta.json``, which ``orderings`` follows), the frozen
    prefixes recorded under ``frozen/`` by ``orderings`` are kept: their sequences keep their
    segments, tokens and (after an append) ids, and only the tokens outside them are packed
    (``pipeline/packing/frozen.py``). ``freeze_prefix: 0`` forgets every frozen prefix.
    """
    rec = Recorder(context, duckdb, {"tokens": None, "clusters": None})
    cfg, layout = asset_config(context, settings, config), settings.layout()
    tokens, offsets = open_tokens(layout.tokens, layout.doc_offsets)
    stream = np.diff(offsets)
    variant, atom = parse_packing(cfg.packing)
    n_frozen = frozen.frozen_count(cfg.freeze_prefix)
    if not n_frozen:
        frozen.unfreeze(layout, duckdb)
    records = frozen.load_all(layout)
    if records:
        packed, records = frozen.pack_frozen(records, frozen.doc_keys(layout), stream, variant, atom, cfg.seq_len, cfg.packing, cfg.seed)
    else:
        packed = pack(variant, np.random.default_rng(cfg.seed).permutation(stream.size), stream, cfg.seq_len, atom_multiple=atom, seed=cfg.seed)
    if records:  # before anything is overwritten
        pad_id = load_tokenizer(layout.tokenizer).pad_token_id
        frozen.verify(records, SequenceStore(tokens, offsets, packed.segments, cfg.seq_len, pad_id=pad_id), tokens.dtype)
    del tokens, offsets, stream  # per-document arrays: not held while the segments are written
    write_parquet(packed.segments, layout.segments)
    saved = [path for record in records for path in frozen.save(layout, record)]
    kept = int(np.unique(np.concatenate([r.sequence_ids for r in records])).size) if records else 0
    write_json({"seq_len": cfg.seq_len, "packing": cfg.packing, "freeze_prefix": n_frozen, "tokens": tokens_fingerprint(layout)},
               layout.sequences_meta)
    numbers = {k: float(v) for k, v in packing_stats(packed).items() if not isinstance(v, str)}
    stats = pl.DataFrame({"metric": list(numbers), "value": list(numbers.values())})
    with duckdb.get_connection() as con:
        replace_rows(con, "packing_stats", stats, {})
    return rec.finish(
        [layout.segments, layout.sequences_meta, *saved],
        {"sequences": packed.n_sequences, "segments": packed.segments.height},
        {"seq_len": cfg.seq_len, "seed": cfg.seed, "packing": cfg.packing, "freeze_prefix": n_frozen},
        {"packing": cfg.packing, "tokens_in": packed.tokens_in, "tokens_dropped": packed.tokens_dropped,
         "padding_fraction": numbers["padding_fraction"], "docs_cut": int(numbers["docs_cut"]),
         "frozen_sequences_kept": kept},
    )

