"""One very long one-line document through ``strata run`` to orderings: peak memory and wall time.

Run: ``nice -n 15 python benchmarks/bench_long_doc.py [--mb 50] [--out FILE]``.

Writes a JSONL corpus of 200 demo documents and one record whose text is ``--mb`` MB of the demo
corpus's own text (ordinary words, paragraphs joined by blank lines, on one JSONL line), salted so
that its content hash puts it in the training split. Then runs the real CLI,
``strata run --select '*orderings'``, in a fresh data root and process (a trained BPE, shallow
embeddings, ``random`` and ``greedy``, no training), and samples the memory of the whole process tree
(the CLI and every process it starts; proportional set size, so pages a forked child shares are
counted once) every 50 ms. Reports the peak of that sum per stage and overall, the
largest single process's peak (``ru_maxrss`` of the waited-for children), the wall time, each
stage's own seconds (the lineage table), the tokens counted for the long document and the load
average, since the machine is shared. Issue 49's bound: the peak under 1.5 GB at 50 MB.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from bench_ablate import commit, machine  # noqa: E402

N_DOCS = 200


def long_text(n_bytes: int) -> str:
    """About ``n_bytes`` bytes of the demo corpus's text (its first documents, repeated)."""
    from helpers import DEMO_CORPUS

    parts, size = [], 0
    with gzip.open(DEMO_CORPUS, "rt", encoding="utf-8") as fh:
        for line in fh:
            t = json.loads(line)["text"]
            parts.append(t)
            size += len(t.encode())
            if size >= 4_000_000:
                break
    body = "\n\n".join(parts)
    return (body * (n_bytes // len(body.encode()) + 1))[:n_bytes]


def write_corpus(path: Path, n_bytes: int) -> int:
    """The demo slice plus one long record (in the training split); returns its length in characters."""
    import polars as pl
    from helpers import demo_slice

    from pipeline.data.corpus import content_hashes, heldout_mask

    text = long_text(n_bytes)
    for salt in range(1000):
        candidate = f"{text}\n{salt}"
        if not heldout_mask(content_hashes(pl.Series([candidate])), 0.05, 0)[0]:
            break
    else:
        raise SystemExit("no salt puts the long document in the training split")
    with open(path, "w", encoding="utf-8") as fh:
        for rec in demo_slice(N_DOCS):
            fh.write(json.dumps(rec) + "\n")
        fh.write(json.dumps({"id": "long", "text": candidate, "domain": "long"}) + "\n")
    return len(candidate)


def tree_pss(pid: int) -> int:
    """Proportional set size of ``pid`` and all its descendants (from /proc): each shared page counted
    once over the processes that share it, so a forked child does not count its parent's memory twice."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as fh:
                total += next(int(line.split()[1]) * 1024 for line in fh if line.startswith("Pss:"))
        except (OSError, StopIteration):
            pass
        stack.extend(children.get(p, []))
    return total


def run(corpus: Path, root: Path, env: dict) -> dict:
    cfg = {"corpus": {"path": str(corpus), "source_field": "domain"}, "data_root": str(root), "heldout_fraction": 0.05,
           "vocab_size": 4096, "k": 8, "seq_len": 512, "strategies": ["random", "greedy"], "batch_size": 32,
           "embed_method": "shallow", "embed_max_tokens": 64}
    cfg_path = root.parent / "cfg.yaml"  # outside the data root, which Strata makes itself
    cfg_path.write_text(json.dumps(cfg))
    peak, stage, stage_peak = [0], ["start"], {}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "assets.cli", "run", "--config", str(cfg_path), "--select", "*orderings"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            now = tree_pss(proc.pid)
            peak[0] = max(peak[0], now)
            stage_peak[stage[0]] = max(stage_peak.get(stage[0], 0), now)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    lines = []
    for line in proc.stdout:  # "==> materializing <assets> [partition]" names the stage that runs
        lines.append(line)
        if line.startswith("==> materializing "):
            stage[0] = line[len("==> materializing "):].split(" [")[0].strip()
    proc.wait()
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    out = "".join(lines)
    if proc.returncode:
        raise SystemExit(out[-5000:])
    import duckdb
    import numpy as np
    import polars as pl

    with duckdb.connect(str(root / "strata.duckdb"), read_only=True) as con:
        stages = dict(con.sql("SELECT asset, round(sum(wall_s), 2) FROM lineage GROUP BY asset ORDER BY asset").fetchall())
    docs = pl.read_parquet(root / "documents.parquet")
    long_row = docs.filter(pl.col("id") == "long")
    offsets = np.load(root / "tokens" / "doc_offsets.npy")
    return {"wall_s": round(wall, 2), "peak_pss_tree_mb": round(peak[0] / 2**20, 1),
            "peak_rss_largest_process_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
            "peak_pss_tree_mb_by_stage": {k: round(v / 2**20, 1) for k, v in stage_peak.items()},
            "stage_s": stages, "long_doc_tokens": int(long_row["n_tokens"][0]), "long_doc_chars_counted": int(long_row["n_chars"][0]),
            "documents": docs.height, "tokens_with_eos": int(offsets[-1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mb", type=float, default=50.0, help="size of the long document in MB (10^6 bytes)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "long_doc.json"))
    ap.add_argument("--keep", help="build the data root in this new folder and keep it (default: a temporary one)")
    args = ap.parse_args()
    n_bytes = int(args.mb * 1_000_000)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # "+dirty": tracked files differed from the commit (on a shared tree, possibly others' edits elsewhere)
    start = {"machine": machine(), "commit": commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with tempfile.TemporaryDirectory(prefix="bench-long-doc-") as tmp:
        tmp = args.keep or tmp
        Path(tmp).mkdir(parents=True, exist_ok=True)
        corpus = Path(tmp) / "corpus.jsonl"
        chars = write_corpus(corpus, n_bytes)
        result = run(corpus, Path(tmp) / "root", env)
    doc = {"benchmark": "bench_long_doc.py", **start, "long_doc_bytes": n_bytes, "long_doc_chars": chars,
           "other_docs": N_DOCS, **result, "bound_mb": 1536, "within_bound": result["peak_pss_tree_mb"] < 1536,
           "loadavg_at_end": os.getloadavg()[0]}
    assert result["long_doc_chars_counted"] == chars, "the long document's characters were not all counted"
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
