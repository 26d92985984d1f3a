"""``paloma``: bits per byte on a directory in Paloma's layout (``paloma_dir``)."""

from __future__ import annotations

from pathlib import Path

from evals.suites import EvalSuite


def run(ctx) -> list[dict]:
    from evals.run import rolling_suite

    return rolling_suite(ctx, "paloma")


def find_in(folder: Path) -> dict[str, str]:
    for name in ("paloma", "paloma_fixture"):
        if (folder / name).is_dir():
            return {"paloma_dir": str(folder / name)}
    return {}


SPECS = (
    EvalSuite("paloma", "Paloma-layout <source>/<split>/*.jsonl.gz: bits per byte per subdomain and source", run,
              path_key="paloma_dir", reads=("paloma_dir",), find_in=find_in, order=30),
)
