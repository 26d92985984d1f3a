"""A Hugging Face dataset as corpus shards: one shard (one ``[shard]`` partition) per data file of
the chosen split, so a dataset behaves like ``corpus.path`` naming those files: adding a data file
runs only its partitions, editing one reruns only it.

``corpus.hf_dataset`` is a Hub name (``allenai/c4``) or a local folder in the Hub's layout (a
``README.md`` whose YAML front matter lists ``configs:`` with their ``data_files``, or the layouts
``datasets`` resolves by itself, e.g. ``data/train-00000-of-00002.parquet`` or ``data/*.jsonl``).
``datasets`` resolves the data files (its own rules, the dataset's default config); this module
only asks it. A Hub file comes as an ``hf://datasets/<repo>/<file>`` URL without the revision the
resolution pinned, so its partition key stays the same across the dataset's commits and its data
version is the file's own (:mod:`pipeline.storage.remote`, read through ``huggingface_hub``'s
filesystem); a local file is a path like any shard. Parquet and JSONL files are read by
:mod:`pipeline.data.shards`; any other format ``datasets`` knows (CSV, Arrow, text …) is
streamed through ``datasets`` one file at a time.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

from pipeline.errors import StrataInputError

_PINNED = re.compile(r"^(hf://datasets/[^/@]+(?:/[^/@]+)?)@[^/]+/")  # hf://datasets/<owner>/<name>@<revision>/<file>
OFFLINE_FIX = ("Strata keeps the Hub offline unless HF_HUB_OFFLINE=0 is set: set it to read from the Hub, or download the "
               "dataset (`hf download NAME --repo-type dataset --local-dir DIR`) and set corpus.hf_dataset to DIR")


def unpinned(url: str) -> str:
    """``hf://datasets/<repo>@<revision>/<file>`` without ``@<revision>`` (the file on the default branch)."""
    return _PINNED.sub(r"\1/", url, count=1)


def data_files(name: str, split: str) -> list[str]:
    """The data files of ``split`` of the dataset ``name`` (a Hub name or a local folder), sorted:
    absolute paths for a local folder, ``hf://`` URLs for the Hub; a StrataInputError naming the
    dataset and the fix when it cannot be resolved or has no such split."""
    import datasets

    key = "corpus.hf_dataset"
    try:
        builder = datasets.load_dataset_builder(name)
    except ConnectionError as exc:
        raise StrataInputError(f"cannot reach the Hugging Face Hub for the dataset {name!r} ({exc})", path=key, fix=OFFLINE_FIX) from None
    except FileNotFoundError as exc:
        raise StrataInputError(f"no dataset {name!r} ({exc})", path=key,
                               fix="name a dataset on the Hub (owner/name) or a folder holding its data files") from None
    except ValueError as exc:  # e.g. several configs and none marked default
        raise StrataInputError(f"cannot resolve the data files of the dataset {name!r} ({exc})", path=key,
                               fix="mark one config `default: true` in its README.md, or set corpus.path to that config's files") from None
    found = builder.config.data_files
    if not found:
        raise StrataInputError(f"the dataset {name!r} lists no data files (a loading script or an empty folder)", path=key,
                               fix="point corpus.hf_dataset at a dataset of data files (Parquet, JSONL, CSV …), "
                                   "or corpus.path at its files")
    splits = {str(k): list(v) for k, v in found.items()}
    if split not in splits:
        raise StrataInputError(f"the dataset {name!r} has no split {split!r} (splits: {sorted(splits)})", path="corpus.hf_split",
                               fix=f"set corpus.hf_split to one of {sorted(splits)}")
    out = [unpinned(f) if f.startswith("hf://") else str(Path(f).resolve()) for f in splits[split]]
    return sorted(dict.fromkeys(out))


def file_records(name: str, file: str) -> Iterator[dict[str, Any]]:
    """The records of one data file of a format :mod:`pipeline.data.shards` does not read (CSV,
    Arrow, text …), streamed by ``datasets`` with the dataset's own builder and options."""
    import datasets

    try:
        return iter(datasets.load_dataset(name, data_files={"train": [file]}, split="train", streaming=True))
    except (ConnectionError, FileNotFoundError, ValueError) as exc:
        raise StrataInputError(f"cannot read the data file with datasets ({exc})", path=file,
                               fix=f"convert it to Parquet or JSONL, or check the file; {OFFLINE_FIX}") from None
