"""Many one-document shard files through ``strata run --select corpus_shards``, a partition a file
against grouped by ``corpus.group_bytes`` (issue 58 item 10), and against the same documents in one file.

Synthetic documents of about 1 KB (seeded words), one JSONL file each, run as:

1. ``files``: ``--ungrouped`` files, ``group_bytes: 0``: a ``corpus_shard`` partition (a Dagster run) a file;
2. ``grouped``: ``--files`` files with ``group_bytes: --group-bytes``: a partition a group;
3. ``grouped_edit``: one of those files edited, the same data root run again: the partitions that ran;
4. ``grouped_large``: ``--large`` files with ``group_bytes: 64 MB`` (every file one group);
5. ``one_file``: those ``--large`` documents in one file.

For each: the partitions that ran, the process's wall seconds and the bytes of its Dagster storage
(event log and runs, ``<data_root>/dagster``), per partition and per file. The validated documents of
``grouped_large`` and ``one_file`` (id, text, source, in order) are compared. Figures are printed and
written to ``benchmarks/results/small_files.json``, never asserted.

    python benchmarks/bench_small_files.py [--ungrouped 200] [--files 2000] [--large 10000] [--work /tmp/bench_small_files]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WORDS = [w for w in "the of and to in a is that for it as was with be by on not he this are or his from at which but have an they you "
         "were her she there been one all we their has would when if so no will more about can out up them some could into time only "
         "corpus order shard token document model data train learn read write file group small large partition".split()]


def document(i: int) -> str:
    rng = random.Random(i)
    text = " ".join(rng.choice(WORDS) for _ in range(180 + rng.randrange(40)))
    return json.dumps({"id": f"doc-{i:06d}", "text": text, "source": ["web", "books", "code"][i % 3]}) + "\n"


def one_per_file(folder: Path, n: int) -> Path:
    folder.mkdir(parents=True)
    for i in range(n):
        (folder / f"part-{i:06d}.jsonl").write_text(document(i))
    return folder


def run(work: Path, name: str, corpus: Path, group_bytes: int, root: Path | None = None) -> dict:
    """``strata run --select corpus_shards`` over ``corpus``: what ran, how long, the Dagster storage it left."""
    import dagster as dg

    root = root or work / name
    path = work / f"{name}.yaml"
    path.write_text(json.dumps({"data_root": str(root), "corpus": {"path": str(corpus), "group_bytes": group_bytes},
                                "heldout_fraction": 0.02}))
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(path), "--select", "corpus_shards"], cwd=ROOT,
                          env={**os.environ, "DAGSTER_HOME": ""}, capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode:
        sys.exit(proc.stderr[-4000:])
    instance = dg.DagsterInstance.from_config(str(root / "dagster"))
    parts = [r for r in instance.fetch_materializations(dg.AssetKey("corpus_shards"), limit=10_000).records if r.timestamp >= t0]
    records = sum(int(r.asset_materialization.metadata["rows/records"].value) for r in parts)
    dagster_bytes = sum(p.stat().st_size for p in (root / "dagster").rglob("*") if p.is_file())
    n_files = len(list(corpus.glob("*.jsonl")))
    return {"run": name, "files": n_files, "group_bytes": group_bytes, "partitions_run": len(parts), "records_read": records,
            "process_wall_s": round(wall, 1), "wall_s_per_partition": round(wall / max(len(parts), 1), 3),
            "wall_ms_per_file": round(1000 * wall / n_files, 2), "dagster_storage_bytes": dagster_bytes,
            "dagster_bytes_per_file": round(dagster_bytes / n_files)}


def validated(root: Path):
    import polars as pl

    files = sorted((root / "corpus" / "shards").glob("*.parquet"))
    return pl.concat([pl.read_parquet(f, columns=["id", "text", "source"]) for f in files])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ungrouped", type=int, default=200)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--group-bytes", type=int, default=256 << 10)
    ap.add_argument("--large", type=int, default=10_000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_small_files"))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "small_files.json")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    load0 = os.getloadavg()[0]
    rows = [run(args.work, "files", one_per_file(args.work / "c_files", args.ungrouped), 0)]
    many = one_per_file(args.work / "c_grouped", args.files)
    rows.append(run(args.work, "grouped", many, args.group_bytes))
    edited = many / f"part-{args.files // 2:06d}.jsonl"
    edited.write_text(edited.read_text().replace('"text": "', '"text": "edited '))
    rows.append(run(args.work, "grouped_edit", many, args.group_bytes, root=args.work / "grouped"))
    large = one_per_file(args.work / "c_large", args.large)
    rows.append(run(args.work, "grouped_large", large, 64 << 20))
    single = args.work / "c_one"
    single.mkdir()
    with open(single / "all.jsonl", "w") as fh:
        for i in range(args.large):
            fh.write(document(i))
    rows.append(run(args.work, "one_file", single, 0))
    same = validated(args.work / "grouped_large").equals(validated(args.work / "one_file"))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    out = {"benchmark": "bench_small_files", "commit": commit, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpu": platform.processor() or platform.machine(), "cores": len(os.sched_getaffinity(0)),
                       "load_average_at_start": round(load0, 1)},
           "runs": rows, "grouped_large_documents_equal_one_file": same}
    for r in rows:
        print(r)
    print("grouped files' validated documents equal one file's:", same)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
