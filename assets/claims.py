"""claims and claim_runs: each paper's measurable claim, reproduced on this corpus (pipeline/claims/)."""

import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.common import Recorder, StrataSettings
from assets.params import PARAM_CLASSES, asset_config
from pipeline.claims import stage as claim_stage
from pipeline.training import stage as training

ClaimsParams = PARAM_CLASSES["claims"]  # launchpad: this asset's parameters (assets/params.py)
ClaimRunsParams = PARAM_CLASSES["claim_runs"]


@dg.asset(group_name="ablation", deps=["orderings", "training_runs", "gradient_analyses", "embeddings", "clusters"],
          code_version="1", kinds={"duckdb", "matplotlib"})
def claims(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
           config: ClaimsParams) -> dg.MaterializeResult:
    """One row per claim of the papers, measured on this corpus: the paper's figure (quoted), Strata's
    figure with a 95% interval and the verdict the interval decides (DuckDB ``claims``; the
    four-strategy table of Diversity-ordered training in ``claims_diversity``, the epoch-boundary
    jump ratios in ``claims_epoch_jumps``), a figure per claim and ``report/claims.md``. Claims
    whose data this root lacks (the runs of ``claim_runs``, until ``strata claims --full``) are
    listed as not measured. One call of ``pipeline.claims.stage.measure_claims``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings, config), settings.layout()
    params = claim_stage.ClaimsParams.from_config(cfg)
    return rec.finish_stage(claim_stage.measure_claims(layout, params, duckdb.get_connection, log=context.log.info))


@dg.asset(group_name="ablation", deps=["tokens", "clusters", "embeddings", "corpus"], code_version="1", kinds={"pytorch"})
def claim_runs(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
               config: ClaimRunsParams) -> dg.MaterializeResult:
    """The training runs only the claims need (``strata claims --full``; pipeline/training/experiments.py):
    multi-epoch runs of a corpus sample in a topical order (grouped by source) and in the stratified order
    (Diversity-ordered training's epoch-boundary anomaly), and runs per packing — concat with each
    atom size of ``claims_atoms`` and padding — (Packing & shuffling), for every seed of
    ``claims_seeds``: in the paper's protocol (``claims_packing_protocol: paper``, 2 epochs of a
    sample at an MSL below the mean document length) or at equal tokens (``equal_tokens``).
    DuckDB ``claim_runs_log`` (per step), ``claim_runs_sequences`` (paper protocol: every
    sequence's training loss), ``claim_runs_heldout`` (equal tokens: the fixed held-out batch's
    per-document loss after the last step) and ``claim_runs_arms`` (what each run trained on).
    Materialize ``claims`` afterwards to turn them into claim rows. One call of
    ``pipeline.training.stage.train_claim_runs``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings, config), settings.layout()
    params = training.ClaimRunsParams.from_config(cfg)
    return rec.finish_stage(training.train_claim_runs(layout, params, duckdb.get_connection, log=context.log.info))
