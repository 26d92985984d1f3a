"""evaluations and ablation_report: lm-eval suites per trained model, then the strategy x metric table."""


import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.common import RUN_PARTITIONS, TRAIN_POOL, Recorder, StrataSettings, run_key
from assets.on_ray import run_on_ray
from assets.params import PARAM_CLASSES, asset_config
from evals import stage as evaluation
from evals.suites import is_higher_better
from pipeline.reports import stage as reports

EvaluationsParams = PARAM_CLASSES["evaluations"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="ablation", deps=["training_runs"], partitions_def=RUN_PARTITIONS, code_version="3", kinds={"parquet"},
          pool=TRAIN_POOL)
def evaluations(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
                config: EvaluationsParams) -> dg.MaterializeResult:
    """Evaluate the partition's model on every eval suite whose input is there (``evals/suites/``):
    lm-eval rolling log-likelihood (word/byte perplexity, bits per byte) on the held-out split (per
    source, Paloma-style), and when configured WikiText-2, a real Paloma directory and DCLM-core
    (llm-foundry scoring, centered accuracy, Core, gold bits-per-byte). Rows go to
    ``evals/<strategy>.parquet`` and DuckDB table ``eval_results``. One call of
    ``evals.stage.evaluate_run``."""
    if (on_ray := run_on_ray(context, settings)) is not None:
        return on_ray
    strategy, seed = run_key(context)
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings, config), settings.layout()
    params = evaluation.EvaluateParams.from_config(cfg)
    return rec.finish_stage(evaluation.evaluate_run(layout, params, strategy, seed, duckdb.get_connection))


AblationReportParams = PARAM_CLASSES["ablation_report"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="ablation", deps=["evaluations", "training_runs", "gradient_analyses", "claims"], code_version="5", kinds={"duckdb"})
def ablation_report(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
                    config: AblationReportParams) -> dg.MaterializeResult:
    """Strategy x metric table (the fixed held-out batch's final loss and every evaluation
    metric, mean ± std over seeds) in DuckDB ``ablation``; the difference of every strategy to
    ``random`` with a paired-bootstrap 95% interval over held-out documents and seeds, its
    significance and the minimum detectable effect in ``ablation_delta``; the power of the run and
    the run a 0.5% difference needs in ``ablation_power``; the consumed-stream diversity table;
    ``report.md``, opening with the positive control (``cluster_sorted``) and the power statement,
    with the power figure, held-out loss-vs-tokens curves (seed bands), training curves, stable
    ranks, the mixture fidelity heatmaps and the ODM mixture under ``report/``. One call of
    ``pipeline.reports.stage.ablation_report``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings, config), settings.layout()
    return rec.finish_stage(reports.ablation_report(layout, reports.AblationReportParams.from_config(cfg), duckdb.get_connection,
                                                    is_higher_better))
