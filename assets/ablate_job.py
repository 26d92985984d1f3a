"""The ``ablate`` job: ``strata ablate`` from the Dagster UI (Launchpad: ``AblateJobConfig``'s fields).

The op runs the ``strata ablate`` command in a child process on this data root and streams its
progress into the run's log: the campaign itself materializes partitions of these definitions
(``assets.runner``), which these definitions must not import (tests/test_imports.py: no import
circles), and its runs then land in the same Dagster instance (the child inherits DAGSTER_HOME).

No ``from __future__ import annotations`` here: Dagster reads the op's config class from its annotation.
"""

import subprocess
import sys
from collections import deque

import dagster as dg

from assets.common import StrataSettings
from pipeline.reports.stats import HELDOUT_METRIC, TARGET_EFFECT


class AblateJobConfig(dg.Config):
    """``strata ablate``'s arguments: strategies, baseline, metric, effect, budget (``60m`` or
    ``5M tokens``), the pilot's seeds."""

    strategies: list[str]
    budget: str
    baseline: str = "random"
    metric: str = HELDOUT_METRIC
    effect: float = TARGET_EFFECT
    pilot_seeds: int = 3


def ablate_command(config: AblateJobConfig, config_file: str | None, data_root: str | None) -> list[str]:
    """The ``strata ablate`` command line of a Launchpad config."""
    cmd = [sys.executable, "-m", "assets.cli", "ablate", "--strategies", *config.strategies, "--budget", config.budget,
           "--baseline", config.baseline, "--metric", config.metric, "--effect", str(config.effect),
           "--pilot-seeds", str(config.pilot_seeds)]
    if config_file:
        cmd += ["--config", config_file]
    if data_root:
        cmd += ["--data-root", data_root]
    return cmd


@dg.op(description="Run or resume a sequential ablation campaign (strata ablate) on this data root")
def ablation_campaign_op(context: dg.OpExecutionContext, config: AblateJobConfig, settings: StrataSettings) -> None:
    cmd = ablate_command(config, settings.config_file or None, settings.data_root or None)
    tail: deque[str] = deque(maxlen=20)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        for line in proc.stdout:
            tail.append(line.rstrip())
            context.log.info(line.rstrip())
    if proc.returncode:
        raise dg.Failure(description=f"strata ablate exited with {proc.returncode}", metadata={"output": "\n".join(tail)})


@dg.job(description="strata ablate from the UI: pilot, rounds of seeds and held-out documents, verdicts (ablation_campaign)")
def ablate() -> None:
    ablation_campaign_op()
