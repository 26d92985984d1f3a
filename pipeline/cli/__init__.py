"""The library's own commands of ``strata``, which need no Dagster: ``schedule`` and ``schedule-docs``
(:mod:`pipeline.cli.schedule`), ``export`` (:mod:`pipeline.cli.export`), ``calibrate-k``,
``compare-clusterings``, ``compare-runs`` and ``lineage`` (:mod:`pipeline.cli.tools`) and ``report``
(:mod:`pipeline.cli.report`), each module's ``register(subparsers)`` adding its commands; and what
every command shares: the exit codes, the parser with usage errors on their own code, and
:func:`run_command`. The commands that materialize assets (``demo``, ``run``, ``status``,
``claims``, ``ablate``) and the ``strata`` entry point are the asset layer's, ``assets/cli/``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

import duckdb
from rich.console import Console
from rich.markdown import Markdown
from rich.table import Table

from pipeline.errors import StrataInputError, StrataRunError, storage_error
from pipeline.storage.layout import Layout

EXIT_FAILED = 1  # a step failed otherwise (StrataRunError): the message names the cause and the log file with the trace
EXIT_INPUT = 2  # bad input or configuration (StrataInputError): the message names the file, the value and the fix
EXIT_USAGE = 64  # command-line usage error (unknown command or option, missing argument): sysexits' EX_USAGE


class Parser(argparse.ArgumentParser):
    """argparse with usage errors on their own exit code (64), distinct from input errors (2)."""

    def error(self, message: str):  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: usage error: {message}\n")


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command (``args.func``); an input error or a failed step is printed, with its exit code."""
    try:
        return args.func(args)
    except StrataInputError as err:
        print(f"strata: error: {err}", file=sys.stderr)
        return EXIT_INPUT
    except StrataRunError as err:
        print(f"strata: error: {err}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as err:  # the storage refusing a write (full, read-only, the file-size limit): exit 2, the path and the fix
        if (clean := storage_error(err)) is None:
            raise
        print(f"strata: error: {clean}", file=sys.stderr)
        return EXIT_INPUT


def print_report(path: Path) -> None:
    """A markdown report rendered in the terminal."""
    Console().print(Markdown(Path(path).read_text(encoding="utf-8")))


def print_status(rows: list, root: Path, as_json: bool, corrupt: dict[str, tuple[str, str]] | None = None) -> None:
    """``strata status``'s rows (asset, partition, status, why): a table with the counts, or JSON;
    then each ``corrupt`` file (:func:`pipeline.storage.integrity.failing_digests`) with its fix."""
    if as_json:
        print(json.dumps([r.__dict__ for r in rows], indent=1))
        return
    corrupt = corrupt or {}
    colors = {"fresh": "green", "stale": "yellow", "missing": "red", "corrupt": "red"}
    table = Table(title=f"Strata status ({root})")
    for col in ("asset", "partition", "status", "why"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r.asset, r.partition or "", f"[{colors[r.status]}]{r.status}[/]", r.why)
    console = Console()
    console.print(table)
    counts = {s: sum(r.status == s for r in rows) for s in colors if s != "corrupt" or corrupt}
    console.print(", ".join(f"{n} {s}" for s, n in counts.items()))
    for rel, (want, now) in corrupt.items():
        console.print(f"[red]corrupt[/]: {root / rel}: its bytes (SHA-256 {now[:16]}...) are not those Strata wrote "
                      f"({want[:16]}...); rematerialize the asset that writes it (strata run), or restore the file", soft_wrap=True)


def print_claims(layout: Layout, as_json: bool, footer: Callable[[], str] = str) -> None:
    """The data root's ``claims`` rows (``strata claims``): one per claim with its verdict, those not
    measured and the report's path, then ``footer()``; or JSON."""
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        rows = con.sql("SELECT * FROM claims").pl()
        missing = con.sql("SELECT * FROM claims_not_measured").pl()
    if as_json:
        print(json.dumps(rows.to_dicts(), indent=1, default=str))
        return
    colors = {"reproduced": "green", "not reproduced": "red", "inconclusive": "yellow"}
    table = Table(title=f"Claims of the papers on this corpus ({layout.root})", show_lines=True)
    for col in ("paper", "claim", "paper's figure", "Strata [95% CI]", "claimed", "verdict"):
        table.add_column(col, overflow="fold")
    for r in rows.iter_rows(named=True):
        table.add_row(r["paper"], r["claim"], r["paper_figure"].split(" (\"")[0].split(": \"")[0],
                      f"{r['value']:.4g} [{r['ci_low']:.4g}, {r['ci_high']:.4g}]", f"{r['side']} {r['threshold']:g}",
                      f"[{colors[r['verdict']]}]{r['verdict']}[/]")
    console = Console()
    console.print(table)
    for r in missing.iter_rows(named=True):
        console.print(f"not measured: {r['claim']} ({r['reason']})")
    console.print(f"report: {layout.inside('report', 'claims', 'claims.md')}{footer()}")
