"""Paloma's metric: bits per byte of a subdomain = sum over its documents of -log2 p(text) divided
by the sum of their UTF-8 bytes; a source's value is the plain mean over its subdomains; the
suite's value is the plain mean over sources (Paloma, Magnusson et al. 2023). The documents'
layout is read and written by ``pipeline/data/paloma.py``.
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from pipeline.errors import StrataInputError


def aggregate_bpb(per_doc: pl.DataFrame, suite: str) -> list[dict[str, Any]]:
    """Tidy rows of Paloma's bits per byte from per-document log-likelihoods.

    ``per_doc``: source, subdomain, loglikelihood (natural log, summed over the document), n_bytes.
    Rows: ``task="<source>/<subdomain>"`` (byte-weighted within the subdomain), ``task=<source>``
    (mean over its subdomains) and ``task="mean"`` (mean over sources), metric ``bits_per_byte``.
    """
    if per_doc.height == 0:
        raise StrataInputError("no documents were scored", fix="check the Paloma-style directory")
    sub = (per_doc.group_by("source", "subdomain")
           .agg((-pl.col("loglikelihood").sum() / (pl.col("n_bytes").sum() * math.log(2))).alias("bpb"), pl.len().alias("n"))
           .sort("source", "subdomain"))
    src = sub.group_by("source").agg(pl.col("bpb").mean(), pl.col("n").sum()).sort("source")
    rows = [{"suite": suite, "task": f"{r['source']}/{r['subdomain']}", "metric": "bits_per_byte",
             "value": float(r["bpb"]), "n": int(r["n"])} for r in sub.iter_rows(named=True)]
    rows += [{"suite": suite, "task": r["source"], "metric": "bits_per_byte", "value": float(r["bpb"]), "n": int(r["n"])}
             for r in src.iter_rows(named=True)]
    rows.append({"suite": suite, "task": "mean", "metric": "bits_per_byte", "value": float(src["bpb"].mean()),
                 "n": int(src["n"].sum())})
    return rows
