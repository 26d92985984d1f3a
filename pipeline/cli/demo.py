"""``strata demo``'s parts that need no Dagster: its config (the demo settings, the user's keys, the
eval suites and, on the built-in corpus, the built-in quality scorer) and the summary lines it prints
after the run (``assets/cli/__init__.py:cmd_demo`` materializes the graph between the two)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.clean.report import read_tables
from pipeline.clean.report import summary_line as clean_line
from pipeline.config import StrataConfig, load_config
from pipeline.config_source import write_demo_config
from pipeline.quality.builtin_labels import builtin_quality
from pipeline.quality.report import summary_line as quality_line
from pipeline.reports.campaign import demo_ablate_sentence
from pipeline.storage.duck import duck_connection
from pipeline.storage.layout import Layout

LABELS = ("quality", "labels")  # where under the data root the demo writes the built-in scorer's label files


def demo_quality(root: Path, cfg: StrataConfig) -> dict[str, Any]:
    """``{"quality": ...}``, the built-in scorer (:mod:`pipeline.quality.builtin_labels`, the one
    docs/quality.md's ablation ran) with its label files written under ``<root>/quality/labels/``, when
    ``cfg`` reads the built-in corpus (no ``corpus.path``, no ``corpus.hf_dataset``) and sets no
    ``quality``; else nothing (a corpus of the user's has no labels the demo could train on)."""
    if "quality" in cfg.model_fields_set or cfg.corpus.path or cfg.corpus.hf_dataset:
        return {}
    return {"quality": builtin_quality(Layout(root).inside(*LABELS), cfg.corpus.builtin_max_docs)}


def demo_config(root: Path, config_file: str | None, eval_keys: Mapping[str, str] | None = None) -> Path:
    """``<root>/demo_config.yaml`` (:func:`pipeline.config_source.write_demo_config`) with :func:`demo_quality`."""
    return write_demo_config(root, config_file, eval_keys, demo_quality)


def demo_lines(root: Path) -> list[str]:
    """What ``strata demo`` prints after the run: the cleaning's duplicates and decontamination, the
    quality scorer's held-out AUC and figures (when the quality stage ran), and what a sequential
    campaign would need to answer the ablation's question."""
    db = root / "strata.duckdb"
    lines = [clean_line(read_tables(lambda: duck_connection(db))) if db.is_file() else None]
    config = root / "demo_config.yaml"
    lines.append(quality_line(Layout(root), load_config(config).quality) if config.is_file() else None)
    lines.append(demo_ablate_sentence(root))
    return [line for line in lines if line]
