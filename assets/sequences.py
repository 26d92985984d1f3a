"""sequences: packing of the documents (seeded random order) into L-token sequences."""


import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.common import Recorder, StrataSettings
from assets.params import PARAM_CLASSES, asset_config
from pipeline.packing import stage

SequencesParams = PARAM_CLASSES["sequences"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="data", deps=["tokens", "clusters", "clean", "quality"], code_version="1", kinds={"parquet"})
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
    One call of ``pipeline.packing.stage.pack_sequences``.
    """
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings, config), settings.layout()
    return rec.finish_stage(stage.pack_sequences(layout, stage.PackParams.from_config(cfg), duckdb.get_connection))
