"""The target set V (TerRIFIC curricula: "the set of things they want the model to learn").

``mixture.target_path`` (JSONL, JSONL.gz or Parquet with a ``text`` field) or, when empty, the
held-out split of one source (``mixture.target_source``; empty = the held-out source with the
most characters) as the corpus asset wrote it (``heldout/<source>/val/``). The target documents
are split by a seeded permutation: the first half (rounded up) measures v (role ``fit``), the
rest scores models (role ``eval``), so the ablation never scores a model on the documents its
mixture was fitted to. The general held-out set is every held-out document not in the fit half.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError

ROLES = {"fit": 0, "eval": 1, "other": 2}


def read_target_file(path: str | Path, text_field: str = "text") -> pl.DataFrame:
    """Target documents (text, id, source='target') from a JSONL[.gz] or Parquet file."""
    path = Path(path)
    fix = f"give a JSONL/Parquet file whose records have a string `{text_field}`"
    if not path.is_file():
        raise StrataInputError("target file not found", fix="set mixture.target_path to an existing file, or leave it empty", path=path)
    if path.suffix == ".parquet":
        df = pl.read_parquet(path)
        if text_field not in df.columns:
            raise StrataInputError(f"the target table has no `{text_field}` column", fix=fix, path=path)
        texts = df[text_field].cast(pl.String).to_list()
    else:
        texts = []
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as fh:
            for i, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise StrataInputError(f"malformed JSON ({exc.msg})", fix=fix, path=path, line=i) from None
                if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
                    raise StrataInputError(f"no string `{text_field}` field", fix=fix, path=path, line=i)
                texts.append(obj[text_field])
    texts = [t for t in texts if t and t.strip()]
    return pl.DataFrame({"text": texts, "id": [f"target:{i}" for i in range(len(texts))], "source": ["target"] * len(texts)},
                        schema={"text": pl.String, "id": pl.String, "source": pl.String})


def pick_source(heldout: pl.DataFrame, source: str) -> str:
    """The configured target source, or the held-out source with the most characters (ties: name)."""
    sources = sorted(heldout["source"].unique().to_list())
    if source:
        if source not in sources:
            raise StrataInputError(f"mixture.target_source {source!r} has no held-out documents",
                                   fix=f"use one of {sources} or set mixture.target_path")
        return source
    size = heldout.group_by("source").agg(n=pl.col("text").str.len_chars().sum()).sort(["n", "source"], descending=[True, False])
    return str(size["source"][0])


def target_documents(heldout: pl.DataFrame, target: pl.DataFrame | None, source: str, seed: int) -> pl.DataFrame:
    """All documents the mixture stage reads: text, id, source, role (0 fit, 1 eval, 2 other), general (bool).

    ``heldout``: the held-out documents (text, id, source); ``target``: documents of a target
    file, or None to take the held-out documents of ``source`` (see module doc).
    """
    held = heldout.select("text", "id", "source")
    if target is None:
        if held.height == 0:
            raise StrataInputError("there are no held-out documents to take a target from",
                                   fix="set heldout_fraction > 0 or mixture.target_path")
        name = pick_source(held, source)
        is_t = (held["source"] == name).to_numpy()
        tgt, rest = held.filter(pl.Series(is_t)), held.filter(pl.Series(~is_t))
    else:
        tgt, rest = target.select("text", "id", "source"), held
    if tgt.height < 2:
        raise StrataInputError(f"the target set has {tgt.height} document(s)",
                               fix="give at least 2 target documents (one half measures, the other scores)")
    perm = np.random.default_rng(seed).permutation(tgt.height)
    role = np.empty(tgt.height, dtype=np.int64)
    role[perm] = np.where(np.arange(tgt.height) < -(-tgt.height // 2), ROLES["fit"], ROLES["eval"])
    tgt = tgt.with_columns(role=pl.Series(role), general=pl.Series(role == ROLES["eval"]) if target is None else pl.lit(False))
    rest = rest.with_columns(role=pl.lit(ROLES["other"], dtype=pl.Int64), general=pl.lit(True))
    return pl.concat([tgt, rest]).with_columns(pl.col("role").cast(pl.Int64))
