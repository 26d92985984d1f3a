"""The export stage: a strategy's ordering written in every format of ``export_formats`` (``exports``)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from pipeline.stage import StageResult


def export_skipped(cfg, strategy: str) -> str | None:
    """Why ``strategy`` has nothing to export (a training-time strategy picks sequences online, or
    ``export_formats`` is empty), else None."""
    from pipeline.ordering import strategies

    if not strategies.spec(strategy).scheduled:
        return "picks sequences online (no fixed order)"
    return "export_formats is empty" if not cfg.export_formats else None


def export_strategy(layout, cfg, strategy: str, log: Callable[[str], None] = print) -> StageResult:
    """Write ``strategy``'s ordering in every format of ``export_formats`` under
    ``exports/<strategy>/<format>/`` of the data root, or under ``export_dir`` (a folder or an
    object-store prefix, replaced only where Strata wrote it); global batch ``export_global_batch``
    or ``batch_size``, ``export_world_size`` ranks, ``export_workers`` workers (docs/export.md).
    The outputs start with each format's ``meta.json``; an object's digest is the one taken while
    it was written."""
    from pipeline.export import export_ordering

    global_batch = cfg.export_global_batch or cfg.batch_size
    files, facts, digests = [], {}, {}
    for fmt in cfg.export_formats:
        if cfg.export_dir:
            from pipeline.storage.remote import is_url, join

            out = join(cfg.export_dir, strategy, fmt) if is_url(cfg.export_dir) else str(Path(cfg.export_dir).expanduser() / strategy / fmt)
        else:
            out = layout.export_dir(strategy, fmt)
        info = export_ordering(layout, strategy, fmt, out, global_batch=global_batch,
                               world_size=cfg.export_world_size, workers=cfg.export_workers,
                               force=not cfg.export_dir)  # the data root's own exports/ folder: Strata's, marked or not (an older export)
        files += info["files"]
        digests.update(info.get("digests", {}))
        facts[f"{fmt}/tokens_per_s"] = round(info["tokens"] / max(info["wall_s"], 1e-9))
        facts[f"{fmt}/kept_sequences"] = info["kept_sequences"]
        log(f"{fmt}: {info['sequences']} sequences in {info['wall_s']:.2f} s -> {info['dir']}")
    return StageResult(
        sorted(files, key=lambda p: (not str(p).endswith("/meta.json"), str(p))),
        {"sequences": info["sequences"], "formats": len(cfg.export_formats)},
        {"strategy": strategy, "formats": list(cfg.export_formats), "global_batch": global_batch,
         "world_size": cfg.export_world_size, "workers": cfg.export_workers, "export_dir": cfg.export_dir},
        facts, digests=digests,
    )
