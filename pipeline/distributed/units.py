"""Per-shard stages as work units, on either engine, in bounded memory.

A shard to compute is cut into work units of ``cfg.shard_docs`` consecutive rows — the same units
on both engines, so every embedding batch holds the same documents and the bytes are identical —
and :func:`pipeline.distributed.engine.map_shards` runs the pure unit function on each. A unit's
inputs are read only when it is submitted (:attr:`~pipeline.distributed.shards.Shard.load`), its
result is written to ``work/<stage>/`` as soon as it arrives, and once all units of a shard are in,
``assemble`` writes the shard's artifacts and the unit files are removed. A unit's file is written
where the unit runs (:func:`unit_to_file`: on Ray, the worker), so only its path comes back. Memory: the units in
flight. A run killed midway leaves complete unit and shard files; a rerun resumes from them.
Stages whose units take seconds skip the unit files on the local engine (``checkpoint=False``):
results stream into ``assemble``, so each byte of a shard's artifact is written once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np
from tqdm import tqdm

from pipeline.distributed.engine import map_shards
from pipeline.distributed.shards import Shard
from pipeline.storage.atomic import atomic_path
from pipeline.threads import ahead


class UnitSource(Protocol):
    """What a shard to cut into units must tell: its name, its source (shown in progress) and its row count."""

    unit: str
    n_docs: int

    @property
    def name(self) -> str: ...


def _write_unit(path: Path, result: Any) -> None:
    arrays = result if isinstance(result, tuple) else (result,)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, *arrays)


def unit_to_file(fn: Callable[..., Any], path: str, *args: Any) -> str:
    """``fn(*args)`` written to the unit file ``path`` where it runs (a Ray worker writes it under
    the data root every node shares): only the path comes back to the driver, never the arrays."""
    _write_unit(Path(path), fn(*args))
    return path


def load_unit(path: Path) -> tuple[np.ndarray, ...]:
    """A unit's result arrays, as the unit function returned them."""
    with np.load(path, allow_pickle=False) as z:
        return tuple(z[f"arr_{i}"] for i in range(len(z.files)))


def map_corpus_shards(shards: Sequence[UnitSource], fn: Callable[..., Any], unit_args: Callable[[Any, int, int], tuple],
                      assemble: Callable[[Any, Iterator[tuple]], None], done: Callable[[Any], bool], *, stage: str, key: str,
                      work_dir: Path, cfg, actors: bool = False, checkpoint: bool = True) -> dict[str, int]:
    """Compute the artifacts of every shard for which ``done(shard)`` is false.

    ``unit_args(shard, start, stop)`` gives ``fn``'s arguments for the shard's training rows
    ``start:stop``; ``assemble(shard, results)`` writes a shard's artifacts from its units' results
    (``fn``'s return values as tuples of arrays, in unit order). Returns ``shards``,
    ``shards_computed``, ``shards_reused``, ``units`` (of the shards computed) and ``units_resumed``
    (found complete from an earlier run).

    ``checkpoint=False`` on the local engine writes no unit files: each shard's units are computed
    in order, one ahead of ``assemble`` (reading a unit's inputs and writing the previous result
    overlap the computation), and handed to it as they come, so every byte of a shard's artifact
    is written once. For stages whose units take seconds (tokenizing, ``shallow`` embeddings,
    cluster assignment) an interrupted run then recomputes its unfinished shard; unit files that
    an earlier run left are still used."""
    todo = list({s.name: s for s in shards if s.n_docs and not done(s)}.values())
    units = _shard_units(todo, unit_args, stage, key, work_dir, cfg.shard_docs)
    by_name = {s.name: s for s in todo}
    owner = {u.outputs[0]: d for d, us in units.items() for u in us}
    work_dir.mkdir(parents=True, exist_ok=True)
    resumed = sum(u.done() for us in units.values() for u in us)
    flat = [u for us in units.values() for u in us]
    bar = tqdm(total=len(flat), initial=sum(u.done() for u in flat), desc=f"{stage}[{cfg.engine}]", unit="unit", disable=len(flat) < 2)

    def finish(name: str, results: Iterator[tuple] | None = None) -> None:
        files = [u.outputs[0] for u in units.pop(name)]
        assemble(by_name[name], results if results is not None else (load_unit(f) for f in files))
        for f in files:
            f.unlink(missing_ok=True)

    if not checkpoint and cfg.engine == "local":
        _compute_in_order(units, fn, finish, bar)
    else:
        _compute_to_files(units, owner, fn, finish, bar, cfg.engine, cfg.ray, actors)
    bar.close()
    return {"shards": len(shards), "shards_computed": len(todo), "shards_reused": len(shards) - len(todo), "units": len(owner),
            "units_resumed": resumed}


def _shard_units(todo: list, unit_args: Callable[[Any, int, int], tuple], stage: str, key: str, work_dir: Path,
                 n: int) -> dict[str, list[Shard]]:
    """Each shard's units of ``n`` training rows, by shard name: a unit's file under ``work_dir``
    (named by the stage, the shard, ``key`` and its first row) and its arguments, made when it is
    computed (``unit_args``)."""
    return {
        s.name: [Shard(f"{stage}[{s.unit}:{a}]", (), (work_dir / f"{stage}-{s.name}-{key}-{a}.npz",),
                       load=lambda s=s, a=a, b=min(a + n, s.n_docs): unit_args(s, a, b))  # noqa: B008 (binds this unit's end)
                 for a in range(0, s.n_docs, n)]
        for s in todo
    }


def _compute_in_order(units: dict[str, list[Shard]], fn: Callable[..., Any], finish: Callable[..., None], bar) -> None:
    """Every shard's units computed on this machine in order, one ahead of ``finish`` (reading a
    unit's inputs and writing the previous result overlap the computation) and handed to it as
    they come, with no unit file written; a unit an earlier run left complete is loaded."""
    def inputs(unit: Shard) -> tuple | None:
        return None if unit.done() else unit.arguments()

    def compute(unit_inputs: tuple[Shard, tuple | None]) -> tuple:
        unit, args = unit_inputs
        if args is None:
            return load_unit(unit.outputs[0])
        out = fn(*args)
        bar.update(1)
        return out if isinstance(out, tuple) else (out,)

    for name in list(units):
        finish(name, ahead(compute, zip(units[name], ahead(inputs, units[name]))))


def _compute_to_files(units: dict[str, list[Shard]], owner: dict[Path, str], fn: Callable[..., Any],
                      finish: Callable[..., None], bar, engine: str, ray_cfg, actors: bool) -> None:
    """Every unit of the shards in ``units`` computed on ``engine`` into its file (a checkpoint),
    and each shard assembled by ``finish`` once its last unit is saved; shards complete from an
    interrupted run first, and their units are not shipped again (``finish`` removes their files)."""
    for name in [d for d, us in units.items() if all(u.done() for u in us)]:  # complete from an interrupted run
        finish(name)

    def save(unit: Shard, path: str) -> None:  # the worker wrote the unit's file
        bar.update(1)
        name = owner[Path(path)]
        if name not in units:  # its shard is assembled already: a unit whose task ran twice (a retried task)
            Path(path).unlink(missing_ok=True)
            return
        if all(u.done() for u in units[name]):
            finish(name)

    shipped = [Shard(u.name, (), u.outputs, load=lambda u=u: (fn, str(u.outputs[0]), *u.arguments())) for us in units.values() for u in us]
    map_shards(unit_to_file, shipped, save, engine=engine, ray_cfg=ray_cfg, actors=actors)
