"""``megatron`` export: a Megatron-Core indexed dataset plus the GPTDataset index cache that
makes ``GPTDataset`` read it in Strata's order.

``tokens.bin`` / ``tokens.idx`` follow ``megatron/core/datasets/indexed_dataset.py`` (index
header ``MMIDIDX``, version 1, dtype code, sequence and document counts, int32 lengths, int64
byte pointers, int64 document indices): item k is the sequence at position k, exactly ``seq_len``
tokens, and the last item carries one trailing EOS. GPTDataset draws ``seq_len + 1`` tokens per
sample (``add_extra_token_to_sequence``, its default) and consecutive samples share one token, so
sample k's inputs are exactly sequence k and its last label is the first token of sequence k+1
(Megatron's usual boundary; the trailing EOS is the label of the last sample).

GPTDataset shuffles documents and samples with ``numpy.random.RandomState(seed)`` unless it finds
its index cache. ``gpt_index/`` holds the unshuffled cache: ``document_index`` = 0..M-1,
``sample_index`` = (k, 0) for k < M then (M-1, L), ``shuffle_index`` = 0..M-1 — exactly what
Megatron's own ``build_sample_idx`` gives for this dataset with one epoch and no shuffle.
``install_gpt_index_cache`` copies them under the file names GPTDataset derives (an MD5 of its
description: data path, sample count, seed, sequence length, split, tokenizer) for the user's
settings; it needs megatron-core.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.export.extend import Previous
from pipeline.export.numpy_tokens import DocumentCheck, meta_of, write_tokens
from pipeline.export.stream import OrderedStream
from pipeline.storage.atomic import write_json, write_npy

if TYPE_CHECKING:
    from pipeline.export.stretches import Writers

INDEX_HEADER = b"MMIDIDX\x00\x00"
DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7, "uint16": 8}
PREFIX = "tokens"  # data path prefix: DIR/tokens (.bin, .idx)


def gpt_indices(n_sequences: int, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(document_index int32, sample_index (M+1, 2) int32, shuffle_index uint32) for one epoch in order."""
    m = n_sequences
    document_index = np.arange(m, dtype=np.int32)
    sample_index = np.zeros((m + 1, 2), dtype=np.int32)
    sample_index[:m, 0] = np.arange(m)
    sample_index[m] = (m - 1, seq_len)
    return document_index, sample_index, np.arange(m, dtype=np.uint32)


def write_idx(path: Path, lengths: np.ndarray, dtype: np.dtype) -> None:
    lengths = np.asarray(lengths, np.int32)
    pointers = np.zeros(lengths.size, np.int64)
    np.cumsum(lengths[:-1].astype(np.int64) * np.dtype(dtype).itemsize, out=pointers[1:])
    with open(path, "wb") as fh:
        fh.write(INDEX_HEADER)
        fh.write(struct.pack("<Q", 1))
        fh.write(struct.pack("<B", DTYPE_CODES[np.dtype(dtype).name]))
        fh.write(struct.pack("<Q", lengths.size))
        fh.write(struct.pack("<Q", lengths.size + 1))
        fh.write(lengths.tobytes(order="C"))
        fh.write(pointers.tobytes(order="C"))
        fh.write(np.arange(lengths.size + 1, dtype=np.int64).tobytes(order="C"))


def export_megatron(stream: OrderedStream, out: Path, meta: dict, progress=None, previous: Previous | None = None,
                    writers: Writers | None = None) -> list[Path]:
    """The indexed dataset; with ``previous`` (``pipeline/export/extend.py``) the ``.bin``'s prefix
    is reused from the previous export and the ``.idx`` rewritten; ``writers`` write the ``.bin``'s
    stretches side by side (``stretches.py``), the driver the ``.idx``."""
    m, L = stream.n_sequences, stream.seq_len
    check = DocumentCheck(stream)
    write_tokens(stream, out / f"{PREFIX}.bin", extra_tokens=np.array([stream.eos_id]), progress=progress, check=check,
                 previous=previous, writers=writers)
    lengths = np.full(m, L, np.int32)
    lengths[-1] = L + 1
    write_idx(out / f"{PREFIX}.idx", lengths, stream.dtype)
    doc, sample, shuffle = gpt_indices(m, L)
    files = [out / f"{PREFIX}.bin", out / f"{PREFIX}.idx"]
    for name, arr in (("document_index", doc), ("sample_index", sample), ("shuffle_index", shuffle)):
        files.append(write_npy(arr, out / "gpt_index" / f"{name}.npy"))
    files.append(write_json(meta_of(stream, "megatron", {**meta, "data_prefix": PREFIX, "train_samples": m}, check), out / "meta.json"))
    return files


def install_gpt_index_cache(export_dir: str | Path, config, num_samples: int, dataset_path: str | None = None) -> Path:
    """Place ``gpt_index/`` where ``GPTDataset`` (megatron-core) looks for its cache for ``config``
    (a ``GPTDatasetConfig``; its ``path_to_cache`` or Megatron's default ``<prefix>/cache``),
    ``num_samples`` (train iterations x global batch) and ``dataset_path`` (the data prefix exactly
    as passed to Megatron, default ``export_dir/tokens``). Returns the cache directory."""
    from megatron.core.datasets.gpt_dataset import GPTDataset
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.utils import Split

    d = Path(export_dir)
    prefix = dataset_path or str(d / PREFIX)
    n = json.loads((d / "meta.json").read_text(encoding="utf-8"))["n_sequences"]
    if num_samples > n:
        raise ValueError(f"num_samples {num_samples} exceeds the {n} exported sequences (one epoch); "
                         "more epochs would need Megatron's own (shuffled) multi-epoch index")
    cache = Path(config.path_to_cache or Path(prefix) / "cache" / "GPTDataset_indices")
    # defer_npy_index_mmap makes GPTDataset name its cache files without building them
    probe_cfg = dataclasses.replace(config, path_to_cache=str(cache), defer_npy_index_mmap=True)
    probe = GPTDataset(IndexedDataset(prefix), prefix, np.arange(n, dtype=np.int32), num_samples, Split.train, probe_cfg)
    base = f"{probe.unique_description_hash}-GPTDataset-{Split.train.name}"
    cache.mkdir(parents=True, exist_ok=True)
    (cache / f"{base}-description.txt").write_text(probe.unique_description)
    for name in ("document_index", "sample_index", "shuffle_index"):
        write_npy(np.load(d / "gpt_index" / f"{name}.npy"), cache / f"{base}-{name}.npy")
    return cache
