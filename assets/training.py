"""training_runs (strategy x seed) and gradient_analyses: the ablation's models and their gradients."""

import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.common import RUN_PARTITIONS, TRAIN_POOL, Recorder, StrataSettings, run_key
from assets.on_ray import run_on_ray
from assets.params import PARAM_CLASSES, PARAMS, asset_config
from pipeline.training import stage

BY_STRATEGY = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name="strategy")


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
    strategy) on the partition's ordering — or, for a training-time strategy, on what the sampler
    its spec declares picks online (ODM: Exp3 over per-cluster pools). The partition's seed seeds
    the model init *and* the strategy's randomness (a seed-dependent ordering is re-run with it; a
    sampler draws with it). One call of ``pipeline.training.stage.train_run``.

    Writes ``runs/<strategy>/seed<seed>/model`` (``save_pretrained`` + tokenizer), ``log.parquet``,
    ``stream.parquet`` (the sequences trained on, in order) and ``heldout_curve.parquet``. Every
    ``checkpoint_every`` steps it writes ``ckpt.pt`` there; a killed run materialized again with the
    same settings and inputs resumes from it and writes the uninterrupted run's bytes; the file is
    removed once the outputs are written (docs/training.md, "Checkpoints and resume").
    DuckDB: ``train_log`` (per step), ``heldout_curve`` (the fixed held-out batch's per-document
    loss every ``heldout_every`` steps), ``consumed_metrics`` (diversity of the consumed stream),
    ``stable_rank`` (gradient stable ranks per layer at 20%/100% of steps), ``epoch_jumps`` and
    a sampler's mixture per step (ODM: ``odm_mixture``).
    """
    if (on_ray := run_on_ray(context, settings)) is not None:
        return on_ray
    strategy, seed = run_key(context)
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings, config), settings.layout()
    return rec.finish_stage(stage.train_run(layout, stage.TrainRunParams.from_config(cfg), strategy, seed, duckdb.get_connection,
                                            cfg.subset(PARAMS["training_runs"]), log=context.log.warning))


GradientAnalysesParams = PARAM_CLASSES["gradient_analyses"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="ablation", deps=["training_runs"], code_version="2", kinds={"pytorch"})
def gradient_analyses(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
                      config: GradientAnalysesParams) -> dg.MaterializeResult:
    """Mixture fidelity (TerRIFIC curricula): at one frozen checkpoint trained on non-overlapping
    data, as the paper measures it — a model trained on the held-out split (documents no schedule
    holds; same settings and init as the runs) for 20% of the runs' steps, saved under
    ``gradients/frozen`` — cosine similarity of the gradients of 10 consecutive chunks of each
    strategy's stream: a 10 x 10 matrix per strategy in DuckDB table ``fidelity``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings, config), settings.layout()
    return rec.finish_stage(stage.gradient_analyses(layout, stage.GradientParams.from_config(cfg), duckdb.get_connection))
