"""``heldout``: bits per byte on the corpus's own held-out split (Paloma's layout, ``<data root>/heldout``)."""

from __future__ import annotations

from pathlib import Path

from evals.suites import EvalSuite


def run(ctx) -> list[dict]:
    from evals.run import rolling_suite

    return rolling_suite(ctx, "heldout")


def locate(cfg, layout) -> Path | None:
    return layout.heldout if layout.heldout.exists() and any(layout.heldout.rglob("*.jsonl.gz")) else None


SPECS = (
    EvalSuite("heldout", "the corpus's held-out split: bits per byte per subdomain and source (first eval_limit documents each)",
              run, locate=locate, order=20),
)
