"""The clean stage on a sharded corpus, from scratch and after an appended shard.

A synthetic corpus of ``--docs`` documents in shards of ``--shard-docs`` (``bench_scale.generate``:
text cut from the demo corpus) runs ``strata run --select '*clean'`` (shallow embeddings, k = 64,
checked against WikiText-2, the Paloma fixture, DCLM-core and the held-out split; ``keep_centroids:
false``, so the appended root's k-means, and with it SemDeDup's clusters, is the scratch root's) three times:

1. ``first``: every shard new: each ``clean_shards`` partition scans its shard, ``clean`` gathers;
2. ``append``: one more shard of ``--shard-docs`` documents appended: only its partition runs, and
   the gather checks every shard against the held-out split again (the split gained the new
   shard's held-out documents);
3. ``scratch``: a fresh data root over the same shards, everything computed again: the reference
   the appended root's ``clean/documents.parquet`` must equal byte for byte.

For each run: the ``clean_shards`` partitions that ran and the sum of their asset functions' wall
seconds (``wall_s`` of each materialization), the ``clean`` gather's wall seconds, the shards it
scanned itself and its parts (``scan_s``: shards no partition scanned, ``heldout_scan_s``, ``exact_s``,
``near_s``: the LSH over the stored signatures, ``decontam_s``, ``semantic_s``), and the whole
process's wall time (every stage of ``*clean``); then ``clean`` alone again in a process of its own
(every scan there: the gather's work), for its resident memory high-water mark (``clean_alone_peak_rss_mb``)
and wall time. The generator cuts passages of the demo corpus's text, so
many documents overlap each other and the held-out split: the counts are the generator's, not a crawl's. Figures are
printed and written to ``benchmarks/results/clean_shards.json``, never asserted.

    python benchmarks/bench_clean_shards.py --docs 200000 --shard-docs 20000 [--work /tmp/bench_clean_shards]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_scale import generate  # noqa: E402

SHARED = Path(os.environ.get("STRATA_SHARED_DATA", ROOT.parent / "shared" / "data"))


# runs its arguments as a child process; prints the child's resident memory high-water mark (KB) and wall seconds
PEAK = "import resource, subprocess, sys, time; t = time.time(); rc = subprocess.run(sys.argv[1:]).returncode; " \
       "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, time.time() - t); sys.exit(rc)"


def config(corpus: Path, root: Path) -> dict:
    ev = SHARED / "eval"
    return {"data_root": str(root), "corpus": {"path": str(corpus), "source_field": "domain"}, "embed_method": "shallow",
            "embed_max_tokens": 64, "k": 64, "seq_len": 2048, "strategies": ["random"],
            "keep_centroids": False,  # the appended root retrains k-means as the scratch root does: equal clusters, equal SemDeDup
            "wikitext_path": str(ev / "wikitext" / "wiki.test.raw"), "paloma_dir": str(ev / "paloma_fixture"),
            "dclm_dir": str(ev / "dclm_core")}


def run(cfg: dict, work: Path, name: str) -> dict:
    """``strata run --select '*clean'`` on ``cfg``; what it ran of the clean stage and how long."""
    import dagster as dg

    path = work / f"{name}.yaml"
    path.write_text(json.dumps(cfg))
    env = {**os.environ, "DAGSTER_HOME": ""}
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(path), "--select", "*clean"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode:
        sys.exit(proc.stderr[-4000:])
    instance = dg.DagsterInstance.from_config(str(Path(cfg["data_root"]) / "dagster"))

    def made(asset: str) -> list:
        return [r for r in instance.fetch_materializations(dg.AssetKey(asset), limit=10_000).records if r.timestamp >= t0]

    parts = made("clean_shards")
    gather = made("clean")[0].asset_materialization.metadata
    alone = subprocess.run([sys.executable, "-c", PEAK, sys.executable, "-m", "assets.cli", "run", "--config", str(path), "--select",
                            "clean"], cwd=ROOT, env=env, capture_output=True, text=True)
    if alone.returncode:
        sys.exit(alone.stderr[-4000:])
    peak_kb, alone_wall = alone.stdout.split()[-2:]
    return {"run": name, "process_wall_s": round(wall, 1),
            "clean_shards_partitions": len(parts),
            "clean_shards_wall_s": round(sum(float(r.asset_materialization.metadata["wall_s"].value) for r in parts), 1),
            "clean_wall_s": round(float(gather["wall_s"].value), 1),
            "clean_shards_scanned_by_gather": int(gather["shards_scanned_here"].value),
            "heldout_shards_scanned_by_gather": int(gather["heldout_shards_scanned"].value),
            "clean_parts_s": {k: float(gather[f"{k}_s"].value) for k in ("scan", "heldout_scan", "exact", "near", "decontam", "semantic")},
            "documents": int(gather["rows/documents"].value) if "rows/documents" in gather else None,
            "clean_alone_wall_s": round(float(alone_wall), 1), "clean_alone_peak_rss_mb": round(int(peak_kb) / 1024),
            "duplicate_docs": int(gather["rows/duplicate_docs"].value) if "rows/duplicate_docs" in gather else None,
            "contaminated_docs": int(gather["rows/contaminated_docs"].value) if "rows/contaminated_docs" in gather else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--shard-docs", type=int, default=20_000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_clean_shards"))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "clean_shards.json")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    corpus = args.work / "corpus"
    generate(args.docs, corpus, args.shard_docs, seed=0)
    load0 = os.getloadavg()[0]
    rows = [run(config(corpus, args.work / "root"), args.work, "first")]
    extra = args.work / "extra"
    generate(args.shard_docs, extra, args.shard_docs, seed=1)
    n_shards = len(list(corpus.glob("*.parquet")))
    import polars as pl

    appended = pl.read_parquet(extra / "part-00000.parquet").with_columns(id=pl.lit("appended-") + pl.col("id"))
    appended.write_parquet(corpus / f"part-{n_shards:05d}.parquet", compression="zstd")
    rows.append(run(config(corpus, args.work / "root"), args.work, "append"))
    rows.append(run(config(corpus, args.work / "scratch"), args.work, "scratch"))
    same = ((args.work / "root" / "clean" / "documents.parquet").read_bytes()
            == (args.work / "scratch" / "clean" / "documents.parquet").read_bytes())
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    out = {"benchmark": "bench_clean_shards", "commit": commit, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpu": platform.processor() or platform.machine(), "cores": len(os.sched_getaffinity(0)),
                       "load_average_at_start": round(load0, 1)},
           "docs": args.docs, "shard_docs": args.shard_docs, "shards_first": n_shards, "runs": rows,
           "append_equals_scratch": same}
    for r in rows:
        print(r)
    print("appended root's clean/documents.parquet equals the scratch run's:", same)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
