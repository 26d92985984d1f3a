"""The export stage: a strategy's ordering written in every format of ``export.formats`` (``exports``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pipeline.export import export_ordering
from pipeline.export.stretches import Writers
from pipeline.ordering import strategies
from pipeline.stage import StageParams, StageResult, setting
from pipeline.storage.remote import is_url, join


@dataclass(frozen=True)
class ExportParams(StageParams):
    """The export stage's settings (``exports``): the config's ``export:`` group and the batch size."""

    formats: list[str] = setting("export.formats")
    global_batch: int = setting("export.global_batch")  # 0 = batch_size
    world_size: int = setting("export.world_size")
    workers: int = setting("export.workers")
    dir: str = setting("export.dir")  # "" = <data root>/exports
    batch_size: int = setting()
    writers: int = setting("export.writers", versioned=False)  # the same bytes by any number of writers
    engine: str = setting(versioned=False)  # where the writers run: local (worker processes) | ray (tasks)
    ray: Any = setting(versioned=False)  # pipeline.config.RayConfig


def export_skipped(params: ExportParams, strategy: str) -> str | None:
    """Why ``strategy`` has nothing to export (a training-time strategy picks sequences online, or
    ``export.formats`` is empty), else None."""
    if not strategies.spec(strategy).scheduled:
        return "picks sequences online (no fixed order)"
    return "export_formats is empty" if not params.formats else None


def export_strategy(layout, params: ExportParams, strategy: str, log: Callable[[str], None] = print) -> StageResult:
    """Write ``strategy``'s ordering in every format of ``export.formats`` under
    ``exports/<strategy>/<format>/`` of the data root, or under ``export.dir`` (a folder or an
    object-store prefix, replaced only where Strata wrote it); global batch ``export.global_batch``
    or ``batch_size``, ``export.world_size`` ranks, ``export.workers`` workers (docs/export.md);
    the flat formats by ``export.writers`` workers on ``engine``.
    The outputs start with each format's ``meta.json``; an object's digest is the one taken while
    it was written. A strategy with nothing to export (:func:`export_skipped`) is a ``skipped`` result."""
    if (why := export_skipped(params, strategy)) is not None:
        return StageResult(outputs=[], rows={}, parameters={}, skipped=f"{strategy}: {why}")
    global_batch = params.global_batch or params.batch_size
    files, facts, digests = [], {}, {}
    for fmt in params.formats:
        if params.dir:
            out = join(params.dir, strategy, fmt) if is_url(params.dir) else str(Path(params.dir).expanduser() / strategy / fmt)
        else:
            out = layout.export_dir(strategy, fmt)
        info = export_ordering(layout, strategy, fmt, out, global_batch=global_batch,
                               world_size=params.world_size, workers=params.workers,
                               writers=Writers(params.writers, params.engine, params.ray),
                               force=not params.dir)  # the data root's own exports/ folder: Strata's, marked or not (an older export)
        files += info["files"]
        digests.update(info.get("digests", {}))
        facts[f"{fmt}/tokens_per_s"] = round(info["tokens"] / max(info["wall_s"], 1e-9))
        facts[f"{fmt}/kept_sequences"] = info["kept_sequences"]
        log(f"{fmt}: {info['sequences']} sequences in {info['wall_s']:.2f} s -> {info['dir']}")
    return StageResult(
        outputs=sorted(files, key=lambda p: (not str(p).endswith("/meta.json"), str(p))),
        rows={"sequences": info["sequences"], "formats": len(params.formats)},
        parameters={"strategy": strategy, "formats": list(params.formats), "global_batch": global_batch,
                    "world_size": params.world_size, "workers": params.workers, "export_dir": params.dir},
        facts=facts, digests=digests,
    )
