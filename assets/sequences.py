"""sequences: concat packing of the documents (seeded random order) into L-token sequences."""


import dagster as dg
import numpy as np
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.common import Recorder, StrataSettings
from pipeline.io import write_bin, write_parquet
from pipeline.packing import SequenceStore, pack_concat
from pipeline.tokens import open_tokens
from pipeline.warehouse import replace_rows


@dg.asset(group_name="data", deps=["tokens", "clusters"], code_version="1", kinds={"parquet"})
def sequences(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Pack documents (seeded shuffle) with EOS into ``seq_len``-token sequences.

    Writes ``sequences/segments.parquet`` and the M x L token matrix ``sequences/tokens.bin``.
    """
    rec = Recorder(context, duckdb, ["tokens", "clusters"])
    cfg, layout = settings.config(), settings.layout()
    tokens, offsets = open_tokens(layout.tokens, layout.doc_offsets)
    stream = np.diff(offsets)
    doc_order = np.random.default_rng(cfg.seed).permutation(stream.size)
    packed = pack_concat(doc_order, stream, cfg.seq_len)
    write_parquet(packed.segments, layout.segments)
    matrix = SequenceStore(tokens, offsets, packed.segments, cfg.seq_len).batch(np.arange(packed.n_sequences))[0]
    write_bin(matrix.astype(tokens.dtype), layout.sequence_matrix)
    stats = pl.DataFrame(
        {
            "metric": ["sequences", "seq_len", "tokens_in", "tokens_packed", "tokens_dropped", "segments"],
            "value": [packed.n_sequences, cfg.seq_len, packed.tokens_in, packed.tokens_packed, packed.tokens_dropped, packed.segments.height],
        }
    )
    with duckdb.get_connection() as con:
        replace_rows(con, "packing_stats", stats, {})
    return rec.finish(
        [layout.segments, layout.sequence_matrix],
        {"sequences": packed.n_sequences, "segments": packed.segments.height},
        {"seq_len": cfg.seq_len, "seed": cfg.seed, "packing": "concat"},
        {"tokens_in": packed.tokens_in, "tokens_dropped": packed.tokens_dropped},
    )

