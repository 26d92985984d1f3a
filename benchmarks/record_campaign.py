"""Record a finished ``strata ablate`` campaign from its data root as a results file.

The campaign itself is run with the CLI, e.g. on the built-in corpus with a larger held-out split::

    printf 'heldout_fraction: 0.1\n' > campaign.yaml
    strata demo --data-root ROOT --config campaign.yaml        # or stop it once the orderings exist
    /usr/bin/time -v strata ablate --strategies greedy stratified cluster_sorted --budget 60m --data-root ROOT

then ``python benchmarks/record_campaign.py --data-root ROOT --time-log ablate.err --commit SHA`` reads
the campaign's ``ablation_campaign`` rows from ``ROOT/strata.duckdb`` (every round: grid, Δ,
interval, σ's, verdict, compute spent) and the process's wall time, CPU time and peak RSS from
GNU time's report, and writes ``benchmarks/results/ablate_campaign.json`` (docs/training.md,
"Sequential ablation", renders it with ``benchmarks/tables.py``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ablate import commit, machine  # noqa: E402


def gnu_time(text: str) -> dict:
    """Wall seconds, CPU seconds and peak RSS (MB) from ``/usr/bin/time -v``'s report."""
    def field(name: str) -> str:
        m = re.search(rf"{re.escape(name)}: (.+)", text)
        if m is None:
            raise SystemExit(f"record_campaign: no '{name}' in the time log")
        return m.group(1).strip()

    parts = [float(p) for p in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")]
    wall = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    cpu = float(field("User time (seconds)")) + float(field("System time (seconds)"))
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": float(field("Maximum resident set size (kbytes)")) / 1024}


def main() -> None:
    import duckdb

    ap = argparse.ArgumentParser()
    ap.add_argument("--data-root", required=True)
    ap.add_argument("--time-log", required=True, help="stderr of `/usr/bin/time -v strata ablate …`")
    ap.add_argument("--commit", default=None, help="the commit the campaign ran at (default: this checkout's)")
    ap.add_argument("--note", default="", help="conditions of the run worth stating (e.g. other load on the machine)")
    ap.add_argument("--out", default="benchmarks/results/ablate_campaign.json")
    args = ap.parse_args()
    root = Path(args.data_root)
    con = duckdb.connect(str(root / "strata.duckdb"), read_only=True)
    latest = con.execute("select campaign from ablation_campaign order by started_at desc limit 1").fetchall()
    if not latest:
        raise SystemExit(f"record_campaign: no ablation_campaign rows in {root / 'strata.duckdb'}")
    cur = con.execute("select * from ablation_campaign where campaign = ? order by round, strategy", [latest[0][0]])
    names = [c[0] for c in cur.description]
    rows = [dict(zip(names, r)) for r in cur.fetchall()]
    config = (root / "demo_config.yaml").read_text(encoding="utf-8") if (root / "demo_config.yaml").is_file() else ""
    doc = {
        "benchmark": "strata ablate (record_campaign.py)",
        "commit": args.commit or commit(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": {k: v for k, v in machine().items() if k != "loadavg_at_start"},  # recorded after the run
        "note": args.note,
        "config": config,
        "process": gnu_time(Path(args.time_log).read_text(encoding="utf-8", errors="replace")),
        "rounds": [{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in r.items()} for r in rows],
    }
    Path(args.out).write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: campaign {latest[0][0]}, {len(rows)} rows")


if __name__ == "__main__":
    main()
