"""``strata ablate``: a sequential ablation campaign on a data root (assets/ablate.py drives pipeline/reports/campaign.py)."""

from __future__ import annotations

import argparse
import time


def cmd_ablate(args: argparse.Namespace) -> int:
    """Pilot, then rounds of seeds and held-out documents until every strategy has a verdict
    (better / worse / equivalent within ±effect) or the budget is spent; resumes a killed campaign."""
    from assets.ablate import run_campaign
    from assets.runner import prepare_environment
    from pipeline.cli.ablate import check_campaign
    from pipeline.config_source import config_or_demo
    from pipeline.reports.campaign import CampaignSpec, parse_budget

    t0 = time.perf_counter()
    budget_s, budget_tokens = parse_budget(args.budget)
    spec = CampaignSpec(tuple(args.strategies), args.baseline, args.metric, args.effect, budget_s, budget_tokens, args.pilot_seeds)
    check_campaign(spec)
    config = config_or_demo(args.config, args.data_root)
    cfg = prepare_environment(config, args.data_root)
    rows = run_campaign(spec, config, str(cfg.root))
    last = rows.filter(rows["round"] == rows["round"].max())
    print("verdicts: " + ", ".join(f"{r['strategy']} {r['verdict']}" for r in last.iter_rows(named=True)))
    print(f"report: {cfg.root / 'report' / 'ablate.md'}\ntotal time: {time.perf_counter() - t0:.0f} s")
    return 0


def register(sub) -> None:
    from pipeline.reports.stats import HELDOUT_METRIC, TARGET_EFFECT

    p = sub.add_parser("ablate", help="sequential ablation: add seeds and held-out documents until each strategy has a verdict")
    p.add_argument("--strategies", nargs="+", required=True, help="strategies compared with the baseline, e.g. greedy stratified")
    p.add_argument("--baseline", default="random", help="the baseline strategy (default: random)")
    p.add_argument("--metric", default=HELDOUT_METRIC,
                   help=f"metric (default {HELDOUT_METRIC}: held-out documents can be added; an evaluation metric keeps its documents)")
    p.add_argument("--effect", type=float, default=TARGET_EFFECT,
                   help="effect of interest and equivalence margin, a fraction of the baseline (0.005)")
    p.add_argument("--budget", required=True, help="wall time (90s, 60m, 2h) or training tokens ('5M tokens')")
    p.add_argument("--pilot-seeds", type=int, default=3, help="seeds of the pilot (default 3)")
    p.add_argument("--config", default=None,
                   help="YAML/JSON config (default: $STRATA_CONFIG, the data root's demo_config.yaml, or its recorded config)")
    p.add_argument("--data-root", default=None, help="data root; wins over data_root of the config, then $STRATA_HOME, then ./.strata")
    p.set_defaults(func=cmd_ablate)
