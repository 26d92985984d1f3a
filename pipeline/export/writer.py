"""``export_stream`` (any registered format) and ``export_ordering`` (an ordering of a data root)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from pipeline.data.tokenizer import load_tokenizer
from pipeline.errors import StrataInputError
from pipeline.export.batches import check_batching
from pipeline.export.extend import link_identical, previous_export
from pipeline.export.formats import REGISTRY
from pipeline.export.stream import OrderedStream, open_stream
from pipeline.export.stretches import Writers
from pipeline.ordering.strategies import REGISTRY as STRATEGIES
from pipeline.packing.frozen import load as load_frozen
from pipeline.storage import remote
from pipeline.storage.atomic import atomic_dir, file_sha256
from pipeline.storage.integrity import check_order, verify_export_inputs
from pipeline.storage.layout import Store
from pipeline.storage.remote import is_url

EXPORT_MARKER = ".strata-export"  # in every export directory Strata writes: only such a directory is replaced without --force


def _contents(d: Path, limit: int = 3) -> tuple[int, list[str]]:
    names = sorted(p.name for p in d.iterdir())
    return len(names), names[:limit]


def check_export_prefix(out: str, *, force: bool = False) -> str:
    """``out`` (an object-store URL) if an export may replace what is under it, else a
    StrataInputError with the fix: the same rule as for a directory (:func:`check_export_dir`) —
    nothing there, or an export Strata wrote (its :data:`EXPORT_MARKER` object), or ``force``;
    never a bucket's root, whatever ``force`` says."""
    remote.check_url(out)
    out = out.rstrip("/")
    if "/" not in remote.strip(out):
        raise StrataInputError(f"--out {out} is a bucket's root: an export replaces its prefix whole", path=out,
                               fix=f"pass a prefix inside the bucket, e.g. --out {out}/exports/greedy-numpy")
    objects = remote.prefix_contents(out)
    names = [o.url[len(out) + 1:] for o in objects]
    if names and EXPORT_MARKER not in names and not force:
        raise StrataInputError(
            f"--out {out} is not empty ({len(names)} objects, e.g. {', '.join(names[:3])}) and is not an export Strata wrote "
            f"(no {EXPORT_MARKER}): the export would replace everything under it", path=out,
            fix="pass a new or empty prefix to --out, or --force to replace this one and every object under it")
    return out


def check_export_dir(out: str | Path, *, data_root: Path | None = None, force: bool = False) -> Path | str:
    """``out`` if an export may be swapped into it, else a StrataInputError with the fix.

    An export replaces its directory whole, so it goes only where nothing but an earlier export can
    be lost: a new or empty directory, or one holding :data:`EXPORT_MARKER` (an export Strata wrote;
    re-exporting there works, and extends it under a frozen prefix). Never a file, the current
    directory or any folder above it, the data root or a folder above it, or a path inside the data
    root other than its ``exports/`` folder (the stores), whatever ``force`` says; ``force`` only
    lets a non-empty directory without the marker be replaced (an export of an older Strata, or a
    folder the user means to discard). An object-store URL: :func:`check_export_prefix`."""
    if is_url(out):
        return check_export_prefix(str(out), force=force)
    given = Path(out)
    out = given.expanduser().absolute()
    resolved = out.resolve()
    cwd = Path.cwd().resolve()
    protected = {cwd, *cwd.parents, Path.home().resolve(), Path("/")}
    if data_root is not None:
        root = Path(data_root).resolve()
        protected |= {root, *root.parents}
    if resolved in protected:
        raise StrataInputError(f"--out {given} is the current directory, a folder above it, the home folder or the data root: "
                               "an export replaces its directory whole", path=resolved,
                               fix="pass a new directory to --out, e.g. --out exports/greedy-numpy")
    if data_root is not None and resolved.is_relative_to(root) and not resolved.is_relative_to(root / "exports"):
        raise StrataInputError(f"--out {given} lies inside the data root's stores ({root}): the export would replace Strata's own files",
                               path=resolved, fix="pass a directory outside the data root (or under its exports/ folder) to --out")
    if out.is_symlink():
        raise StrataInputError(f"--out {given} is a symbolic link (to {resolved}): an export replaces its directory whole, "
                               "which would replace the link, not write into its target", path=out,
                               fix=f"pass the directory itself (--out {resolved}) if Strata wrote it or it is empty, or a new directory; "
                                   "the link and its target are left as they are")
    if out.exists() and not out.is_dir():
        raise StrataInputError(f"--out {given} is an existing file, not a directory", path=resolved,
                               fix="pass a new or empty directory to --out (the file is left as it is)")
    if out.is_dir() and not (out / EXPORT_MARKER).is_file():
        n, first = _contents(out)
        if n and not force:
            raise StrataInputError(
                f"--out {given} is not empty ({n} entries, e.g. {', '.join(first)}) and is not an export Strata wrote "
                f"(no {EXPORT_MARKER}): the export would replace it whole", path=resolved,
                fix="pass a new or empty directory to --out, or --force to replace this one and everything in it")
    return out


def export_stream(stream: OrderedStream, fmt: str, out: str | Path, *, global_batch: int, world_size: int = 1,
                  workers: int = 1, meta: dict | None = None, progress=None, data_root: Path | None = None,
                  force: bool = False, writers: Writers | None = None) -> dict:
    """Write ``stream`` as ``fmt`` into the directory ``out`` (replaced atomically, only where
    :func:`check_export_dir` allows: nothing Strata did not write is lost; the new directory holds
    :data:`EXPORT_MARKER`).

    ``meta`` (strategy, lineage, frozen prefix) goes into ``meta.json`` with the batching. When
    ``out`` holds an export of the same frozen prefix, the new one extends it
    (``pipeline/export/extend.py``: the prefix's bytes copied, identical shards hard-linked; the
    result is byte-identical to a fresh export). ``writers`` (``export.writers``) of more than one
    write the flat formats' stretches side by side (``pipeline/export/stretches.py``; the same
    bytes); the other formats are written by this process. Returns a summary: files, sequences,
    tokens, ``kept_sequences`` (the previous export's positions kept, 0 for a full write) and wall seconds.
    """
    writer = REGISTRY.get(fmt)
    parallel = {"writers": writers} if writers is not None and writers.n > 1 and writer.stretches else {}
    check_batching(stream.n_sequences, global_batch, world_size, workers)
    info = {**(meta or {}), "global_batch": global_batch, "world_size": world_size, "workers": workers}
    t0 = time.perf_counter()
    out = check_export_dir(out, data_root=data_root, force=force)
    if isinstance(out, str):
        return _export_to_store(stream, fmt, out, info, global_batch=global_batch, world_size=world_size, progress=progress,
                                staging=data_root, t0=t0, parallel=parallel)
    previous = previous_export(out, fmt, info, stream.seq_len, stream.dtype)
    with atomic_dir(out) as tmp:
        extra = {"previous": previous} if previous is not None and writer.extends else {}
        files = writer.write(stream, tmp, info, global_batch=global_batch, world_size=world_size, progress=progress, **extra, **parallel)
        names = [f.relative_to(tmp) for f in files]
        (tmp / EXPORT_MARKER).write_text(f"An export written by Strata ({fmt}); `strata export --out` replaces this folder.\n",
                                         encoding="utf-8")
        if previous is not None:
            link_identical(previous.dir, tmp)
    return {
        "format": fmt, "dir": out, "files": [out / n for n in names], "sequences": stream.n_sequences,
        "tokens": stream.n_sequences * stream.seq_len, "kept_sequences": 0 if previous is None else previous.sequences,
        "wall_s": time.perf_counter() - t0,
    }


def export_ordering(layout, strategy: str, fmt: str, out: str | Path, *, global_batch: int, world_size: int = 1,
                    workers: int = 1, seq_len: int | None = None, progress=None, force: bool = False,
                    writers: Writers | None = None) -> dict:
    """Export ``orderings/<strategy>.parquet`` of the data root ``layout`` (see ``export_stream``),
    each sequence the ``seq_len`` tokens the sequences artifact records (a given ``seq_len`` is
    checked against it).

    ``meta.json`` records the lineage: the ordering and the segments it refers to (paths relative to the
    data root) with their SHA-256; with a frozen prefix (``pipeline/packing/frozen.py``), ``frozen``:
    its sequences, the SHA-256 of their tokens and the version chain (the stream's first
    ``sequences`` positions are the same bytes in every version of the chain).
    """
    check_export_dir(out, data_root=layout.root, force=force)  # before anything is read: a refused --out costs nothing
    known = STRATEGIES.entries().get(strategy)
    if known is not None and not known.scheduled:
        raise StrataInputError(f"{strategy!r} picks its sequences online during training; it has no fixed order to export",
                               fix="export a scheduled strategy (random, greedy, ...)")

    verify_export_inputs(layout, strategy)  # every input's bytes against its recorded SHA-256 (size and mtime are no evidence)
    tok = load_tokenizer(layout.tokenizer)
    REGISTRY.get(fmt)
    stream = open_stream(layout, strategy, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, seq_len=seq_len)
    ordering = Store(layout).ordering(strategy)
    check_order(ordering.order, ordering.n_sequences, ordering.path, schedule=ordering.target_share is not None)
    meta = {  # paths relative to the data root, so the same inputs give the same bytes wherever the root lies
        "strategy": strategy,
        "lineage": {
            "ordering": ordering.path.relative_to(layout.root).as_posix(), "ordering_sha256": file_sha256(ordering.path),
            "segments": ordering.segments_path.relative_to(layout.root).as_posix(), "segments_sha256": file_sha256(ordering.segments_path),
        },
    }

    if (rec := load_frozen(layout, strategy)) is not None:
        meta["frozen"] = {"sequences": rec.sequences, "tokens_sha256": rec.meta.get("tokens_sha256"),
                          "version_chain": rec.meta.get("chain", [])}
    return export_stream(stream, fmt, out, global_batch=global_batch, world_size=world_size, workers=workers,
                         meta=meta, progress=progress, data_root=layout.root, force=force, writers=writers)


COMMIT_FILES = ("index.json", "tokens.idx", "meta.json")  # written last, in this order: meta.json is every export's commit marker


def _export_to_store(stream: OrderedStream, fmt: str, out: str, info: dict, *, global_batch: int, world_size: int,
                     progress, staging: Path | None, t0: float, parallel: dict) -> dict:
    """Write the export into a local temporary directory (under ``staging``, the data root, when
    given), then publish it under the prefix ``out`` (``pipeline.storage.remote.publish``): the
    objects go under a temporary prefix first and are committed with the readers' index
    (``index.json`` of MDS, ``tokens.idx`` of Megatron) and ``meta.json`` last, so a reader never
    sees a half-written export; objects byte-identical to the previous export's stay as they are."""
    writer = REGISTRY.get(fmt)
    if staging is not None:
        Path(staging).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".export-", suffix=".tmp", dir=staging) as tmpd:
        tmp = Path(tmpd)
        files = writer.write(stream, tmp, info, global_batch=global_batch, world_size=world_size, progress=progress, **parallel)
        names = [f.relative_to(tmp).as_posix() for f in files]
        (tmp / EXPORT_MARKER).write_text(f"An export written by Strata ({fmt}); `strata export --out` replaces this prefix.\n",
                                         encoding="utf-8")
        published = remote.publish(tmp, out, last=tuple(f for f in COMMIT_FILES if (tmp / f).is_file()), marker=EXPORT_MARKER)

        digests = {remote.join(out, n): file_sha256(tmp / n) for n in names}  # the objects' bytes, for lineage
    return {
        "format": fmt, "dir": out, "files": [remote.join(out, n) for n in names], "sequences": stream.n_sequences,
        "tokens": stream.n_sequences * stream.seq_len, "kept_sequences": 0, "kept_objects": published["kept"], "digests": digests,
        "wall_s": time.perf_counter() - t0,
    }
