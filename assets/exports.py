"""exports: one partition per strategy, the ordering written for other trainers in Strata's order."""

from pathlib import Path

import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.common import STRATEGY_PARTITIONS, Recorder, StrataSettings
from assets.params import PARAM_CLASSES, asset_config
from pipeline.export import export_ordering
from pipeline.ordering import strategies


ExportsParams = PARAM_CLASSES["exports"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="orderings", deps=["orderings"], partitions_def=STRATEGY_PARTITIONS, code_version="1", kinds={"numpy"})
def exports(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
            config: ExportsParams) -> dg.MaterializeResult:
    """Write the partition's ordering in every format of ``export_formats`` under
    ``exports/<strategy>/<format>/`` (global batch ``export_global_batch`` or ``batch_size``,
    ``export_world_size`` ranks, ``export_workers`` workers; see docs/export.md)."""
    cfg, layout = asset_config(context, settings, config), settings.layout()
    strategy = context.partition_key
    scheduled = strategies.spec(strategy).scheduled
    if not scheduled or not cfg.export_formats:
        why = "picks sequences online (no fixed order)" if not scheduled else "export_formats is empty"
        return dg.MaterializeResult(metadata={"skipped": f"{strategy}: {why}"})
    rec = Recorder(context, duckdb, {"orderings": strategy})
    global_batch = cfg.export_global_batch or cfg.batch_size
    files, meta, digests = [], {}, {}
    for fmt in cfg.export_formats:
        if cfg.export_dir:  # a folder or an object-store prefix of the user's: replaced only where Strata wrote it
            from pipeline.storage.remote import is_url, join

            out = join(cfg.export_dir, strategy, fmt) if is_url(cfg.export_dir) else str(Path(cfg.export_dir).expanduser() / strategy / fmt)
        else:
            out = layout.export_dir(strategy, fmt)
        info = export_ordering(layout, strategy, fmt, out, global_batch=global_batch,
                               world_size=cfg.export_world_size, workers=cfg.export_workers,
                               force=not cfg.export_dir)  # the data root's own exports/ folder: Strata's, marked or not (an older export)
        files += info["files"]
        digests.update(info.get("digests", {}))
        meta[f"{fmt}/tokens_per_s"] = round(info["tokens"] / max(info["wall_s"], 1e-9))
        meta[f"{fmt}/kept_sequences"] = info["kept_sequences"]
        context.log.info(f"{fmt}: {info['sequences']} sequences in {info['wall_s']:.2f} s -> {info['dir']}")
    return rec.finish(
        sorted(files, key=lambda p: (not str(p).endswith("/meta.json"), str(p))),
        {"sequences": info["sequences"], "formats": len(cfg.export_formats)},
        {"strategy": strategy, "formats": list(cfg.export_formats), "global_batch": global_batch,
         "world_size": cfg.export_world_size, "workers": cfg.export_workers, "export_dir": cfg.export_dir},
        meta, digests=digests,
    )
