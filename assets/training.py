"""training_runs (strategy x seed) and gradient_analyses: the ablation's models and their gradients."""

import dagster as dg
import numpy as np
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.params import PARAM_CLASSES, PARAMS, asset_config
from assets.common import RUN_PARTITIONS, TRAIN_POOL, Recorder, StrataSettings, run_key
from assets.on_ray import run_on_ray
from assets.orderings import load_ordering, seeded_ordering
from pipeline.storage.atomic import atomic_dir, write_parquet
from pipeline.packing.pack import SequenceStore
from pipeline.data.tokenizer import load_tokenizer
from pipeline.data.tokens import open_tokens
from pipeline.reports.consumed import consumed_diversity
from pipeline.training.checkpoint import Checkpointing
from pipeline.training.loop import TrainSettings, checkpoint_steps, epoch_boundary_jumps, stream_ids, train
from pipeline.storage.layout import Store
from pipeline.storage.warehouse import latest_data_version, replace_rows

BY_STRATEGY = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name="strategy")
FROZEN_FRACTION = 0.2  # the frozen checkpoint of mixture fidelity: a model at 20% of a run's steps
CLAIM_STRATEGIES = ("greedy", "random")  # their stable ranks are compared by the claims (claims_probe_batches each)


def probe_count(cfg, strategy: str) -> int:
    """Stable-rank probe batches per checkpoint: ``claims_probe_batches`` for the runs the claims
    pair (greedy, random), ``probe_batches`` for the others."""
    return max(cfg.probe_batches, cfg.claims_probe_batches) if strategy in CLAIM_STRATEGIES else cfg.probe_batches


def _store(layout, cfg, segments, tok) -> SequenceStore:
    tokens, offsets = open_tokens(layout.tokens, layout.doc_offsets)
    return SequenceStore(tokens, offsets, segments, Store(layout).sequences.seq_len, pad_id=tok.pad_token_id)


def load_heldout_batch(layout, cfg, tok):
    """The fixed held-out batch (same documents for every run), or None without held-out documents."""
    from evals.paloma import read_paloma_docs
    from pipeline.training.heldout import heldout_batch

    if not layout.heldout.exists() or not any(layout.heldout.rglob("*.jsonl.gz")):
        return None
    docs = read_paloma_docs(layout.heldout)  # sources in turn, so a small batch covers every source
    docs = docs.with_columns(r=pl.int_range(pl.len()).over("source")).sort("r", "source", maintain_order=True)
    units = [f"{s}/{i}" for s, i in zip(docs["source"].to_list(), docs["id"].to_list())]
    return heldout_batch(docs["text"].to_list(), units, tok, Store(layout).sequences.seq_len, cfg.heldout_docs)


TrainingRunsParams = PARAM_CLASSES["training_runs"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(
    group_name="ablation",
    deps=[dg.AssetDep("orderings", partition_mapping=BY_STRATEGY)],
    partitions_def=RUN_PARTITIONS,
    code_version="4",
    kinds={"pytorch"},
    pool=TRAIN_POOL,
)
def training_runs(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
                  config: TrainingRunsParams) -> dg.MaterializeResult:
    """Train the same model (same budget, optimizer, batch and sequence length for every
    strategy) on the partition's ordering — or, for ``odm``, on what ODM's Exp3 sampler picks
    online from per-cluster pools. The partition's seed seeds the model init *and* the strategy's
    randomness (a seed-dependent ordering is re-run with it; ODM's sampler draws with it).

    Writes ``runs/<strategy>/seed<seed>/model`` (``save_pretrained`` + tokenizer), ``log.parquet``,
    ``stream.parquet`` (the sequences trained on, in order) and ``heldout_curve.parquet``. Every
    ``checkpoint_every`` steps it writes ``ckpt.pt`` there; a killed run materialized again with the
    same settings and inputs resumes from it and writes the uninterrupted run's bytes; the file is
    removed once the outputs are written (docs/training.md, "Checkpoints and resume").
    DuckDB: ``train_log`` (per step), ``heldout_curve`` (the fixed held-out batch's per-document
    loss every ``heldout_every`` steps), ``consumed_metrics`` (diversity of the consumed stream),
    ``stable_rank`` (gradient stable ranks per layer at 20%/100% of steps), ``epoch_jumps`` and,
    for odm, ``odm_mixture``.
    """
    from pipeline.training.gradients import gradient_stable_ranks
    from pipeline.training.odm import ODMSampler, sequence_clusters

    if (on_ray := run_on_ray(context, settings)) is not None:
        return on_ray
    strategy, seed = run_key(context)
    rec = Recorder(context, duckdb, {"orderings": strategy})
    cfg, layout = asset_config(context, settings, config), settings.layout()
    order, segments = seeded_ordering(layout, cfg, strategy, seed)
    tok = load_tokenizer(layout.tokenizer)
    held = load_heldout_batch(layout, cfg, tok)
    curve: list[dict] = []

    def on_heldout(steps_done: int, tokens: int, losses: np.ndarray) -> None:
        curve.extend({"step": steps_done, "tokens_seen": tokens, "unit": u, "loss": float(v)} for u, v in zip(held.units, losses))

    store = _store(layout, cfg, segments, tok)
    ts = TrainSettings.from_config(cfg, seed)
    run_dir = layout.run_dir(strategy, seed)
    sampler = None
    n_steps = ts.steps(store.n_sequences if strategy == "odm" else order.size)
    if strategy == "odm":
        doc_cluster = pl.read_parquet(layout.clusters).sort("doc_id")["cluster"].to_numpy()
        sampler = ODMSampler(sequence_clusters(segments, doc_cluster), n_steps, seed=seed,
                             smoothing=cfg.odm_smoothing, warmup_fraction=cfg.odm_warmup_fraction,
                             micro_batches=cfg.odm_micro_batches or None, clock=cfg.odm_clock,
                             initial_weights=cfg.odm_initial_weights)
    probes: list[pl.DataFrame] = []

    def restore(state: dict) -> None:
        curve[:], probes[:] = state["curve"], state["probes"]

    with duckdb.get_connection() as con:
        inputs = {f"{a}[{p}]" if p else a: latest_data_version(con, a, p)
                  for a, p in (("corpus", None), ("tokens", None), ("clusters", None), ("sequences", None), ("orderings", strategy))}
    ckpt = Checkpointing(run_dir / "ckpt.pt", cfg.checkpoint_every, key={"inputs": inputs, "params": cfg.subset(PARAMS["training_runs"])},
                         state=lambda: {"curve": curve, "probes": probes}, restore=restore, log=context.log.warning)
    fractions = {checkpoint_steps(n_steps, [f])[0]: f for f in cfg.probe_fractions}
    n_probe = probe_count(cfg, strategy)

    def probe(steps_done: int, model) -> None:
        if sampler is not None:  # ODM's next batches do not exist yet: its last served batches
            stream, start, epochs = sampler.served_ids(), max(0, steps_done - n_probe), 0
        else:  # the batches the schedule serves next (past the end of the run: the ones it would)
            stream, start, epochs = order, steps_done, cfg.epochs
        rows = gradient_stable_ranks(model, store, stream, range(start, start + n_probe), cfg.batch_size, cfg.cross_document, epochs,
                                     matrix=cfg.stable_rank_matrix)
        probes.append(rows.with_columns(checkpoint=pl.lit(f"{round(fractions[steps_done] * 100)}%")))

    model, log = train(store, None if sampler else order, len(tok), tok.eos_token_id, tok.pad_token_id, ts,
                       sampler=sampler, checkpoints=sorted(fractions), on_checkpoint=probe, heldout=held,
                       on_heldout=on_heldout, checkpointing=ckpt)
    with atomic_dir(run_dir / "model") as tmp:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
    key = {"strategy": strategy, "seed": seed}
    log_df = pl.DataFrame(log).with_columns(strategy=pl.lit(strategy), seed=pl.lit(seed))
    served = sampler.served_ids() if sampler is not None else stream_ids(order, n_steps, cfg.batch_size, cfg.epochs)
    # tokens_per_s is wall-clock throughput: kept in DuckDB, left out of the (deterministic) artifact
    outputs = [write_parquet(log_df.drop("tokens_per_s"), run_dir / "log.parquet"),
               write_parquet(pl.DataFrame({"position": np.arange(served.size), "sequence_id": served}), run_dir / "stream.parquet")]
    jumps = pl.DataFrame(epoch_boundary_jumps(log), infer_schema_length=None)
    doc_cluster = pl.read_parquet(layout.clusters).sort("doc_id")["cluster"].to_numpy()
    consumed = pl.DataFrame([{"metric": k, "value": v} for k, v in consumed_diversity(served, segments, doc_cluster, cfg.batch_size).items()])
    consumed = consumed.with_columns(strategy=pl.lit(strategy), seed=pl.lit(seed))
    curve_df = pl.DataFrame(curve, schema={"step": pl.Int64, "tokens_seen": pl.Int64, "unit": pl.String, "loss": pl.Float64})
    curve_df = curve_df.with_columns(strategy=pl.lit(strategy), seed=pl.lit(seed))
    outputs.append(write_parquet(curve_df, run_dir / "heldout_curve.parquet"))
    with duckdb.get_connection() as con:
        replace_rows(con, "train_log", log_df, key)
        replace_rows(con, "consumed_metrics", consumed, key)
        if curve_df.height:
            replace_rows(con, "heldout_curve", curve_df, key)
        if probes:
            replace_rows(con, "stable_rank", pl.concat(probes).with_columns(strategy=pl.lit(strategy), seed=pl.lit(seed)), key)
        if jumps.height:
            replace_rows(con, "epoch_jumps", jumps.with_columns(strategy=pl.lit(strategy), seed=pl.lit(seed)), key)
        if sampler is not None:
            mixture = sampler.mixture_rows().with_columns(strategy=pl.lit(strategy), seed=pl.lit(seed))
            outputs.append(write_parquet(mixture, run_dir / "odm_mixture.parquet"))
            replace_rows(con, "odm_mixture", mixture, key)
    ckpt.remove()
    last = curve_df.filter(pl.col("step") == pl.col("step").max()) if curve_df.height else None
    final = float(last["loss"].mean()) if last is not None else float("nan")
    return rec.finish(
        [run_dir / "model" / "model.safetensors", *outputs],
        {"steps": len(log), "tokens": int(log_df["tokens_seen"].max())},
        {**ts.__dict__, "strategy": strategy},
        {"heldout_batch_loss": final, "tokens_per_s": float(log_df["tokens_per_s"].median()),
         "params": sum(p.numel() for p in model.parameters()),
         "epoch_jumps_flagged": int(jumps["flagged"].sum()) if jumps.height else 0,
         "resumed_from_step": ckpt.resumed_from if ckpt.resumed_from is not None else 0},
    )


GradientAnalysesParams = PARAM_CLASSES["gradient_analyses"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="ablation", deps=["training_runs"], code_version="2", kinds={"pytorch"})
def gradient_analyses(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
                      config: GradientAnalysesParams) -> dg.MaterializeResult:
    """Mixture fidelity (TerRIFIC curricula): at one frozen checkpoint trained on non-overlapping
    data, as the paper measures it — a model trained on the held-out split (documents no schedule
    holds; same settings and init as the runs) for 20% of the runs' steps, saved under
    ``gradients/frozen`` — cosine similarity of the gradients of 10 consecutive chunks of each
    strategy's stream: a 10 x 10 matrix per strategy in DuckDB table ``fidelity``."""
    from dataclasses import replace

    from evals.paloma import read_paloma_docs
    from pipeline.training.gradients import fidelity_rows, mixture_fidelity
    from pipeline.training.heldout import heldout_store

    rec = Recorder(context, duckdb, {"training_runs": "*"})
    cfg, layout = asset_config(context, settings, config), settings.layout()
    tok = load_tokenizer(layout.tokenizer)
    if not layout.heldout.exists() or not any(layout.heldout.rglob("*.jsonl.gz")):
        from pipeline.errors import StrataInputError

        raise StrataInputError("no held-out documents to train the frozen checkpoint on", path=layout.heldout,
                               fix="set heldout_fraction > 0 (mixture fidelity needs a model trained on documents no schedule holds)")
    held = heldout_store(read_paloma_docs(layout.heldout)["text"].to_list(), tok, Store(layout).sequences.seq_len)
    frozen_steps = checkpoint_steps(cfg.max_steps, [FROZEN_FRACTION])[0]
    model, _ = train(held, np.random.default_rng(cfg.seed).permutation(held.n_sequences), len(tok), tok.eos_token_id,
                     tok.pad_token_id, replace(TrainSettings.from_config(cfg, cfg.seeds[0]), epochs=0), stop_after=frozen_steps)
    frozen = layout.inside("gradients", "frozen")
    with atomic_dir(frozen) as tmp:
        model.save_pretrained(str(tmp))
    frames, matrices = [], {}
    for strategy in cfg.strategies:
        stream_path = layout.run_dir(strategy, cfg.seeds[0]) / "stream.parquet"
        if not stream_path.exists():
            continue
        order, segments = load_ordering(layout, strategy)
        # the whole schedule; odm has no schedule beyond the stream its sampler served
        stream = pl.read_parquet(stream_path).sort("position")["sequence_id"].to_numpy() if strategy == "odm" else order
        n_chunks = min(cfg.fidelity_chunks, stream.size)
        if n_chunks < 2:
            continue
        m = mixture_fidelity(model, _store(layout, cfg, segments, tok), stream, n_chunks=n_chunks,
                             sequences_per_chunk=min(cfg.fidelity_sequences_per_chunk, max(1, stream.size // n_chunks)),
                             batch_size=cfg.batch_size, cross_document=cfg.cross_document)
        matrices[strategy] = m
        frames.append(fidelity_rows(m).with_columns(strategy=pl.lit(strategy)))
    table = pl.concat(frames) if frames else pl.DataFrame(schema={"chunk_i": pl.Int64, "chunk_j": pl.Int64, "cosine": pl.Float64, "strategy": pl.String})
    out = write_parquet(table, layout.inside("gradients", "fidelity.parquet"))
    with duckdb.get_connection() as con:
        replace_rows(con, "fidelity", table, {})
    off = {s: float(m[~np.eye(m.shape[0], dtype=bool)].mean()) for s, m in matrices.items()}
    return rec.finish([out, frozen / "model.safetensors"], {"strategies": len(matrices)},
                      {"chunks": cfg.fidelity_chunks, "frozen_steps": frozen_steps, "frozen_sequences": held.n_sequences},
                      {"mean_offdiagonal_cosine": dg.MetadataValue.json(off)})
