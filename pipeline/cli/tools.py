"""Standalone ``strata`` tools over the library (no Dagster): calibrate-k, compare-clusterings, compare-runs, lineage."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from pipeline.errors import StrataInputError
from pipeline.render.markdown import cell, table_lines
from pipeline.reports.compare_runs import DEFAULT_METRICS, compare_runs
from pipeline.reports.plots import plot_k_calibration
from pipeline.represent.agreement import compare, load_labels
from pipeline.represent.calibrate import DEFAULT_KS, calibrate_k
from pipeline.represent.embedding_index import open_embeddings
from pipeline.storage.atomic import write_text
from pipeline.storage.duck import duck_connection
from pipeline.storage.lineage import lineage_of


def cmd_calibrate_k(args: argparse.Namespace) -> int:
    """Run the k sweep, print a table, optionally write the plot."""
    path: Path = args.embeddings
    if not path.exists():
        raise StrataInputError("embeddings file not found", fix="pass an (N, d) .npy or a data root's embeddings/runs.parquet", path=path)
    try:
        ks = [int(k) for k in str(args.ks).split(",") if k.strip()]
    except ValueError:
        raise StrataInputError(f"--ks {args.ks!r} is not a list of integers", fix="write e.g. --ks 5,10,20") from None
    if path.suffix == ".parquet":
        x = open_embeddings(path)
    else:
        x = np.load(os.fspath(path), mmap_mode="r", allow_pickle=False)
    cal = calibrate_k(x, ks, sample_size=args.sample, seed=args.seed, niter=args.niter, threads=args.threads)
    table = Table(title=f"silhouette (cosine) vs k, sample {cal.sample_size:,}, seed {cal.seed}")
    table.add_column("k", justify="right")
    table.add_column("silhouette", justify="right")
    for k, s in zip(cal.ks, cal.silhouettes):
        mark = "  <- recommended" if k == cal.recommended_k else ""
        table.add_row(str(k), f"{s:.4f}{mark}")
    Console().print(table)
    print(f"recommended k = {cal.recommended_k} (largest k within 5% of the peak silhouette)")
    if args.plot is not None:
        print(f"wrote {plot_k_calibration(cal.ks, cal.silhouettes, cal.recommended_k, args.plot)}")
    return 0


def cmd_compare_clusterings(args: argparse.Namespace) -> int:
    """Print ARI/NMI between two clusterings and the Diversity-ordered-training reading of ARI."""
    a, b = load_labels(args.a), load_labels(args.b)
    if a.size != b.size:
        raise StrataInputError(f"{args.a} has {a.size} documents, {args.b} has {b.size}", fix="compare clusterings of the same corpus")
    r = compare(a, b)
    print(f"documents: {r['documents']}  clusters: {r['clusters_a']} (A) vs {r['clusters_b']} (B)")
    print(f"ARI: {r['ari']:.4f}")
    print(f"NMI: {r['nmi']:.4f}")
    print(f"reading: {r['reading']}")
    return 0


def cmd_compare_runs(args: argparse.Namespace) -> int:
    """Packing statistics beside ablation metrics, one row per data root and strategy."""
    df = compare_runs(args.roots, tuple(args.metric or DEFAULT_METRICS))
    table = Table(title="Runs compared")
    for col in df.columns:
        table.add_column(col, justify="left" if col in ("root", "packing", "strategy") else "right")
    for row in df.iter_rows():
        table.add_row(*["" if v is None else cell(v) for v in row])
    Console().print(table)
    if args.out:
        lines = table_lines(df.columns, (["" if v is None else v for v in r] for r in df.iter_rows()))
        write_text("\n".join(lines) + "\n", args.out)
    return 0


def render(tree: dict[str, Any]):
    """A ``rich.tree.Tree`` of :func:`lineage_of`'s result."""
    def label(node: dict[str, Any]) -> str:
        name = escape(node["asset"] + (f"[{node['partition']}]" if node.get("partition") else ""))
        if node.get("missing"):
            return f"[bold]{name}[/] data {node['data_version'] or '?'} [red](no lineage row for this version)[/]"
        stale = " [yellow]stale: re-materialized since[/]" if node.get("stale") else ""
        return (f"[bold]{name}[/] data {node['data_version']} code v{escape(node['code_version'] or '?')} "
                f"[dim]{node['created_at']} run {node['run_id'][:8]} {node['wall_s']:.1f}s on {escape(node['host'])}[/]{stale}")

    def add(branch, node: dict[str, Any]) -> None:
        if node.get("missing"):
            return
        if node["parameters"]:
            branch.add("params " + escape(json.dumps(node["parameters"], sort_keys=True, default=str)))
        if node["row_counts"]:
            branch.add("rows " + escape(", ".join(f"{k}={v}" for k, v in sorted(node["row_counts"].items()))))
        outputs = branch.add(f"outputs ({len(node['outputs'])})")
        for path, sha in sorted(node["outputs"].items()):
            outputs.add(f"{escape(path)} [dim]sha256 {sha[:16]}[/]")
        for child in node["inputs"].values():
            add(branch.add(label(child)), child)

    root = Tree(label(tree))
    add(root, tree)
    return root


def cmd_lineage(args: argparse.Namespace) -> int:
    """Print how ``args.asset`` was produced, as a tree (or JSON with ``--json``)."""
    root = Path(args.data_root or os.environ.get("STRATA_HOME") or ".strata").expanduser()
    db = root / "strata.duckdb"
    if not db.is_file():
        raise StrataInputError("no strata.duckdb here", path=root, fix="pass --data-root DIR of a run (or set STRATA_HOME)")
    with duck_connection(db, read_only=True) as con:
        tree = lineage_of(con, args.asset, args.partition)
    if args.json:
        print(json.dumps(tree, indent=2, sort_keys=True, default=str))
    else:
        Console().print(render(tree))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add calibrate-k, compare-clusterings, compare-runs and lineage to the ``strata`` command."""
    p = sub.add_parser("calibrate-k", help="sweep k: silhouette vs k on a sample, recommend k")
    p.add_argument("embeddings", type=Path, help="(N, d) float .npy of document embeddings, or a data root's embeddings/runs.parquet")
    p.add_argument("--ks", default=",".join(map(str, DEFAULT_KS)), help="comma-separated k values")
    p.add_argument("--sample", type=int, default=10_000, help="documents in the seeded sample")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--niter", type=int, default=20, help="k-means iterations")
    p.add_argument("--threads", type=int, default=1, help="faiss OpenMP threads")
    p.add_argument("--plot", type=Path, default=None, help="write the silhouette-vs-k PNG here")
    p.set_defaults(func=cmd_calibrate_k)

    p = sub.add_parser("compare-clusterings", help="ARI/NMI between two clusterings (clusters.parquet or .npy labels)")
    p.add_argument("a", help="clusters.parquet (doc_id, cluster) or .npy integer labels")
    p.add_argument("b", help="the other clustering of the same documents")
    p.set_defaults(func=cmd_compare_clusterings)

    p = sub.add_parser("compare-runs", help="packing statistics and ablation metrics across data roots")
    p.add_argument("roots", nargs="+", type=Path, help="data roots (e.g. one per packing variant)")
    p.add_argument("--metric", action="append", default=None, help=f"ablation metric (repeatable; default {', '.join(DEFAULT_METRICS)})")
    p.add_argument("--out", type=Path, default=None, help="also write the table as markdown here")
    p.set_defaults(func=cmd_compare_runs)

    p = sub.add_parser("lineage", help="show how an artifact was produced (corpus version, code, params)")
    p.add_argument("asset", help="asset name, e.g. clusters, orderings, training_runs")
    p.add_argument("--partition", default=None, help="partition (strategy) of a partitioned asset")
    p.add_argument("--data-root", default=None, help="data root (default: $STRATA_HOME or ./.strata)")
    p.add_argument("--json", action="store_true", help="print the resolved lineage as JSON")
    p.set_defaults(func=cmd_lineage)
