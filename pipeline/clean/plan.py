"""Which documents leave training and why: duplicate groups and kinds from the exact, near and
semantic relations, and the configured actions applied to them and to the contamination flags."""

from __future__ import annotations

import numpy as np
import polars as pl

from pipeline.clean.groups import components

KINDS = ("exact", "near", "semantic")  # dup_kind, strongest first
REASONS = (*KINDS, "contaminated")  # why a document left training


def duplicate_groups(n: int, exact_rep: np.ndarray, near: np.ndarray, semantic: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per document: its group (the smallest doc id of its connected component under all three
    relations; -1 alone), its kind (index into KINDS of the strongest relation that puts it in a
    group of two or more; -1 none) and the level at which it stopped representing its group
    (index into KINDS; -1: it represents its group). ``near`` pairs join exact representatives,
    ``semantic`` pairs join near representatives (each level sees only the one before's survivors)."""
    exact_rep = np.asarray(exact_rep, np.int64)
    near_rep = components(n, near)[exact_rep]
    final = components(n, semantic)[near_rep]
    sizes = [np.bincount(r, minlength=n) for r in (exact_rep, near_rep, final)]
    kind = np.full(n, -1, np.int64)
    for level in (2, 1, 0):  # the strongest relation wins
        kind[sizes[level][(exact_rep, near_rep, final)[level]] > 1] = level
    ids = np.arange(n, dtype=np.int64)
    lost = np.full(n, -1, np.int64)
    for level, rep in ((2, final), (1, near_rep), (0, exact_rep)):
        lost[ids != rep] = level
    group = np.where(sizes[2][final] > 1, final, -1)
    return group, kind, lost


def plan(n: int, exact_rep: np.ndarray, near: np.ndarray, semantic: np.ndarray, flags: np.ndarray, set_names: tuple[str, ...],
         dedup_action: str, decontam_drop: bool) -> pl.DataFrame:
    """doc_id, dup_group (-1: none), dup_kind, removed (the reason a document leaves training: REASONS,
    null: it trains) and contaminated (the evaluation sets it overlaps, comma-separated; null: none).

    ``flags``: (n, sets) bool. ``dedup_action``: keep_one (every member but the group's smallest
    doc id leaves, its reason the level it was merged at), drop (every member leaves) or separate
    (all stay). With ``decontam_drop`` a contaminated document leaves whatever its group."""
    group, kind, lost = duplicate_groups(n, exact_rep, near, semantic)
    reason = np.full(n, -1, np.int64)
    if dedup_action == "keep_one":
        reason = lost
    elif dedup_action == "drop":
        reason = kind.copy()
    flags = np.asarray(flags, bool).reshape(n, len(set_names))
    dirty = flags.any(axis=1)
    if decontam_drop:
        reason[dirty] = len(KINDS)
    labels = np.array([None, *REASONS], dtype=object)
    kinds = np.array([None, *KINDS], dtype=object)
    names = np.array(set_names, dtype=object)
    contaminated = [",".join(names[row]) if row.any() else None for row in flags] if len(set_names) else [None] * n
    return pl.DataFrame({
        "doc_id": np.arange(n, dtype=np.int64), "dup_group": group, "dup_kind": kinds[kind + 1].tolist(),
        "removed": labels[reason + 1].tolist(), "contaminated": contaminated,
    }, schema={"doc_id": pl.Int64, "dup_group": pl.Int64, "dup_kind": pl.String, "removed": pl.String, "contaminated": pl.String})
