"""The TerRIFIC mixture stage: target set, static mixture iterations, curriculum, runs, ablation.

mixture_target -> mixture_iterations[i] -> mixture_weights ─┐
               -> mixture_curriculum ───────────────────────┴-> mixture_runs[strategy] -> mixture_ablation
Library code: ``pipeline/mixture/`` (stage.py, terrific.py, loop.py, realize.py, target.py).
"""


import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.common import Recorder, StrataSettings
from pipeline.config_source import env_config
from pipeline.mixture import stage
from pipeline.mixture.stage import MIXTURE_STRATEGIES

ITERATION_PARTITIONS = dg.StaticPartitionsDefinition([str(i) for i in range(env_config().mixture.iterations)])
STRATEGY_PARTITIONS = dg.StaticPartitionsDefinition(list(MIXTURE_STRATEGIES))


@dg.asset(group_name="mixture", tags={"strata/order": "first"}, deps=["corpus", "tokenizer"], code_version="1", kinds={"numpy"})
def mixture_target(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """The target set V (``mixture.target_path``, else the held-out split of ``mixture.target_source``)
    split into a half that measures v and a half that scores models, plus the general held-out set.

    Writes ``mixture/target/documents.parquet`` (id, source, role, general, n_tokens, n_bytes) and
    its tokens (``tokens.bin``, ``doc_offsets.npy``, layout of the tokens asset). DuckDB
    ``mixture_target``. One call of ``pipeline.mixture.stage.target_set``."""
    rec = Recorder(context, duckdb)
    cfg, layout = settings.config(), settings.layout()
    return rec.finish_stage(stage.target_set(layout, stage.MixtureParams.from_config(cfg), duckdb.get_connection))

@dg.asset(group_name="mixture", tags={"strata/order": "first"}, deps=["tokens", "clusters", "mixture_target"],
          partitions_def=ITERATION_PARTITIONS, code_version="1", kinds={"pytorch"})
def mixture_iterations(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Static TerRIFIC iteration i: Train (fresh model on the realized mixture softmax(l_i), greedy
    order) -> Measure (Delta l at the final checkpoint; with ``mixture.static_method: terrific_avg``
    the mean Delta l over ``mixture.avg_checkpoints`` doubling checkpoints, TerRIFIC-AVG) ->
    Update (l_{i+1} = l_i + eta Delta l).
    l_0 = log corpus shares; iteration i > 0 reads iteration i-1's ``next_logit`` (recorded as an
    input of its lineage row, beside ``deps``). One call of ``pipeline.mixture.stage.static_iteration``.

    Writes ``mixture/iterations/<i>.parquet`` (iteration, cluster, logit, weight, score, delta,
    next_logit, corpus_share, selected, epochs). DuckDB ``mixture_iterations`` (same rows) and
    ``mixture_scores`` (iteration, metric, value: target_loss, heldout_loss, final_train_loss,
    measured_target_loss, clip_t, repeated_fraction)."""
    rec = Recorder(context, duckdb)
    cfg, layout = settings.config(), settings.layout()
    params = stage.MixtureParams.from_config(cfg)
    return rec.finish_stage(stage.static_iteration(layout, params, int(context.partition_key), duckdb.get_connection, log=context.log.info))


@dg.asset(group_name="mixture", tags={"strata/order": "first"}, deps=["mixture_iterations"], code_version="1", kinds={"parquet"})
def mixture_weights(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """The learned static mixture: ``mixture/weights.parquet`` (iteration, cluster, logit, weight) for
    every iteration's trained-on logits plus iteration = ``iterations`` (the final update, the
    mixture ``greedy_mixture`` uses), and ``mixture/weights.png``. DuckDB ``mixture_weights``.
    One call of ``pipeline.mixture.stage.learned_weights``."""
    rec = Recorder(context, duckdb)
    cfg, layout = settings.config(), settings.layout()
    return rec.finish_stage(stage.learned_weights(layout, stage.MixtureParams.from_config(cfg), duckdb.get_connection))

@dg.asset(group_name="mixture", tags={"strata/order": "first"}, deps=["tokens", "clusters", "mixture_target"], code_version="1",
          kinds={"pytorch"})
def mixture_curriculum(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """TerRIFIC curricula (Algorithm 1): ``mixture.curriculum_iterations`` meta-iterations from
    f_0 = log corpus shares, each training on the curriculum-greedy order of f_t with
    ``mixture.checkpoints`` log-uniform checkpoints. One call of ``pipeline.mixture.stage.curriculum``.
    Writes ``mixture/curriculum.yaml`` (the knots format of ``greedy_curriculum``),
    ``mixture/curriculum.parquet`` (meta_iteration, knot, tokens, cluster, logit, weight),
    ``mixture/curriculum.png``. DuckDB ``mixture_curriculum``, ``mixture_curriculum_steps``
    (meta_iteration, checkpoint, tokens, step, cluster, score, delta) and ``mixture_curriculum_scores``."""
    rec = Recorder(context, duckdb)
    cfg, layout = settings.config(), settings.layout()
    return rec.finish_stage(stage.curriculum(layout, stage.MixtureParams.from_config(cfg), duckdb.get_connection, log=context.log.info))


@dg.asset(group_name="mixture", tags={"strata/order": "last"}, deps=["mixture_weights", "mixture_curriculum"],
          partitions_def=STRATEGY_PARTITIONS, code_version="1", kinds={"pytorch"})
def mixture_runs(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Train on the learned mixture, for every training seed: ``greedy_mixture`` realizes the final
    static weights (greedy order), ``greedy_curriculum`` the learned curriculum (curriculum-greedy
    order of ``mixture/curriculum.yaml``). Same model, budget and optimizer as ``training_runs``.
    One call of ``pipeline.mixture.stage.mixture_run``.

    Writes ``mixture/orderings/<strategy>.parquet`` (position, sequence_id of the pool packing
    ``mixture/pool_segments.parquet``; ids repeat where the mixture repeats data),
    ``mixture/realization/<strategy>.parquet`` (cluster, weight, supply, selected, share, epochs,
    max_copies) and ``mixture/runs/<strategy>/seed<seed>/model``. DuckDB ``mixture_realization``."""
    rec = Recorder(context, duckdb)
    cfg, layout = settings.config(), settings.layout()
    params = stage.MixtureParams.from_config(cfg)
    return rec.finish_stage(stage.mixture_run(layout, params, context.partition_key, duckdb.get_connection, log=context.log.info))


@dg.asset(group_name="mixture", tags={"strata/order": "last"}, deps=["mixture_runs", "training_runs"], code_version="1", kinds={"duckdb"})
def mixture_ablation(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Rows ``random``, ``greedy`` (the ``training_runs`` models, when materialized),
    ``greedy_mixture`` and ``greedy_curriculum`` scored the same way: mean token loss on the target
    set's scoring half (``target_loss``) and on the general held-out set (``heldout_loss``), mean ±
    std over seeds. One call of ``pipeline.mixture.stage.mixture_ablation``. DuckDB
    ``mixture_ablation`` (strategy, metric, mean, std, n_seeds) and ``mixture/report.md`` with the figures."""
    rec = Recorder(context, duckdb)
    cfg, layout = settings.config(), settings.layout()
    return rec.finish_stage(stage.mixture_ablation(layout, stage.MixtureParams.from_config(cfg), duckdb.get_connection))
