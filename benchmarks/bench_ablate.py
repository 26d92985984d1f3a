"""Benchmark: 1,000 simulated ``strata ablate`` campaigns per case, from the paired-difference model
fitted on real runs (issue 43, item 2).

The model D[s, u] = Δ + a_s + b_u + e_su (``pipeline.reports.sequential``) with σ_seed, σ_doc,
σ_res and the baseline's mean loss either fitted from a data root's DuckDB (``--db``, the runs
``strata demo`` / ``strata run`` wrote: ``fit_paired_model``, pooled over the strategies but the
positive control) or, without one, the figures the measured demo's power statement printed
(docs/training.md, "The demo, now": σ_seed 0.0223, σ_doc 0.0884, σ_res 0.1127 nats, random's
6.9856). Each campaign runs exactly as ``strata ablate`` does: a pilot of 3 seeds × 64 documents,
then looks and rounds from ``plan_round`` until a verdict or the budget (in training runs) is
spent. Cases: Δ = 0 and Δ = −0.5% of the baseline (the effect the design plans 80% power for),
with the 71 held-out documents of the built-in corpus and with a pool of 400.

    nice python benchmarks/bench_ablate.py [--db ROOT/strata.duckdb] [--campaigns 1000]

Writes ``benchmarks/results/ablate_simulation.json`` (commit, machine, figures).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

from pipeline.reports import sequential as Q

DEMO_MODEL = Q.PairedModel(sigma_seed=0.0223, sigma_doc=0.0884, sigma_res=0.1127, baseline_mean=6.9856)


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(mem, 1), "loadavg_at_start": os.getloadavg()[0],
            "python": platform.python_version()}


def commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=False).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", help="a data root's strata.duckdb to fit the model on (default: the measured demo's figures)")
    ap.add_argument("--campaigns", type=int, default=1000)
    ap.add_argument("--effect", type=float, default=0.005, help="effect of interest, a fraction of the baseline's mean")
    ap.add_argument("--budget-runs", type=float, default=400.0, help="training runs a campaign may add")
    ap.add_argument("--units", type=int, nargs="+", default=[71, 400], help="held-out documents available")
    ap.add_argument("--out", default="benchmarks/results/ablate_simulation.json")
    args = ap.parse_args()
    if args.db:
        model, fitted = Q.fit_paired_model(args.db)
    else:
        model, fitted = DEMO_MODEL, {"source": "docs/training.md, The demo, now (pooled, 7 strategies x 3 seeds x 64 documents)"}
    dsg = Q.design(args.effect * model.baseline_mean)
    s2 = (model.sigma_seed ** 2, model.sigma_doc ** 2, model.sigma_res ** 2)
    cases = []
    t0 = time.perf_counter()
    for units in args.units:
        target = Q.target_grid(s2, dsg, 3, min(64, units), units)
        for rel in (0.0, -args.effect):
            t = time.perf_counter()
            r = Q.simulate_campaigns(model, rel * model.baseline_mean, dsg, args.campaigns, seed=len(cases),
                                     max_units=units, budget_runs=args.budget_runs, pilot_units=min(64, units))
            r.update(delta_rel=rel, units_available=units, planned_seeds=target.seeds, planned_units=target.units,
                     units_floor=target.units_floor, seconds=round(time.perf_counter() - t, 2))
            cases.append(r)
            print(f"units {units:4d}  Δ {rel:+.3%}: better {r['p_better']:.3f}  worse {r['p_worse']:.3f}  equivalent "
                  f"{r['p_equivalent']:.3f}  unresolved {r['p_unresolved']:.3f}  rounds {r['rounds']:.2f}  seeds {r['seeds']:.1f}  "
                  f"runs {r['runs']:.1f} (max {r['runs_max']})  [{r['seconds']} s]", flush=True)
    out = {"benchmark": "bench_ablate.py", "commit": commit(), "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "model": {**model.__dict__, **fitted}, "design": dsg.__dict__, "campaigns": args.campaigns,
           "budget_runs": args.budget_runs, "pilot": {"seeds": 3, "units": 64}, "cases": cases,
           "seconds": round(time.perf_counter() - t0, 1)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
