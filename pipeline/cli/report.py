"""``strata report``: the ordering diagnostics and the ablation table of a data root, in the terminal,
with the figures re-rendered under ``report/``."""

from __future__ import annotations

import argparse
from pathlib import Path

import duckdb
import polars as pl
from rich.console import Console
from rich.table import Table

from pipeline.cli import print_report
from pipeline.config import resolve_config
from pipeline.config_source import config_source
from pipeline.errors import StrataInputError
from pipeline.ordering.strategies import training_time
from pipeline.quality.report import summary_line as quality_summary
from pipeline.reports import diagnostics as D
from pipeline.reports import stationarity as S
from pipeline.reports import visual as V
from pipeline.reports.diagnostics_report import ordering_schedules, write_diagnostics_report
from pipeline.reports.quality_stream import plot_quality_stream, quality_along_stream
from pipeline.represent.embedding_index import has_embeddings, open_embeddings
from pipeline.storage.layout import Layout


def cmd_report(args: argparse.Namespace) -> int:
    """Print the ordering diagnostics and the ablation table of a data root; re-render the figures."""
    cfg = resolve_config(*config_source(args.data_root))  # STRATA_CONFIG, else the root's recorded config
    root = Path(args.data_root).resolve() if args.data_root else cfg.root
    layout = Layout(root)
    if not layout.duckdb.exists():
        raise StrataInputError("no strata.duckdb in the data root", path=root,
                               fix="run `strata demo` or `strata run` first, or pass --data-root")
    # orderings/<strategy>.parquet; the strategy's other files there carry a second suffix (.segments, .mixture)
    strategies = sorted(s for p in (root / "orderings").glob("*.parquet")
                        if "." not in (s := p.name.removesuffix(".parquet")) and s not in training_time())
    if not strategies:
        raise StrataInputError("no orderings in the data root", path=root, fix="materialize the orderings asset first")
    docs, schedules = ordering_schedules(layout, strategies, cfg.length_bins if args.length_bins is None else args.length_bins)
    metrics = pl.concat([D.ordering_diagnostics(s, sched, window_batch=cfg.batch_size, seed=cfg.seed) for s, sched in schedules.items()])
    emb = open_embeddings(layout) if has_embeddings(layout) else None
    prefix = cfg.max_steps * cfg.batch_size
    stationarity = pl.concat([S.stationarity_table(sched, prefix=prefix, strategy=s, n_random=cfg.stationarity_shuffles, seed=cfg.seed)
                              for s, sched in schedules.items()])
    extra = {}
    if cfg.quality.enabled and layout.quality.exists():  # as diagnostics_report: the quality along each stream
        along, tokens = quality_along_stream(layout, strategies, prefix_sequences=prefix)
        extra["quality_along_stream"] = plot_quality_stream(along, tokens, layout.inside("report", "quality_along_stream.png"))
    summary, figures, md = write_diagnostics_report(layout, docs, schedules, emb, metrics, stationarity, prefix, extra)
    console = Console()
    table = Table(title=f"Ordering diagnostics ({root})")
    for col in summary.columns:
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for row in summary.iter_rows():
        table.add_row(*[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row])
    console.print(table)
    console.print(f"stationarity over tenths and the first {prefix:,} sequences, outside the band of "
                  f"{cfg.stationarity_shuffles} uniform shuffles:")
    for strategy, outside in V.stationarity_summary(stationarity).iter_rows():
        console.print(f"  {strategy}: {outside}", highlight=False)
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        has_ablation = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'ablation'").fetchone()[0]
    if has_ablation and layout.report.exists():
        print_report(layout.report)
    if line := quality_summary(layout, cfg.quality):
        print(line)  # one line, as strata demo prints it
    console.print(f"figures: {', '.join(str(p) for p in figures.values())}\nreport: {md}")
    return 0


def claims_selection(layout: Layout, full: bool) -> str:
    """The assets ``strata claims`` materializes: ``claims`` (first the claims' own runs, ``claim_runs``,
    with ``full``), then the ablation report where the root has one; an error when nothing is packed."""
    if not layout.ordering("greedy").exists() and not layout.segments.exists():
        raise StrataInputError("no packed sequences in the data root", path=layout.root,
                               fix="run `strata demo` or `strata run` first (the claims read its orderings and runs), or pass --data-root")
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        has_report = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'ablation'").fetchone()[0]
    return " or ".join(f"key:{a}" for a in (["claim_runs"] if full else []) + ["claims"] + (["ablation_report"] if has_report else []))


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``report`` to the ``strata`` command."""
    report = sub.add_parser("report", help="ordering diagnostics + ablation table of a data root (terminal, report/ PNGs)")
    report.add_argument("--data-root", default=None, help="data root (default: $STRATA_HOME or ./.strata)")
    report.add_argument("--length-bins", "--bins", dest="length_bins", type=int, default=None,
                        help="document-length bins for the diagnostics (default: the config's length_bins)")
    report.set_defaults(func=cmd_report)
