"""The figures of ``bench_scale.py --ray-driver --side-by-side`` runs stopped before their end.

``bench_scale.py`` keeps its memory samples in memory and writes its JSON when a run ends; a run
stopped early (a deadline) leaves only its data root. This script gives such runs the same figures
for the stages they finished:

    python benchmarks/ray_driver_partial.py sample before=PID after=PID --samples FILE
    python benchmarks/ray_driver_partial.py report --work /tmp/bench_scale --docs 1000000 --samples FILE --out OUT.json

``sample`` attaches to running ``strata run`` processes (their pids) and appends, once a second,
:func:`bench_scale._rss_split`'s figures of each one's process tree to ``--samples``, until they
exit. ``report`` splits those samples and each run's ``ray_received.jsonl`` (the bytes the driver
took from Ray workers) by stage from the Dagster materializations in each data root
(:func:`bench_scale.split_by_step`), keeping the stages every run finished, and writes the JSON
``tables.py`` renders for ``bench_scale.py --ray-driver``. The samples are 1 s apart (0.1 s in
``bench_scale.py``), so a short peak may be missed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scale import CORES, _rss_split, split_by_step  # noqa: E402


def sample(pids: dict[str, int], path: Path) -> None:
    with open(path, "a") as out:
        while any(os.path.exists(f"/proc/{p}") for p in pids.values()):
            t = time.time()
            for name, p in pids.items():
                if os.path.exists(f"/proc/{p}"):
                    out.write(json.dumps({"t": t, "case": name, **_rss_split(p)}) + "\n")
            out.flush()
            time.sleep(1.0)


def materializations(root: Path, asset: str) -> int:
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(root / "dagster"))
    return len(instance.fetch_materializations(dg.AssetKey(asset), limit=10_000).records)


def report(work: Path, docs: int, samples: Path, out: Path, runs_commit: str = "") -> None:
    from bench_ablate import commit

    rows = [json.loads(x) for x in samples.read_text().splitlines()]
    runs = {}
    for case in dict.fromkeys(r["case"] for r in rows):
        base = work / case / f"n{docs}"
        timeline = [(r["t"], None, {k: v for k, v in r.items() if k not in ("t", "case")}) for r in rows if r["case"] == case]
        steps = split_by_step(base / "root", timeline, base / "ray_received.jsonl")
        steps.pop("after the last materialization", None)  # a stage cut short: not finished, left out
        finished = {k: v for k, v in steps.items() if "wall_s" in v and v["wall_s"] > 0}
        for name, row in finished.items():  # a per-shard stage may have finished some of its partitions only
            row["partitions_done"] = materializations(base / "root", name)
        options = json.loads((base / "cfg.json").read_text())
        runs[case] = {"options": {k: options[k] for k in ("engine", "partition_workers", "clean_tasks", "near_band_tasks",
                                                          "order_part_bytes") if k in options},
                      "finished_stages": list(finished), "ray_by_step": finished,
                      "ray_peaks_gb": {f"{k}_gb": round(max(t[2][k] for t in timeline) / 2**30, 3) for k in timeline[0][2]},
                      "ray_bytes_received": sum(v["ray_bytes_received"] for v in finished.values()),
                      "wall_s": round(sum(v["wall_s"] for v in finished.values()), 1),
                      "run_started": time.strftime("%H:%M:%SZ", time.gmtime((base / "cfg.json").stat().st_mtime)),
                      "sampled_from": time.strftime("%H:%M:%SZ", time.gmtime(timeline[0][0])),
                      "load_average_at_end": round(os.getloadavg()[0], 1)}
    out.write_text(json.dumps({"benchmark": "bench_scale.py --ray-driver --side-by-side, stopped; ray_driver_partial.py report",
                               "commit": runs_commit or commit(), "report_commit": commit(), "docs": docs,
                               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "shard_docs": 125_000, "side_by_side": True, "partial": True, "sample_interval_s": 1.0,
                               "machine": {"cores": CORES}, "runs": runs}, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["sample", "report"])
    ap.add_argument("pids", nargs="*", help="sample: case=PID of each strata run")
    ap.add_argument("--samples", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_scale"))
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--runs-commit", default="", help="report: the commit the stopped runs ran (default: this one)")
    args = ap.parse_args()
    if args.mode == "sample":
        sample({k: int(v) for k, v in (a.split("=") for a in args.pids)}, args.samples)
    else:
        report(args.work, args.docs, args.samples, args.out, args.runs_commit)


if __name__ == "__main__":
    main()
