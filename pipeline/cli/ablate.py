"""The arguments of ``strata ablate``, checked before a campaign starts: its errors name the
command's own flags (``--strategies``, ``--budget``), not config keys."""

from __future__ import annotations

from pipeline.errors import StrataInputError
from pipeline.ordering.strategies import names as strategy_names
from pipeline.reports.campaign import CampaignSpec


def check_campaign(spec: CampaignSpec) -> None:
    """Refuse a campaign that cannot reach a verdict: unknown strategies, the baseline against
    itself, no budget or two, an effect that is not a fraction, a pilot without a spread."""
    known = set(strategy_names())  # every registered strategy (STRATA_PLUGINS' too)
    for s in (*spec.strategies, spec.baseline):
        if s not in known:
            raise StrataInputError(f"unknown strategy {s!r}", fix=f"name strategies among {sorted(known)} (strata list strategies)")
    if not spec.strategies or spec.baseline in spec.strategies:
        raise StrataInputError("strata ablate needs strategies other than the baseline",
                               fix=f"pass --strategies with names other than {spec.baseline!r}, e.g. --strategies greedy")
    if (spec.budget_s is None) == (spec.budget_tokens is None):
        raise StrataInputError("strata ablate needs one budget", fix="pass --budget 60m (wall time) or --budget 5M tokens")
    if not (0 < spec.effect < 1):
        raise StrataInputError(f"effect {spec.effect!r} is not a fraction of the baseline",
                               fix="pass --effect 0.005 (0.5% of the baseline's mean)")
    if spec.pilot_seeds < 2:
        raise StrataInputError("the pilot needs at least 2 seeds (the seed-to-seed spread)", fix="pass --pilot-seeds 3")
