"""The eval suites' registry: one :class:`EvalSuite` per suite, one module per suite in this folder,
plugins through ``STRATA_PLUGINS`` (``pipeline/registry.py``).

A suite runs when its input is there: ``locate(cfg, layout)`` finds it (by default the path the
config key ``path_key`` names; empty = off). ``run(ctx)`` scores the model (``ctx``: a
:class:`evals.run.SuiteRun`) and returns tidy rows ``{suite, task, metric, value, n}``. ``reads``
are the config keys its results depend on (the evaluations asset's parameters), and
``higher_is_better`` the metric names (the last part of ``suite/task/metric``) where higher is
better, which the ablation report's paired differences use. ``find_in(folder)`` locates its data
in a folder laid out like ``shared/data/eval`` (``strata demo --evals``), as ``{config key: path}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pipeline.errors import StrataInputError
from pipeline.registry import Registry


@dataclass(frozen=True)
class EvalSuite:
    name: str
    description: str
    run: Callable[..., list[dict[str, Any]]]  # (SuiteRun) -> rows {suite, task, metric, value, n}
    path_key: str | None = None  # StrataConfig key naming its input (a file or folder; "" = the suite is off)
    reads: tuple[str, ...] = ()  # StrataConfig keys its results depend on (path_key included)
    higher_is_better: tuple[str, ...] = ()  # metric names where higher is better (accuracies, scores)
    locate: Callable[[Any, Any], Path | None] | None = None  # (cfg, layout) -> input; default: cfg.<path_key>
    find_in: Callable[[Path], dict[str, str]] | None = None  # folder like shared/data/eval -> {config key: path}
    order: int = 100  # suites run (and their rows come) in ascending order, then by name

    def input(self, cfg: Any, layout: Any) -> Path | None:
        """Where this suite's input is under ``cfg`` and the data root ``layout``; None = do not run."""
        if self.locate is not None:
            return self.locate(cfg, layout)
        value = getattr(cfg, self.path_key) if self.path_key else ""
        return Path(value) if value else None


REGISTRY: Registry[EvalSuite] = Registry(EvalSuite, __name__, "eval suite")


def ordered() -> list[EvalSuite]:
    """The suites in the order they run."""
    return sorted(REGISTRY.entries().values(), key=lambda s: (s.order, s.name))


def reads() -> tuple[str, ...]:
    """The configuration keys the suites read, sorted."""
    return tuple(sorted({k for s in REGISTRY.entries().values() for k in s.reads}))


def higher_is_better() -> frozenset[str]:
    """Metric names where higher is better, over every suite."""
    return frozenset(m for s in REGISTRY.entries().values() for m in s.higher_is_better)


def is_higher_better(metric: str) -> bool:
    """Whether higher is better for ``suite/task/metric``: the metric names the eval suites declare
    (accuracies, Core scores); losses, perplexities, bits per byte: lower. The ablation report and
    ``strata ablate`` are given it (pipeline/ never imports evals/)."""
    return metric.rsplit("/", 1)[-1] in higher_is_better()


def check_heldout(cfg: Any, chosen: set[str]) -> None:
    """A StrataInputError before anything runs when ``heldout_fraction: 0`` leaves no held-out split and
    the selection ``chosen`` holds an asset that cannot do without one: ``gradient_analyses`` (its
    frozen checkpoint trains on held-out documents), and ``evaluations`` unless another suite's input
    is configured (each suite's ``path_key``: the held-out split is the default suite's input)."""
    if cfg.heldout_fraction > 0:
        return
    keys = [s.path_key for s in ordered() if s.path_key]
    needs = [a for a in ("evaluations", "gradient_analyses") if a in chosen
             and (a == "gradient_analyses" or not any(getattr(cfg, k, "") for k in keys))]
    if needs:
        raise StrataInputError(
            f"heldout_fraction: 0 leaves no held-out split, which {' and '.join(needs)} cannot do without"
            + (f" (no other eval suite is configured: {', '.join(keys)})" if "evaluations" in needs else ""),
            fix="set heldout_fraction > 0 (e.g. 0.02), or select only the assets that need no held-out documents "
                "(e.g. strata run --select '*orderings' or '*exports')")


def suite_rows() -> list[tuple[str, str, str, str]]:
    """``strata list suites``: (name, kind, config keys read, description) of every suite, in run order."""
    return [(s.name, "eval suite" + (f", higher is better: {', '.join(s.higher_is_better)}" if s.higher_is_better else ""),
             ", ".join(s.reads), s.description) for s in ordered()]


def eval_paths(evals_dir: str | Path) -> dict[str, str]:
    """Config keys for a folder laid out as ``shared/data/eval``, each eval suite's ``find_in``
    (``evals/suites/``): ``wikitext/wiki.test.raw``, ``paloma/`` or ``paloma_fixture/`` (Paloma's
    ``<source>/<split>/*.jsonl.gz``) and ``dclm_core/`` (llm-foundry's ``local_data/`` +
    ``eval_meta_data.csv``); the ones present."""
    root = Path(evals_dir).expanduser().resolve()
    if not root.is_dir():
        raise StrataInputError("evals folder not found", path=root, fix="pass a folder laid out like shared/data/eval")
    out: dict[str, str] = {}
    for suite in ordered():
        if suite.find_in is not None:
            out.update(suite.find_in(root))
    if not out:
        raise StrataInputError("no wikitext/wiki.test.raw, paloma[_fixture]/ or dclm_core/ in the evals folder", path=root,
                               fix="pass a folder laid out like shared/data/eval")
    return out
