"""The ``strata`` command: run the asset graph headless, and the library's standalone tools."""

from __future__ import annotations

import argparse
import os
import sys
import time

from pipeline.errors import StrataInputError


def _print_report(path) -> None:
    from rich.console import Console
    from rich.markdown import Markdown

    Console().print(Markdown(path.read_text(encoding="utf-8")))


def _materialize(config_file: str | None, data_root: str | None) -> int:
    from assets.runner import materialize_all, prepare_environment

    t0 = time.perf_counter()
    prepare_environment(config_file, data_root)
    report = materialize_all()
    _print_report(report)
    print(f"\nreport: {report}\ntotal time: {time.perf_counter() - t0:.0f} s")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Materialize the whole graph on the built-in corpus with the default configuration."""
    return _materialize(args.config, args.data_root)


def cmd_run(args: argparse.Namespace) -> int:
    """Materialize the whole graph as configured in ``--config``."""
    return _materialize(args.config, args.data_root)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="strata", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the whole pipeline on the built-in offline corpus")
    demo.add_argument("--data-root", default=None, help="data root (default: $STRATA_HOME or ./.strata)")
    demo.add_argument("--config", default=None, help=argparse.SUPPRESS)
    demo.set_defaults(func=cmd_demo)
    run = sub.add_parser("run", help="run the whole pipeline headless from a config file")
    run.add_argument("--config", required=True, help="YAML/JSON config (see README 'Configuration')")
    run.add_argument("--data-root", default=None, help="overrides data_root of the config")
    run.set_defaults(func=cmd_run)
    from pipeline import calibrate
    from pipeline.ordering import cli as ordering_cli

    ordering_cli.register(sub)
    calibrate.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(flag, "1")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except StrataInputError as err:
        print(f"strata: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
