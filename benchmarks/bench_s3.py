"""The corpus on object storage against the same corpus on disk, to orderings, as a ratio in one run.

Run: ``python benchmarks/bench_s3.py [--docs 1000000] [--shards 16] [--out FILE]`` (the issue's size,
1M documents, writes ``--out benchmarks/results/s3_vs_disk_1m.json``; the docs' tables render from
the results files: ``python benchmarks/tables.py``).

Writes ``--docs`` documents (the demo corpus's texts, cycled, with unique ids) as ``--shards``
JSONL.gz shards to a local folder and uploads the same bytes to a bucket of moto's standalone S3
server (the tests' server, ``tests/s3_server.py``: a process on 127.0.0.1, so the network is the
loopback and the server's own speed, not a real store's). Then ``strata run --select '*orderings'``
twice, in fresh data roots and processes, with ``corpus.path`` the folder and the ``s3://`` prefix,
and reports each run's wall time, the corpus stages' own seconds (``corpus_shards`` and
``corpus`` from the lineage table) and the ratios S3 / disk. Prints the load average, since the
machine is shared.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from s3_server import start_server  # noqa: E402


def corpus(n_docs: int, n_shards: int) -> list[bytes]:
    from helpers import DEMO_CORPUS

    texts = []
    with gzip.open(DEMO_CORPUS, "rt", encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            texts.append((rec["text"], rec.get("domain", "corpus")))
            if len(texts) >= 20_000:
                break
    per = -(-n_docs // n_shards)
    shards = []
    for s in range(n_shards):
        lines = []
        for i in range(s * per, min(n_docs, (s + 1) * per)):
            text, source = texts[i % len(texts)]
            lines.append(json.dumps({"id": f"d{i}", "text": f"{text} [{i}]", "source": source}))
        shards.append(gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=1))
    return shards


def run(path: str, root: Path, env: dict) -> dict:
    cfg = {"corpus": {"path": path}, "data_root": str(root), "heldout_fraction": 0.01, "vocab_size": 4096, "k": 16,
           "seq_len": 512, "strategies": ["random", "greedy"], "batch_size": 32, "embed_method": "shallow",
           "embed_max_tokens": 64}
    root.mkdir(parents=True)
    (root / "cfg.yaml").write_text(json.dumps(cfg))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(root / "cfg.yaml"), "--select", "*orderings"],
                          cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])
    import duckdb

    with duckdb.connect(str(root / "strata.duckdb"), read_only=True) as con:
        stages = dict(con.sql("SELECT asset, sum(wall_s) FROM lineage GROUP BY asset").fetchall())
    return {"wall_s": round(wall, 2), "corpus_shards_s": round(stages.get("corpus_shards", 0.0), 2),
            "corpus_s": round(stages.get("corpus", 0.0), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "s3_vs_disk.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp:
        tmp = Path(tmp)
        server = start_server(tmp / "moto.log")
        try:
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, "DAGSTER_HOME": "", "STRATA_HOME": "",
                   "STRATA_CONFIG": "", "PYTHONPATH": str(REPO), "AWS_ENDPOINT_URL": server.endpoint,
                   "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
                   "AWS_EC2_METADATA_DISABLED": "true"}
            import s3fs

            fs = s3fs.S3FileSystem(endpoint_url=server.endpoint, key="bench", secret="bench")
            fs.mkdir("bench")
            shards = corpus(args.docs, args.shards)
            (tmp / "disk").mkdir()
            for i, data in enumerate(shards):
                (tmp / "disk" / f"part-{i:05d}.jsonl.gz").write_bytes(data)
                fs.pipe(f"bench/corpus/part-{i:05d}.jsonl.gz", data)
            disk = run(str(tmp / "disk"), tmp / "root-disk", env)
            s3 = run("s3://bench/corpus/", tmp / "root-s3", env)
        finally:
            server.stop()
    result = {"docs": args.docs, "shards": args.shards, "corpus_bytes": sum(len(s) for s in shards), "disk": disk, "s3": s3,
              "ratio_wall": round(s3["wall_s"] / disk["wall_s"], 3),
              "ratio_corpus_shards": round(s3["corpus_shards_s"] / max(disk["corpus_shards_s"], 1e-9), 3),
              "loadavg": os.getloadavg(), "cores": os.cpu_count(), "server": "moto standalone (127.0.0.1)",
              "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip(),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(json.dumps(result, indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
