"""The ``strata`` command: run the asset graph headless, and the library's standalone tools."""

from __future__ import annotations

import argparse
import os
import sys
import time

from pipeline.cli import EXIT_FAILED, EXIT_INPUT, EXIT_USAGE, Parser, print_claims, print_report, print_status, run_command
from pipeline.cli.graph import REGISTRIES
from pipeline.config_source import config_or_demo, freeze_prefix_config
from pipeline.storage.integrity import failing_digests

__all__ = ["EXIT_FAILED", "EXIT_INPUT", "EXIT_USAGE", "build_parser", "main", "registry_rows"]


def _materialize(config_file: str | None, data_root: str | None, select: str | None = None) -> int:
    from assets.runner import materialize_all, prepare_environment

    t0 = time.perf_counter()
    cfg = prepare_environment(config_file, data_root)
    report = materialize_all(config_file, str(cfg.root), select=select)
    if report is not None:
        print_report(report)
        print(f"\nreport: {report}")
    print(f"total time: {time.perf_counter() - t0:.0f} s")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Materialize the whole graph on the built-in corpus: the defaults with seeds 0, 1, 2, the built-in
    quality scorer (and WikiText / Paloma / DCLM-core from ``--evals DIR``)."""
    from pathlib import Path

    from evals.suites import eval_paths
    from pipeline.cli.demo import demo_config, demo_lines

    root = Path(args.data_root or os.environ.get("STRATA_HOME") or ".strata").resolve()
    code = _materialize(str(demo_config(root, args.config, eval_paths(args.evals) if args.evals else None)), str(root))
    for line in demo_lines(root):  # the cleaning, the quality scorer, what a sequential campaign would need
        print(line)
    return code


def cmd_run(args: argparse.Namespace) -> int:
    """Materialize the graph (or the ``--select``ed assets) as configured in ``--config``; with
    ``--freeze-prefix``, that config with ``freeze_prefix`` set, written to ``<data root>/run_config.yaml``."""
    if args.freeze_prefix is None:
        return _materialize(args.config, args.data_root, args.select)
    return _materialize(str(freeze_prefix_config(args.config, args.data_root, args.freeze_prefix)), args.data_root, args.select)


def cmd_status(args: argparse.Namespace) -> int:
    """Every asset and partition of the configuration: fresh, stale (and why), missing, or corrupt (an
    output whose bytes are not those Strata recorded when it wrote them)."""
    import dagster as dg

    from assets.common import sync_partitions
    from assets.definitions import build_definitions
    from assets.runner import prepare_environment
    from assets.status import observe_corpus, statuses

    cfg = prepare_environment(args.config or os.environ.get("STRATA_CONFIG") or None, args.data_root)
    defs = build_definitions(os.environ.get("STRATA_CONFIG") or None, str(cfg.root))
    instance = dg.DagsterInstance.get()
    sync_partitions(instance, cfg, defs.resolve_asset_graph())
    observe_corpus(instance, cfg)
    corrupt = failing_digests(cfg.root)  # every file Strata recorded, read again
    print_status(statuses(defs, instance, cfg, corrupt), cfg.root, args.json, corrupt)
    return 0


def cmd_claims(args: argparse.Namespace) -> int:
    """Measure each paper's claim on this data root (materialize ``claims``; with ``--full`` first the
    claims' own runs, ``claim_runs``) and print one row per claim with its verdict."""
    from assets.runner import materialize_all, prepare_environment
    from pipeline.cli.report import claims_selection
    from pipeline.storage.layout import Layout

    t0 = time.perf_counter()
    config = config_or_demo(args.config, args.data_root)
    cfg = prepare_environment(config, args.data_root)
    layout = Layout(cfg.root)
    select = claims_selection(layout, args.full)
    materialize_all(config, str(cfg.root), select=select, log=(lambda m: print(m, file=sys.stderr)) if args.json else print)
    print_claims(layout, args.json, lambda: f"\ntotal time: {time.perf_counter() - t0:.0f} s")
    return 0


def registry_rows(family: str) -> list[tuple[str, str, str, str]]:
    """(name, kind, config keys read, description) of every entry of a registry (the eval suites' are evals')."""
    from evals.suites import suite_rows
    from pipeline.cli.registries import library_rows

    return suite_rows() if family == "suites" else library_rows(family)


def cmd_list(args: argparse.Namespace) -> int:
    """Print the entries of the registries: ordering strategies, characteristic families, export formats, eval suites,
    the papers' claims."""
    from pipeline.cli.registries import print_registries

    print_registries({family: registry_rows(family) for family in ([args.family] if args.family else REGISTRIES)})
    return 0


def build_parser() -> argparse.ArgumentParser:
    from assets.cli import ablate
    from pipeline.cli import export, graph, report, schedule, tools

    parser = Parser(prog="strata", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    graph.register(sub, {"demo": cmd_demo, "run": cmd_run, "status": cmd_status, "claims": cmd_claims, "list": cmd_list})
    report.register(sub)
    ablate.register(sub)
    schedule.register(sub)
    tools.register(sub)
    export.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from pipeline.offline import set_offline
    from pipeline.threads import set_thread_policy

    set_offline()
    set_thread_policy()
    return run_command(build_parser().parse_args(argv))

