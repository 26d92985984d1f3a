"""The arguments of the commands that materialize or inspect the asset graph: ``demo``, ``run``,
``status``, ``claims`` and ``list``. Their handlers live with the Dagster layer (``assets/cli``),
which passes them to :func:`register` by command name."""

from __future__ import annotations

import argparse
from typing import Callable

REGISTRIES = ("strategies", "families", "formats", "suites", "claims")  # what `strata list` prints, in its order
ROOT_HELP = "data root; wins over data_root of the config, then $STRATA_HOME, then ./.strata"


def register(sub: argparse._SubParsersAction, handlers: dict[str, Callable[[argparse.Namespace], int]]) -> None:
    """Add the graph's commands to ``strata``, each handled by ``handlers[name]``."""
    demo = sub.add_parser("demo", help="run the whole pipeline on the built-in offline corpus")
    demo.add_argument("--data-root", default=None, help="data root (default: $STRATA_HOME or ./.strata)")
    demo.add_argument("--evals", default=None, metavar="DIR",
                      help="folder laid out like shared/data/eval (wikitext/, paloma[_fixture]/, dclm_core/): turns those evals on")
    demo.add_argument("--config", default=None, help=argparse.SUPPRESS)
    run = sub.add_parser("run", help="run the whole pipeline headless from a config file")
    run.add_argument("--config", required=True, help="YAML/JSON config (see README 'Configuration')")
    run.add_argument("--data-root", default=None, help=ROOT_HELP)
    run.add_argument("--select", default=None,
                     help="Dagster asset selection, e.g. '*orderings' (everything up to the orderings), 'training_runs+'")
    run.add_argument("--freeze-prefix", default=None, metavar="N|consumed:STEPSxBATCH|consumed:RUN_DIR",
                     help="keep the first N positions of every stream byte-identical while data is added (docs/reliability.md); "
                          "0 unfreezes")
    status = sub.add_parser("status", help="every asset/partition: fresh, stale (and why), missing or corrupt")
    status.add_argument("--config", default=None,
                        help="YAML/JSON config (default: $STRATA_CONFIG, else the data root's strata_config.yaml, else the defaults)")
    status.add_argument("--data-root", default=None, help=ROOT_HELP)
    status.add_argument("--json", action="store_true", help="print JSON rows (asset, partition, status, why)")
    claims = sub.add_parser("claims", help="each paper's measurable claim on this data root: figure, 95%% interval, verdict")
    claims.add_argument("--config", default=None, help="YAML/JSON config of the data root (default: $STRATA_CONFIG, else the defaults)")
    claims.add_argument("--data-root", default=None, help=ROOT_HELP)
    claims.add_argument("--full", action="store_true",
                        help="also train the claims' own runs (epoch boundary, packing; about 30 min on 2 cores at the demo's size)")
    claims.add_argument("--json", action="store_true", help="print the rows as JSON")
    listing = sub.add_parser("list", help="the registries: ordering strategies, families, export formats, eval suites, claims "
                                          "(with STRATA_PLUGINS' entries)")
    listing.add_argument("family", nargs="?", choices=REGISTRIES, help="which registry (default: all)")
    for name, parser in {"demo": demo, "run": run, "status": status, "claims": claims, "list": listing}.items():
        parser.set_defaults(func=handlers[name])
