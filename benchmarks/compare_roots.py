"""Compare two Strata data roots, e.g. one ``strata demo`` before a change and one after it.

Every artifact file (all but DuckDB, Dagster's storage and hidden files) by SHA-256; PNGs that
differ are listed with both sizes; every DuckDB table's rows, leaving out the columns that record
time, memory or processes, with the largest relative difference of numeric values where the rows
differ. Exit 0 always: the listing is the result.

    python benchmarks/compare_roots.py BEFORE_ROOT AFTER_ROOT
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.storage.layout import artifact_digests  # noqa: E402

SKIP_COLUMNS = ("wall", "cpu", "time", "_at", "_s", "date", "run_id", "started", "finished", "pid", "host", "seconds",
                "elapsed", "tokens_per", "rss", "mem")


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()[16:24]
    return int.from_bytes(data[:4], "big"), int.from_bytes(data[4:], "big")


def _columns(con, table: str) -> list[str]:
    return [r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                                      "ORDER BY ordinal_position", [table]).fetchall()]


def _largest_relative(rows_a: list[tuple], rows_b: list[tuple]) -> float | None:
    """Largest relative difference of numeric cells between rows matched by position after
    sorting on their non-float cells (None when they do not match up)."""
    def key(r):
        return tuple(repr(v) for v in r if not isinstance(v, float))
    a, b = sorted(rows_a, key=key), sorted(rows_b, key=key)
    if len(a) != len(b) or any(key(x) != key(y) for x, y in zip(a, b)):
        return None
    worst = 0.0
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            if isinstance(u, float) and isinstance(v, float) and u != v:
                worst = max(worst, abs(u - v) / max(abs(u), abs(v)))
    return worst


def compare_tables(a: Path, b: Path) -> list[str]:
    lines = []
    with duckdb.connect(str(a / "strata.duckdb"), read_only=True) as ca, duckdb.connect(str(b / "strata.duckdb"), read_only=True) as cb:
        ta = {r[0] for r in ca.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        tb = {r[0] for r in cb.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        lines.append(f"tables: {len(ta)} vs {len(tb)}; only before {sorted(ta - tb)}; only after {sorted(tb - ta)}")
        for t in sorted(ta & tb):
            cols_a, cols_b = _columns(ca, t), _columns(cb, t)
            if cols_a != cols_b:
                lines.append(f"  {t}: columns differ: {sorted(set(cols_a) ^ set(cols_b))}")
            cols = [c for c in cols_a if c in cols_b and not any(s in c.lower() for s in SKIP_COLUMNS)]
            if not cols:
                continue
            query = f'SELECT {", ".join(chr(34) + c + chr(34) for c in cols)} FROM "{t}"'
            ra, rb = ca.execute(query).fetchall(), cb.execute(query).fetchall()
            if sorted(map(repr, ra)) != sorted(map(repr, rb)):
                worst = _largest_relative(ra, rb)
                how = f"numbers only, largest relative difference {worst:.1e}" if worst is not None else "rows differ"
                lines.append(f"  {t}: {len(ra)} vs {len(rb)} rows; {how} (columns {cols})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args()
    fa, fb = artifact_digests(args.before), artifact_digests(args.after)
    differ = [k for k in fa if k in fb and fa[k] != fb[k]]
    print(f"files: {len(fa)} vs {len(fb)}; identical {sum(fb.get(k) == v for k, v in fa.items())}; differ {len(differ)}; "
          f"only before {len(set(fa) - set(fb))}; only after {len(set(fb) - set(fa))}")
    for k in differ:
        extra = f" {_png_size(args.before / k)} -> {_png_size(args.after / k)}" if k.endswith(".png") else ""
        print(f"  differ: {k}{extra}")
    for k in sorted(set(fa) ^ set(fb)):
        print(f"  only {'before' if k in fa else 'after'}: {k}")
    print("\n".join(compare_tables(args.before, args.after)))


if __name__ == "__main__":
    main()
