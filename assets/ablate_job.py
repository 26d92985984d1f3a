"""The ``ablate`` job: ``strata ablate`` from the Dagster UI (Launchpad: ``AblateJobConfig``'s fields).

No ``from __future__ import annotations`` here: Dagster reads the op's config class from its annotation.
"""

import dagster as dg
import polars as pl

from assets.ablate import HELDOUT, CampaignSpec, parse_budget, run_campaign
from assets.common import StrataSettings
from pipeline.reports.stats import TARGET_EFFECT

# --- the same campaign as a Dagster job (Launchpad: the fields below) ---------------------------------



class AblateJobConfig(dg.Config):
    """``strata ablate``'s arguments: strategies, baseline, metric, effect, budget (``60m`` or
    ``5M tokens``), the pilot's seeds."""

    strategies: list[str]
    budget: str
    baseline: str = "random"
    metric: str = HELDOUT
    effect: float = TARGET_EFFECT
    pilot_seeds: int = 3


@dg.op(description="Run or resume a sequential ablation campaign (strata ablate) on this data root")
def ablation_campaign_op(context: dg.OpExecutionContext, config: AblateJobConfig, settings: StrataSettings) -> None:
    budget_s, budget_tokens = parse_budget(config.budget)
    spec = CampaignSpec(tuple(config.strategies), config.baseline, config.metric, config.effect, budget_s, budget_tokens,
                        config.pilot_seeds)
    rows = run_campaign(spec, settings.config_file or None, settings.data_root, log=context.log.info, instance=context.instance)
    last = rows.filter(pl.col("round") == rows["round"].max())
    context.log.info("verdicts: " + ", ".join(f"{r['strategy']} {r['verdict']}" for r in last.iter_rows(named=True)))


@dg.job(description="strata ablate from the UI: pilot, rounds of seeds and held-out documents, verdicts (ablation_campaign)")
def ablate() -> None:
    ablation_campaign_op()
