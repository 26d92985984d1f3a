"""corpus: the validated documents (training split) and the held-out split in Paloma layout."""


import dagster as dg
import numpy as np
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.params import PARAM_CLASSES, asset_config
from assets.common import Recorder, StrataSettings
from pipeline.data.corpus import content_hashes, corpus_fingerprint, heldout_mask, read_corpus
from evals.paloma import write_paloma_layout
from pipeline.storage.atomic import atomic_dir, write_parquet
from pipeline.storage.warehouse import replace_rows


@dg.observable_source_asset(group_name="data", description="The raw corpus (file, dataset or built-in); its data version is a hash of its content and reading options.")
def raw_corpus(settings: StrataSettings) -> dg.DataVersion:
    return dg.DataVersion(corpus_fingerprint(settings.config().corpus))


CorpusParams = PARAM_CLASSES["corpus"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="data", deps=["raw_corpus"], code_version="1", kinds={"parquet"})
def corpus(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
           config: CorpusParams) -> dg.MaterializeResult:
    """Read and validate the configured corpus; split off a seeded held-out set.

    Writes ``corpus.parquet`` (doc_id, id, text, source, subdomain, content_hash) for training
    and ``heldout/<source>/val/*.jsonl.gz`` (Paloma layout) for evaluation.
    """
    rec = Recorder(context, duckdb, {})
    cfg, layout = asset_config(context, settings, config), settings.layout()
    df, report = read_corpus(cfg.corpus, cfg.seed)
    df = df.with_columns(content_hashes(df["text"]))
    held = heldout_mask(df["content_hash"], cfg.heldout_fraction, cfg.seed)
    train = df.filter(pl.Series(~held)).with_row_index("doc_id").with_columns(pl.col("doc_id").cast(pl.Int64))
    heldout = df.filter(pl.Series(held))
    write_parquet(train, layout.corpus)
    with atomic_dir(layout.heldout) as tmp:
        if heldout.height:
            write_paloma_layout(heldout, tmp)
    held_files = sorted(layout.heldout.rglob("*.jsonl.gz"))
    stats = (
        df.with_columns(split=pl.Series(np.where(held, "heldout", "train")), n_chars=pl.col("text").str.len_chars())
        .group_by("source", "split").agg(n_docs=pl.len(), n_chars=pl.col("n_chars").sum()).sort("source", "split")
    )
    with duckdb.get_connection() as con:
        replace_rows(con, "corpus_stats", stats, {})
    if report.skipped:
        context.log.warning(f"skipped {len(report.skipped)} bad records in {report.path}: {report.skipped[:5]}")
    return rec.finish(
        [layout.corpus, *held_files],
        {"train_docs": train.height, "heldout_docs": heldout.height, "skipped": len(report.skipped)},
        {"corpus": cfg.corpus.path or cfg.corpus.hf_dataset or "builtin", "heldout_fraction": cfg.heldout_fraction, "seed": cfg.seed},
        {"sources": dg.MetadataValue.md(stats.to_pandas().to_markdown(index=False))},
    )
