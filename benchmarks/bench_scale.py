"""The path to orderings at scale: wall time, peak anonymous memory and throughput per stage.

A generator writes a synthetic corpus as Parquet shards (``--shard-docs`` documents each): text
is cut from the shared demo corpus (``/work/shared/data/corpus/demo_corpus.jsonl.gz``), one
domain per document drawn from a skewed mix (weights 0.35, 0.2, 0.14, ... over the 8 domains),
with log-normal lengths in characters (median 450, sigma 1; about 180 BPE tokens a document).
The graph then runs in a child process through ``orderings`` and ``ordering_diagnostics`` (no
training) with shallow embeddings, k = 1000 and seq_len 2048, one stage at a time, while this
process samples the RssAnon of the child's process tree (heap; pages of memory-mapped files do
not count) every 0.1 s. Figures are printed, never asserted.

    python benchmarks/bench_scale.py --docs 250000 1000000 [--work /tmp/bench_scale] [--keep]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEMO = Path(os.environ.get("STRATA_SHARED_DATA", ROOT.parent / "shared" / "data")) / "corpus" / "demo_corpus.jsonl.gz"
if not DEMO.is_file():
    DEMO = Path("/work/shared/data/corpus/demo_corpus.jsonl.gz")
MIX = np.array([0.35, 0.2, 0.14, 0.1, 0.08, 0.06, 0.04, 0.03])
STAGES = ["corpus", "tokenizer", "tokens", "embeddings", "clusters", "sequences", "orderings", "ordering_diagnostics"]


def generate(n_docs: int, out_dir: Path, shard_docs: int, seed: int = 0) -> dict:
    """Write ``n_docs`` synthetic documents as Parquet shards; returns a summary."""
    import polars as pl

    pools: dict[str, list[str]] = {}
    with gzip.open(DEMO, "rt", encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            pools.setdefault(rec["domain"], []).append(rec["text"])
    domains = sorted(pools)
    rng = np.random.default_rng(seed)
    weights = MIX[rng.permutation(len(domains))] if len(domains) == MIX.size else np.full(len(domains), 1 / len(domains))
    weights = weights / weights.sum()
    streams = {d: "\n\n".join(pools[d]) for d in domains}
    out_dir.mkdir(parents=True, exist_ok=True)
    chars = 0
    for shard, start in enumerate(range(0, n_docs, shard_docs)):
        n = min(shard_docs, n_docs - start)
        dom = rng.choice(len(domains), n, p=weights)
        lengths = np.clip(rng.lognormal(np.log(450), 1.0, n), 20, 200_000).astype(np.int64)
        texts = []
        for d, length in zip(dom, lengths):
            s = streams[domains[d]]
            if length >= len(s):
                texts.append((s * (int(length) // len(s) + 1))[:length])
                continue
            a = int(rng.integers(0, len(s) - length))
            texts.append(s[a : a + length].strip() or s[:length])
        chars += sum(map(len, texts))
        df = pl.DataFrame({"id": [f"doc-{i}" for i in range(start, start + n)], "text": texts,
                           "domain": [domains[d] for d in dom]})
        df.write_parquet(out_dir / f"part-{shard:05d}.parquet", compression="zstd")
    return {"docs": n_docs, "shards": -(-n_docs // shard_docs), "chars": chars}


CHILD = r"""
import json, sys, time
from assets.runner import prepare_environment
prepare_environment(sys.argv[1], None)
import dagster as dg
from assets.definitions import defs
instance = dg.DagsterInstance.get()
everything = list(defs.assets) + list(defs.asset_checks or [])
keys = defs.resolve_asset_graph().get(dg.AssetKey("orderings")).partitions_def.get_partition_keys()
marks = open(sys.argv[2], "a")
def run(stage, selection, parts=(None,)):
    marks.write(json.dumps({"stage": stage, "event": "start", "t": time.time()}) + "\n"); marks.flush()
    for p in parts:
        r = dg.materialize(everything, selection=selection, partition_key=p, instance=instance, resources=defs.resources)
        assert r.success, stage
    marks.write(json.dumps({"stage": stage, "event": "end", "t": time.time()}) + "\n"); marks.flush()
run("corpus", ["raw_corpus", "corpus"])
for s in ["tokenizer", "tokens", "embeddings", "clusters", "sequences"]:
    run(s, [s])
run("orderings", ["orderings"], keys)
run("ordering_diagnostics", ["ordering_diagnostics"], keys)
"""


def _rss_anon_tree(pid: int) -> int:
    """Sum of RssAnon (bytes) over ``pid`` and its descendants."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("RssAnon:"):
                        total += int(line.split()[1]) * 1024
                        break
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def measure(n_docs: int, work: Path, shard_docs: int, strategies: list[str]) -> list[dict]:
    import polars as pl

    base = work / f"n{n_docs}"
    shutil.rmtree(base, ignore_errors=True)
    t0 = time.perf_counter()
    info = generate(n_docs, base / "shards", shard_docs)
    print(f"generated {info['docs']:,} documents in {info['shards']} shards ({info['chars'] / 1e6:.0f}M chars) in {time.perf_counter() - t0:.0f} s", flush=True)
    cfg = {
        "data_root": str(base / "root"), "corpus": {"path": str(base / "shards"), "source_field": "domain"},
        "embed_method": "shallow", "k": 1000, "seq_len": 2048, "strategies": strategies, "batch_size": 32,
    }
    (base / "cfg.json").write_text(json.dumps(cfg))
    marks = base / "marks.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DAGSTER_HOME": ""}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(base / "cfg.json"), str(marks)], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=open(base / "child.log", "w"))
    samples: list[tuple[float, int]] = []

    def sample() -> None:
        while child.poll() is None:
            samples.append((time.time(), _rss_anon_tree(child.pid)))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    child.wait()
    sampler.join()
    if child.returncode:
        raise SystemExit(f"the graph failed; see {base / 'child.log'}")
    events = [json.loads(line) for line in marks.read_text().splitlines()]
    spans = {e["stage"]: [0.0, 0.0] for e in events}
    for e in events:
        spans[e["stage"]][0 if e["event"] == "start" else 1] = e["t"]
    t = np.array([s[0] for s in samples])
    m = np.array([s[1] for s in samples])
    root = base / "root"
    tokens = int(np.load(root / "tokens" / "doc_offsets.npy", mmap_mode="r")[-1])
    docs = pl.read_parquet(root / "corpus" / "shards.parquet")["n_docs"].sum()
    rows = []
    for stage in STAGES:
        a, b = spans[stage]
        inside = (t >= a) & (t <= b)
        peak = int(m[inside].max()) if inside.any() else 0
        wall = b - a
        rows.append({"stage": stage, "wall_s": wall, "peak_anon_gb": peak / 2**30, "docs_per_s": docs / wall, "tokens_per_s": tokens / wall})
    rows.append({"stage": "total", "wall_s": spans[STAGES[-1]][1] - spans[STAGES[0]][0], "peak_anon_gb": m.max() / 2**30,
                 "docs_per_s": docs / (spans[STAGES[-1]][1] - spans[STAGES[0]][0]), "tokens_per_s": tokens / (spans[STAGES[-1]][1] - spans[STAGES[0]][0])})
    print(f"\n{n_docs:,} documents ({docs:,} training), {tokens / 1e6:.1f}M tokens, shards of {shard_docs:,}; load average {os.getloadavg()[0]:.1f}")
    print(f"{'stage':<22}{'wall s':>9}{'peak anon GB':>14}{'docs/s':>12}{'tokens/s':>14}")
    for r in rows:
        print(f"{r['stage']:<22}{r['wall_s']:>9.1f}{r['peak_anon_gb']:>14.2f}{r['docs_per_s']:>12,.0f}{r['tokens_per_s']:>14,.0f}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, nargs="+", default=[250_000, 1_000_000])
    ap.add_argument("--shard-docs", type=int, default=125_000)
    ap.add_argument("--strategies", nargs="+", default=["random", "greedy", "greedy_block_shuffle", "cluster_packed"])
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_scale"))
    ap.add_argument("--keep", action="store_true", help="keep the generated corpus and data root")
    args = ap.parse_args()
    peaks = {}
    for n in args.docs:
        rows = measure(n, args.work, args.shard_docs, args.strategies)
        peaks[n] = rows[-1]["peak_anon_gb"]
        if not args.keep:
            shutil.rmtree(args.work / f"n{n}", ignore_errors=True)
    if len(peaks) > 1:
        lo, hi = min(peaks), max(peaks)
        print(f"\npeak at {hi:,} / peak at {lo:,} documents: {peaks[hi] / peaks[lo]:.2f}x")


if __name__ == "__main__":
    main()
