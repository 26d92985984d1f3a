"""`strata schedule` (sequence-level) and `strata schedule-docs` (document-level) commands.

``register(subparsers)`` adds them to ``strata``; each subcommand's handler is ``args.func(args)``.
Their ``--strategy`` choices are the registry's strategies with an array API of that level
(``pipeline/ordering/strategies/``). ``run_cli(argv)`` parses and runs these two commands alone.
"""

from __future__ import annotations

import argparse
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.config import StrataConfig
from pipeline.errors import StrataInputError
from pipeline.names import OBJECTIVES
from pipeline.ordering import strategies
from pipeline.ordering.documents import WITHIN_SORTS
from pipeline.ordering.engine import OrderParams, document_order, sequence_order
from pipeline.ordering.features import sequence_features
from pipeline.ordering.greedy import greedy_mode
from pipeline.storage.atomic import write_parquet

SEGMENT_COLUMNS = ("sequence_id", "doc_id", "cluster", "doc_length", "n_tokens")
DOCUMENT_COLUMNS = ("doc_id", "cluster", "n_tokens")


def _read(path: str, columns: tuple[str, ...]) -> pl.DataFrame:
    p = Path(path)
    if not p.is_file():
        raise StrataInputError("the input file does not exist", fix="give the path of a parquet file", path=p)
    try:
        df = pl.read_parquet(p)
    except Exception as exc:  # polars raises several types for unreadable files
        raise StrataInputError(f"cannot read it as parquet ({type(exc).__name__})", fix="give a parquet file", path=p) from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise StrataInputError(f"missing column(s) {', '.join(missing)}", fix=f"provide columns {', '.join(columns)}", path=p)
    bad = [c for c in columns if df[c].null_count() or not df[c].dtype.is_integer()]
    if bad:
        raise StrataInputError(f"column(s) {', '.join(bad)} are not integers without nulls", fix="store them as integers", path=p)
    if len(df) == 0:
        raise StrataInputError("the table is empty", fix="give at least one row", path=p)
    return df


DEFAULTS = StrataConfig()  # every option's default is its config key's


def _params(args: argparse.Namespace) -> OrderParams:
    """The configuration's ordering knobs, with the options given on the command line (each option's
    ``dest`` is its :class:`OrderParams` field, named as the config key)."""
    given = {f.name: getattr(args, f.name) for f in fields(OrderParams) if hasattr(args, f.name)}
    if "families" in given:
        given["families"] = tuple(given["families"])
    return replace(OrderParams.from_config(DEFAULTS), **given)


def cmd_schedule(args: argparse.Namespace) -> int:
    """Order packed sequences; writes ORDER (position, sequence_id)."""
    seg = _read(args.segments, SEGMENT_COLUMNS)
    if (seg["n_tokens"] <= 0).any() or (seg["doc_length"] <= 0).any():
        raise StrataInputError("n_tokens and doc_length must be > 0", fix="drop empty spans", path=args.segments)
    params = _params(args)
    extra = {}
    for name in params.column_families():
        if name not in seg.columns:
            raise StrataInputError(f"the family {name!r} names no column", fix=f"add an integer column {name!r} (one category per span)",
                                   path=args.segments)
        extra[name] = seg[name].rank("dense").to_numpy().astype(np.int64) - 1
    f = sequence_features(
        seg["sequence_id"].to_numpy(), seg["cluster"].to_numpy(), seg["doc_length"].to_numpy(),
        seg["n_tokens"].to_numpy(), params.length_bins, seg["doc_id"].to_numpy(), seg_columns=extra,
        length_bin_weighting=params.length_bin_weighting,
    )  # fmt: skip
    rows = sequence_order(args.strategy, f, params, args.seed)
    ids = f.sequence_ids[rows]
    out = pl.DataFrame({"position": np.arange(ids.size, dtype=np.int64), "sequence_id": ids.astype(np.int64)})
    write_parquet(out, args.out)
    mode = f" ({greedy_mode(ids.size, params.greedy_exact_max)} greedy)" if strategies.spec(args.strategy).greedy_based else ""
    print(f"{args.strategy}{mode}: ordered {ids.size} {'positions' if strategies.spec(args.strategy).realizes_mixture else 'sequences'} -> "
          f"{args.out}")
    return 0


def cmd_schedule_docs(args: argparse.Namespace) -> int:
    """Order documents; writes ORDER (position, doc_id)."""
    docs = _read(args.documents, DOCUMENT_COLUMNS)
    if (docs["n_tokens"] <= 0).any() or (docs["cluster"] < 0).any():
        raise StrataInputError("n_tokens must be > 0 and cluster >= 0", fix="drop empty documents", path=args.documents)
    params = _params(args)
    local = document_order(args.strategy, docs["cluster"].to_numpy(), docs["n_tokens"].to_numpy(), args.seq_len, params)
    ids = docs["doc_id"].to_numpy()[local]
    out = pl.DataFrame({"position": np.arange(ids.size, dtype=np.int64), "doc_id": ids.astype(np.int64)})
    write_parquet(out, args.out)
    print(f"{args.strategy}: ordered {ids.size} documents -> {args.out}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `schedule` and `schedule-docs` to a parent parser's subcommands."""
    p = subparsers.add_parser("schedule", help="order packed sequences (greedy, random, ...)")
    p.add_argument("segments", help="parquet: sequence_id, doc_id, cluster, doc_length, n_tokens (one row per span)")
    p.add_argument("--strategy", choices=strategies.SEQUENCE_LEVEL, default="greedy",
                   help="; ".join(f"{n}: {strategies.spec(n).description}" for n in strategies.SEQUENCE_LEVEL))
    p.add_argument("--out", required=True, help="parquet to write: position, sequence_id")
    p.add_argument("--objective", choices=OBJECTIVES, default=DEFAULTS.objective,
                   help="greedy objective: stationary (default), Don't Shuffle, Optimize's f1/f2/f3, or custom (--families)")
    p.add_argument("--families", type=lambda v: [x for x in v.split(",") if x], default=list(DEFAULTS.families),
                   help="with --objective custom: name[:weight[:classes]],... e.g. cluster,length_bin:1,concentration:0.5:16; "
                        "an integer column of SEGMENTS named here becomes a token family")
    p.add_argument("--length-bins", "--bins", dest="length_bins", type=int, default=DEFAULTS.length_bins,
                   help=f"quantile document-length bins B (default {DEFAULTS.length_bins})")
    p.add_argument("--length-bin-weighting", "--bin-weighting", dest="length_bin_weighting", choices=("tokens", "documents"),
                   default=DEFAULTS.length_bin_weighting,
                   help="quantiles of the length bins: tokens (default, each bin ~1/B of the tokens) or documents (~1/B of the documents)")
    p.add_argument("--lambda", dest="lam", type=float, default=DEFAULTS.lam, help="weight of the length (f3) / norm (f2) term")
    p.add_argument("--noise", type=float, default=DEFAULTS.noise, help=f"sigma_sched in units of Lbar^2 (default {DEFAULTS.noise:g})")
    p.add_argument("--seed", type=int, default=DEFAULTS.seed)
    p.add_argument("--batch-size", "--block-size", dest="batch_size", type=int, default=DEFAULTS.batch_size,
                   help="sequences per training batch: greedy_block_shuffle's block, the greedy's repaired batches (default "
                        f"{DEFAULTS.batch_size})")
    p.add_argument("--curriculum", default=None, help="knots file (JSON/YAML) for greedy_curriculum")
    p.add_argument("--window", type=int, default=DEFAULTS.window, help="candidate pool of greedy_fast")
    p.add_argument("--greedy-exact-max", type=int, default=DEFAULTS.greedy_exact_max,
                   help=f"exact greedy up to this many sequences, blocked above (default {DEFAULTS.greedy_exact_max})")
    p.add_argument("--greedy-block", type=int, default=DEFAULTS.greedy_block,
                   help=f"sequences per block of the blocked greedy (default {DEFAULTS.greedy_block})")
    p.add_argument("--no-greedy-repair", dest="greedy_repair", action="store_false",
                   help="no swap repair of the greedy's worst batches (Don't Shuffle, Optimize's greedy as written)")
    p.add_argument("--mixture-weights-file", "--mixture-weights", dest="mixture_weights_file", default=None,
                   help="greedy_mixture: JSON/YAML mapping cluster -> weight")
    p.add_argument("--mixture-budget-tokens", type=int, default=DEFAULTS.mixture_budget_tokens,
                   help="greedy_mixture: tokens the schedule holds (default 0: all)")
    p.add_argument("--max-sequence-copies", "--max-repeats", dest="max_sequence_copies", type=int, default=DEFAULTS.max_sequence_copies,
                   help=f"greedy_mixture: copies of one sequence at most (default {DEFAULTS.max_sequence_copies})")
    p.set_defaults(func=cmd_schedule)
    d = subparsers.add_parser("schedule-docs", help="order documents before packing (stratified, ...)")
    d.add_argument("documents", help="parquet: doc_id, cluster, n_tokens")
    d.add_argument("--strategy", choices=strategies.DOCUMENT_LEVEL, default="stratified",
                   help="; ".join(f"{n}: {strategies.spec(n).description}" for n in strategies.DOCUMENT_LEVEL))
    d.add_argument("--out", required=True, help="parquet to write: position, doc_id")
    d.add_argument("--within", choices=WITHIN_SORTS, default=DEFAULTS.within, help="order inside each cluster")
    d.add_argument("--seq-len", type=int, default=DEFAULTS.seq_len, help=f"sequence length (bin_packing bins; default {DEFAULTS.seq_len})")
    d.add_argument("--seed", type=int, default=DEFAULTS.seed)
    d.set_defaults(func=cmd_schedule_docs)


def run_cli(argv: list[str]) -> int:
    """Parse ``argv`` with just these commands and run the chosen handler."""
    parser = argparse.ArgumentParser(prog="strata")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)
