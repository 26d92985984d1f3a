"""training_runs: a small decoder-only LM trained from scratch on each ordering, for each seed."""

import dagster as dg
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.common import Recorder, StrataSettings, run_key, run_partitions
from assets.orderings import STRATEGY_PARTITIONS, load_ordering
from pipeline.io import atomic_dir, write_parquet
from pipeline.packing import SequenceStore
from pipeline.tokenizer import load_tokenizer
from pipeline.tokens import open_tokens
from pipeline.training import TrainSettings, train
from pipeline.warehouse import replace_rows

RUN_PARTITIONS = run_partitions(STRATEGY_PARTITIONS)
BY_STRATEGY = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name="strategy")


@dg.asset(
    group_name="ablation",
    deps=[dg.AssetDep("orderings", partition_mapping=BY_STRATEGY)],
    partitions_def=RUN_PARTITIONS,
    code_version="2",
    kinds={"pytorch"},
)
def training_runs(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Train the same model (init from the partition's seed, same budget and optimizer for every
    strategy) on the partition's ordering.

    Writes ``runs/<strategy>/seed<seed>/model`` (``save_pretrained`` + tokenizer) and ``log.parquet``;
    per-step loss, grad norm, lr and tokens seen go to DuckDB table ``train_log``.
    """
    strategy, seed = run_key(context)
    rec = Recorder(context, duckdb, {"orderings": strategy})
    cfg, layout = settings.config(), settings.layout()
    order, segments = load_ordering(layout, strategy)
    tokens, offsets = open_tokens(layout.tokens, layout.doc_offsets)
    tok = load_tokenizer(layout.tokenizer)
    ts = TrainSettings(
        preset=cfg.model_preset, seq_len=cfg.seq_len, batch_size=cfg.batch_size, max_steps=cfg.max_steps,
        lr=cfg.lr, warmup_steps=cfg.warmup_steps, weight_decay=cfg.weight_decay, seed=seed,
    )
    store = SequenceStore(tokens, offsets, segments, cfg.seq_len, pad_id=tok.pad_token_id)
    model, log = train(store, order, len(tok), tok.eos_token_id, tok.pad_token_id, ts)
    run_dir = layout.run_dir(strategy, seed)
    with atomic_dir(run_dir / "model") as tmp:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
    log_df = pl.DataFrame(log).with_columns(strategy=pl.lit(strategy), seed=pl.lit(seed))
    write_parquet(log_df, run_dir / "log.parquet")
    with duckdb.get_connection() as con:
        replace_rows(con, "train_log", log_df, {"strategy": strategy, "seed": seed})
    final = float(log_df["loss"].tail(max(1, len(log) // 10)).mean())
    return rec.finish(
        [run_dir / "model" / "model.safetensors", run_dir / "log.parquet"],
        {"steps": len(log), "tokens": int(log_df["tokens_seen"].max())},
        {**ts.__dict__, "strategy": strategy},
        {"final_loss": final, "tokens_per_s": float(log_df["tokens_per_s"].median()),
         "params": sum(p.numel() for p in model.parameters())},
    )
