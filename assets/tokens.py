"""tokenizer, token_shards and tokens: a byte-level BPE trained on a sample of the corpus (or a given one) and token ids."""


import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.common import SHARD_PARTITIONS, Recorder, StrataSettings
from assets.params import PARAM_CLASSES, asset_config
from pipeline.data import stage

TokenizerParams = PARAM_CLASSES["tokenizer"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="data", deps=["corpus"], code_version="2", kinds={"huggingface"})
def tokenizer(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
              config: TokenizerParams) -> dg.MaterializeResult:
    """Train a byte-level BPE (``vocab_size`` ids) on a seeded sample of about ``tokenizer_sample_chars``
    characters of the training documents (streamed; all of them when the corpus is smaller), or copy a given tokenizer.
    One call of ``pipeline.data.stage.train_tokenizer``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings, config), settings.layout()
    return rec.finish_stage(stage.train_tokenizer(layout, stage.TokenizerParams.from_config(cfg)))


@dg.asset(group_name="data", deps=["corpus_shards", "tokenizer"], partitions_def=SHARD_PARTITIONS, code_version="1", kinds={"numpy"})
def token_shards(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Token ids of one corpus shard's training documents: ``tokens/shards/<validated>-<tokenizer>.bin``
    (flat ids, EOS after each document) + ``.parquet`` (per-document token, character and byte
    counts), in units of ``shard_docs`` documents on the configured ``engine`` (local or Ray). It
    reads only its shard's validated file, so an appended or edited shard is the only partition to
    run; with a trained tokenizer, a new tokenizer re-runs every partition. One call of
    ``pipeline.data.stage.tokenize_shard``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings), settings.layout()
    return rec.finish_stage(stage.tokenize_shard(layout, stage.TokenShardParams.from_config(cfg), context.partition_key))


@dg.asset(group_name="data", deps=["corpus", "tokenizer", "token_shards"], code_version="5", kinds={"numpy"})
def tokens(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Token ids of every document (``runs.parquet``: an index over the ``token_shards`` files, in
    corpus order, + ``doc_offsets.npy``) and ``documents.parquet`` (with the columns ``corpus.columns`` declares).

    Indexes the ``token_shards`` files in corpus order, the ids never copied (only the kept
    documents where ``corpus`` dropped some: duplicate ids, ``max_docs``); a shard whose files are
    missing (its partition was not run) is tokenized here, the same way. Memory: one shard's counts.
    One call of ``pipeline.data.stage.gather_token_ids``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings), settings.layout()
    return rec.finish_stage(stage.gather_token_ids(layout, stage.TokenShardParams.from_config(cfg)))
