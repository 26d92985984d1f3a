"""training_runs: a tiny decoder-only LM trained from scratch on each ordering."""


import dagster as dg
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.common import Recorder, StrataSettings
from assets.orderings import STRATEGY_PARTITIONS, load_ordering
from pipeline.io import atomic_dir, write_parquet
from pipeline.packing import SequenceStore
from pipeline.tokenizer import load_tokenizer
from pipeline.tokens import open_tokens
from pipeline.training import TrainSettings, train
from pipeline.warehouse import replace_rows


@dg.asset(group_name="ablation", deps=["orderings"], partitions_def=STRATEGY_PARTITIONS, code_version="1", kinds={"pytorch"})
def training_runs(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Train the same model (same init, budget, optimizer) on the partition's ordering.

    Writes ``runs/<strategy>/model`` (``save_pretrained`` + tokenizer) and ``runs/<strategy>/log.parquet``;
    per-step loss, grad norm, lr and tokens seen go to DuckDB table ``train_log``.
    """
    rec = Recorder(context, duckdb, ["orderings"])
    cfg, layout = settings.config(), settings.layout()
    strategy = context.partition_key
    order, segments = load_ordering(layout, strategy)
    tokens, offsets = open_tokens(layout.tokens, layout.doc_offsets)
    tok = load_tokenizer(layout.tokenizer)
    ts = TrainSettings(
        preset=cfg.model_preset, seq_len=cfg.seq_len, batch_size=cfg.batch_size, max_steps=cfg.max_steps,
        lr=cfg.lr, warmup_steps=cfg.warmup_steps, weight_decay=cfg.weight_decay, seed=cfg.seed,
    )
    model, log = train(SequenceStore(tokens, offsets, segments, cfg.seq_len), order, len(tok), tok.eos_token_id, tok.pad_token_id, ts)
    run_dir = layout.run_dir(strategy)
    with atomic_dir(run_dir / "model") as tmp:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
    log_df = pl.DataFrame(log).with_columns(strategy=pl.lit(strategy))
    write_parquet(log_df, run_dir / "log.parquet")
    with duckdb.get_connection() as con:
        replace_rows(con, "train_log", log_df, {"strategy": strategy})
    final = float(log_df["loss"].tail(max(1, len(log) // 10)).mean())
    return rec.finish(
        [run_dir / "model" / "model.safetensors", run_dir / "log.parquet"],
        {"steps": len(log), "tokens": int(log_df["tokens_seen"].max())},
        {**ts.__dict__, "strategy": strategy},
        {"final_loss": final, "tokens_per_s": float(log_df["tokens_per_s"].median()),
         "params": sum(p.numel() for p in model.parameters())},
        dep_partition=strategy,
    )
