"""``strata export``: write an ordering for another trainer in any registered format (pipeline/export/formats/), in order."""

from __future__ import annotations

import argparse

from rich.console import Console
from tqdm import tqdm

from pipeline.config import resolve_config
from pipeline.export import export_ordering
from pipeline.export.formats import REGISTRY as FORMATS
from pipeline.export.stretches import Writers
from pipeline.storage.layout import Layout


def cmd_export(args: argparse.Namespace) -> int:
    cfg = resolve_config(args.config, args.data_root)
    layout = Layout(cfg.root)
    global_batch = args.global_batch or cfg.export.global_batch or cfg.batch_size
    bar = tqdm(desc=f"export {args.format}", unit="seq")
    try:
        info = export_ordering(layout, args.strategy, args.format, args.out, global_batch=global_batch,
                               seq_len=cfg.seq_len if "seq_len" in cfg.model_fields_set else None,
                               world_size=args.world_size, workers=args.workers, progress=bar.update,
                               force=args.force, writers=Writers(args.writers or cfg.export.writers, cfg.engine, cfg.ray))
    finally:
        bar.close()
    rate = info["tokens"] / info["wall_s"] if info["wall_s"] else float("inf")
    Console().print(
        f"[bold]{args.strategy}[/] -> {info['dir']} ({args.format}): {info['sequences']:,} sequences, "
        f"{info['tokens']:,} tokens in {info['wall_s']:.1f} s ({rate / 1e6:.1f}M tokens/s); "
        f"global batch {global_batch}, world size {args.world_size}, workers {args.workers}. "
        "Trainer settings that keep the order: docs/export.md"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help=f"write an ordering for another trainer ({', '.join(FORMATS.names())}), in Strata's order")
    p.add_argument("--strategy", required=True, help="ordering to export (orderings/<strategy>.parquet)")
    p.add_argument("--format", required=True, choices=FORMATS.names(),
                   help="output format (docs/export.md): " + "; ".join(f"{f.name}: {f.description}" for f in FORMATS.entries().values()))
    p.add_argument("--out", required=True,
                   help="output directory or object-store prefix (s3://bucket/prefix): a new or empty one, or an earlier "
                        "Strata export (replaced atomically; never a file, a folder above the current one, the data root's "
                        "stores or a bucket's root)")
    p.add_argument("--force", action="store_true",
                   help="replace a non-empty --out that is not a Strata export (everything in it is deleted)")
    p.add_argument("--global-batch", type=int, default=0, help="sequences per global batch (default: export.global_batch, else batch_size)")
    p.add_argument("--world-size", type=int, default=1, help="data-parallel ranks of the training run (the mds layout depends on it)")
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--writers", type=int, default=0,
                   help="workers writing the numpy / megatron files' stretches side by side, on the config's engine "
                        "(default: export.writers; the bytes are the same)")
    p.add_argument("--data-root", default=None, help="data root (default: the config's data_root, else $STRATA_HOME, else ./.strata)")
    p.add_argument("--config", default=None,
                   help="YAML/JSON config: the data root, the default global batch (export.global_batch, else batch_size); "
                        "a seq_len it sets is checked against the sequences' own")
    p.set_defaults(func=cmd_export)
