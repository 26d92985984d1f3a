"""What ``strata status`` and the UI's ``up_to_date`` check say of an asset: its rows (each partition
fresh, stale and why, or missing) and the check's one-line description of the stale ones."""

from __future__ import annotations

from dataclasses import dataclass

SHOWN = 20  # stale partitions listed in the description; the metadata lists them all


@dataclass(frozen=True)
class Row:
    asset: str
    partition: str | None
    status: str  # fresh | stale | missing | corrupt
    why: str  # root causes of staleness, "" otherwise


def cause(rows: list[Row]) -> str:
    """What made ``rows`` (stale) stale, shortest first: the config keys that changed, else the root causes."""
    changed = sorted({r.why.split(" — config changed: ", 1)[1] for r in rows if " — config changed: " in r.why})
    if changed:
        return "config changed: " + "; ".join(changed)
    roots = sorted({w for r in rows for w in r.why.split(" — ")[0].split("; ") if w})
    return "root cause: " + "; ".join(roots[:3]) + ("; …" if len(roots) > 3 else "")


def check_summary(asset: str, rows: list[Row]) -> tuple[list[Row], list[str], str]:
    """``(the stale rows, their labels, the description)`` of ``asset``'s ``up_to_date`` check."""
    stale = [r for r in rows if r.status == "stale"]
    label = [r.partition if r.partition is not None else asset for r in stale]
    whole = len(rows) == 1 and rows[0].partition is None
    if not stale:
        return stale, label, "up to date" + ("" if whole else f" ({len(rows)} partition{'s' * (len(rows) != 1)} of the config)")
    what = "stale" if whole else f"{len(stale)} of {len(rows)} partitions stale: {', '.join(label[:SHOWN])}" + (
        ", …" if len(label) > SHOWN else "")
    return stale, label, f"{what} ({cause(stale)}; rematerialize {'it' if whole else 'them'})"
