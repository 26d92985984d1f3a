"""The ``strata`` command: run the asset graph headless, and the library's standalone tools."""

from __future__ import annotations

import argparse
import os
import sys
import time

from pipeline.errors import StrataInputError, StrataRunError


def _print_report(path) -> None:
    from rich.console import Console
    from rich.markdown import Markdown

    Console().print(Markdown(path.read_text(encoding="utf-8")))


def _materialize(config_file: str | None, data_root: str | None, select: str | None = None) -> int:
    from assets.runner import materialize_all, prepare_environment

    t0 = time.perf_counter()
    cfg = prepare_environment(config_file, data_root)
    report = materialize_all(config_file, str(cfg.root), select=select)
    if report is not None:
        _print_report(report)
        print(f"\nreport: {report}")
    print(f"total time: {time.perf_counter() - t0:.0f} s")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Materialize the whole graph on the built-in corpus: the defaults with seeds 0, 1, 2 (and
    WikiText / Paloma / DCLM-core from ``--evals DIR``)."""
    from pathlib import Path

    from assets.cli.demo import write_demo_config

    root = Path(args.data_root or os.environ.get("STRATA_HOME") or ".strata").resolve()
    code = _materialize(str(write_demo_config(root, args.config, args.evals)), str(root))
    from pipeline.clean.report import read_tables, summary_line
    from pipeline.storage.duck import duck_connection

    if (root / "strata.duckdb").is_file() and (line := summary_line(read_tables(lambda: duck_connection(root / "strata.duckdb")))):
        print(line)  # duplicates of each kind and the decontamination against the evals the demo runs
    from assets.ablate import demo_ablate_sentence

    if sentence := demo_ablate_sentence(root):  # what a sequential campaign would need to answer the question
        print(sentence)
    return code


def cmd_run(args: argparse.Namespace) -> int:
    """Materialize the graph (or the ``--select``ed assets) as configured in ``--config``; with
    ``--freeze-prefix``, that config with ``freeze_prefix`` set, written to ``<data root>/run_config.yaml``."""
    if args.freeze_prefix is None:
        return _materialize(args.config, args.data_root, args.select)
    import yaml

    from pipeline.config import config_from_dict, read_config_data, resolve_config

    data = read_config_data(args.config)  # a missing, non-UTF-8 or malformed file stops here, naming it
    value = args.freeze_prefix
    data["freeze_prefix"] = int(value) if value.strip().isdigit() else value
    try:
        config_from_dict({**data, "data_root": "."})  # a bad value stops here, naming the fix
    except StrataInputError as err:
        raise StrataInputError(err.problem, path=args.config, fix=err.fix) from None
    root = resolve_config(args.config, args.data_root).root
    root.mkdir(parents=True, exist_ok=True)
    path = root / "run_config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=True), encoding="utf-8")
    return _materialize(str(path), args.data_root, args.select)


def cmd_status(args: argparse.Namespace) -> int:
    """Every asset and partition of the configuration: fresh, stale (and why) or missing."""
    import json

    import dagster as dg
    from rich.console import Console
    from rich.table import Table

    from assets.common import sync_partitions
    from assets.definitions import build_definitions
    from assets.runner import prepare_environment
    from assets.status import observe_corpus, statuses

    cfg = prepare_environment(args.config or os.environ.get("STRATA_CONFIG") or None, args.data_root)
    defs = build_definitions(os.environ.get("STRATA_CONFIG") or None, str(cfg.root))
    instance = dg.DagsterInstance.get()
    sync_partitions(instance, cfg, defs.resolve_asset_graph())
    observe_corpus(instance, cfg)
    rows = statuses(defs, instance, cfg)
    if args.json:
        print(json.dumps([r.__dict__ for r in rows], indent=1))
        return 0
    colors = {"fresh": "green", "stale": "yellow", "missing": "red"}
    table = Table(title=f"Strata status ({cfg.root})")
    for col in ("asset", "partition", "status", "why"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r.asset, r.partition or "", f"[{colors[r.status]}]{r.status}[/]", r.why)
    console = Console()
    console.print(table)
    counts = {s: sum(r.status == s for r in rows) for s in colors}
    console.print(", ".join(f"{n} {s}" for s, n in counts.items()))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Print the ordering diagnostics and the ablation table of a data root; re-render the figures."""
    from pathlib import Path

    import duckdb
    import polars as pl
    from rich.console import Console
    from rich.table import Table

    from assets.common import env_config
    from pipeline.reports import diagnostics as D
    from pipeline.reports import stationarity as S
    from pipeline.reports import visual as V
    from pipeline.reports.diagnostics_report import ordering_schedules, write_diagnostics_report
    from pipeline.represent.embedding_index import has_embeddings, open_embeddings
    from pipeline.storage.layout import Layout

    cfg = env_config()
    root = Path(args.data_root).resolve() if args.data_root else cfg.root
    layout = Layout(root)
    if not layout.duckdb.exists():
        raise StrataInputError("no strata.duckdb in the data root", path=root,
                               fix="run `strata demo` or `strata run` first, or pass --data-root")
    from pipeline.ordering.strategies import training_time

    strategies = sorted(p.name.removesuffix(".parquet") for p in (root / "orderings").glob("*.parquet")
                        if not p.name.endswith(".segments.parquet") and p.name.removesuffix(".parquet") not in training_time())
    if not strategies:
        raise StrataInputError("no orderings in the data root", path=root, fix="materialize the orderings asset first")
    docs, schedules = ordering_schedules(layout, strategies, cfg.length_bins if args.length_bins is None else args.length_bins)
    metrics = pl.concat([D.ordering_diagnostics(s, sched, window_batch=cfg.batch_size, seed=cfg.seed) for s, sched in schedules.items()])
    emb = open_embeddings(layout) if has_embeddings(layout) else None
    prefix = cfg.max_steps * cfg.batch_size
    stationarity = pl.concat([S.stationarity_table(sched, prefix=prefix, strategy=s, n_random=cfg.stationarity_shuffles, seed=cfg.seed)
                              for s, sched in schedules.items()])
    summary, figures, md = write_diagnostics_report(layout, docs, schedules, emb, metrics, stationarity, prefix)
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
        _print_report(layout.report)
    console.print(f"figures: {', '.join(str(p) for p in figures.values())}\nreport: {md}")
    return 0


def cmd_claims(args: argparse.Namespace) -> int:
    """Measure each paper's claim on this data root (materialize ``claims``; with ``--full`` first the
    claims' own runs, ``claim_runs``) and print one row per claim with its verdict."""
    import json
    from pathlib import Path

    import duckdb
    from rich.console import Console
    from rich.table import Table

    from assets.runner import materialize_all, prepare_environment
    from pipeline.storage.layout import Layout

    t0 = time.perf_counter()
    config = args.config or os.environ.get("STRATA_CONFIG") or None
    demo = Path(args.data_root or os.environ.get("STRATA_HOME") or ".strata").resolve() / "demo_config.yaml"
    if config is None and demo.is_file():  # a data root made by `strata demo`: its settings
        config = str(demo)
    cfg = prepare_environment(config, args.data_root)
    layout = Layout(cfg.root)
    if not layout.ordering("greedy").exists() and not layout.segments.exists():
        raise StrataInputError("no packed sequences in the data root", path=cfg.root,
                               fix="run `strata demo` or `strata run` first (the claims read its orderings and runs), or pass --data-root")
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        has_report = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'ablation'").fetchone()[0]
    select = " or ".join(f"key:{a}" for a in (["claim_runs"] if args.full else []) + ["claims"]
                                              + (["ablation_report"] if has_report else []))
    materialize_all(config, str(cfg.root), select=select, log=(lambda m: print(m, file=sys.stderr)) if args.json else print)
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        rows = con.sql("SELECT * FROM claims").pl()
        missing = con.sql("SELECT * FROM claims_not_measured").pl()
    if args.json:
        print(json.dumps(rows.to_dicts(), indent=1, default=str))
        return 0
    colors = {"reproduced": "green", "not reproduced": "red", "inconclusive": "yellow"}
    table = Table(title=f"Claims of the papers on this corpus ({cfg.root})", show_lines=True)
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
    console.print(f"report: {layout.inside('report', 'claims', 'claims.md')}\ntotal time: {time.perf_counter() - t0:.0f} s")
    return 0


def registry_rows(family: str) -> list[tuple[str, str, str, str]]:
    """(name, kind, config keys read, description) of every entry of a registry."""
    if family == "strategies":
        from pipeline.ordering.strategies import REGISTRY as strategies

        return [(s.name, f"{s.level}{'' if s.seed_free else ', seeded'}{', greedy' if s.greedy_based else ''}", ", ".join(s.reads),
                 s.description) for s in strategies.entries().values()]
    if family == "formats":
        from pipeline.export.formats import REGISTRY as formats

        return [(f.name, "export format", ", ".join(f.reads), f.description) for f in formats.entries().values()]
    if family == "families":
        from pipeline.ordering.families import REGISTRY as families

        return [(f.name, f"{f.level} family" + (", repaired" if f.repaired else "")
                 + (f", diagnosed as {f.diagnosed}" if f.diagnosed else ""),
                 "", f.description) for f in families.entries().values()]
    from evals.suites import ordered

    return [(s.name, "eval suite" + (f", higher is better: {', '.join(s.higher_is_better)}" if s.higher_is_better else ""),
             ", ".join(s.reads), s.description) for s in ordered()]


def cmd_list(args: argparse.Namespace) -> int:
    """Print the entries of the registries: ordering strategies, characteristic families, export formats, eval suites."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for family in [args.family] if args.family else REGISTRIES:
        table = Table(title=family)
        for col in ("name", "kind", "reads", "description"):
            table.add_column(col, overflow="fold")
        for row in registry_rows(family):
            table.add_row(*row)
        console.print(table)
    return 0


REGISTRIES = ("strategies", "families", "formats", "suites")
EXIT_FAILED = 1  # a step failed otherwise (StrataRunError): the message names the cause and the log file with the trace
EXIT_INPUT = 2  # bad input or configuration (StrataInputError): the message names the file, the value and the fix
EXIT_USAGE = 64  # command-line usage error (unknown command or option, missing argument): sysexits' EX_USAGE


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on their own exit code (64), distinct from input errors (2)."""

    def error(self, message: str):  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: usage error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="strata", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the whole pipeline on the built-in offline corpus")
    demo.add_argument("--data-root", default=None, help="data root (default: $STRATA_HOME or ./.strata)")
    demo.add_argument("--evals", default=None, metavar="DIR",
                      help="folder laid out like shared/data/eval (wikitext/, paloma[_fixture]/, dclm_core/): turns those evals on")
    demo.add_argument("--config", default=None, help=argparse.SUPPRESS)
    demo.set_defaults(func=cmd_demo)
    run = sub.add_parser("run", help="run the whole pipeline headless from a config file")
    run.add_argument("--config", required=True, help="YAML/JSON config (see README 'Configuration')")
    run.add_argument("--data-root", default=None, help="data root; wins over data_root of the config, then $STRATA_HOME, then ./.strata")
    run.add_argument("--select", default=None,
                     help="Dagster asset selection, e.g. '*orderings' (everything up to the orderings), 'training_runs+'")
    run.add_argument("--freeze-prefix", default=None, metavar="N|consumed:STEPSxBATCH|consumed:RUN_DIR",
                     help="keep the first N positions of every stream byte-identical while data is added (docs/reliability.md); "
                          "0 unfreezes")
    run.set_defaults(func=cmd_run)
    status = sub.add_parser("status", help="every asset/partition: fresh, stale (and why) or missing")
    status.add_argument("--config", default=None,
                        help="YAML/JSON config (default: $STRATA_CONFIG, else the data root's strata_config.yaml, else the defaults)")
    status.add_argument("--data-root", default=None, help="data root; wins over data_root of the config, then $STRATA_HOME, then ./.strata")
    status.add_argument("--json", action="store_true", help="print JSON rows (asset, partition, status, why)")
    status.set_defaults(func=cmd_status)
    report = sub.add_parser("report", help="ordering diagnostics + ablation table of a data root (terminal, report/ PNGs)")
    report.add_argument("--data-root", default=None, help="data root (default: $STRATA_HOME or ./.strata)")
    report.add_argument("--length-bins", "--bins", dest="length_bins", type=int, default=None,
                        help="document-length bins for the diagnostics (default: the config's length_bins)")
    report.set_defaults(func=cmd_report)
    claims = sub.add_parser("claims", help="each paper's measurable claim on this data root: figure, 95%% interval, verdict")
    claims.add_argument("--config", default=None, help="YAML/JSON config of the data root (default: $STRATA_CONFIG, else the defaults)")
    claims.add_argument("--data-root", default=None, help="data root; wins over data_root of the config, then $STRATA_HOME, then ./.strata")
    claims.add_argument("--full", action="store_true",
                        help="also train the claims' own runs (epoch boundary, packing; about 30 min on 2 cores at the demo's size)")
    claims.add_argument("--json", action="store_true", help="print the rows as JSON")
    claims.set_defaults(func=cmd_claims)
    listing = sub.add_parser("list", help="the registries: ordering strategies, export formats, eval suites (with STRATA_PLUGINS' entries)")
    listing.add_argument("family", nargs="?", choices=REGISTRIES, help="which registry (default: all)")
    listing.set_defaults(func=cmd_list)
    from assets.cli import ablate, export, schedule, tools

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
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except StrataInputError as err:
        print(f"strata: error: {err}", file=sys.stderr)
        return EXIT_INPUT
    except StrataRunError as err:
        print(f"strata: error: {err}", file=sys.stderr)
        return EXIT_FAILED

