"""The partitioned ordering at 100M sequences through a local Ray cluster, every process measured (issue 55).

Instance: bench_order.py's synthetic documents (Zipf(1) sizes over K = 1,000 clusters, log-normal
lengths), packed by concatenation into L = 2,048-token sequences, written as segment files of
``--file-sequences`` whole sequences each (``pipeline/ordering/segment_files.py``: per segment its
sequence, tokens, and its document's cluster and stream length; each file's documents drawn with a
seed of its own). Nothing here or in the ordering ever holds the corpus's segments or documents:

1. **generate**: the segment files, one at a time.
2. **order** (a fresh process, the driver): ``SegmentFiles`` reads the files once (length-bin
   edges from the documents' counted lengths); the deal (``pipeline.ordering.partitioned.deal``)
   gives the sequences, file by file, to P parts (P from the default ``order_part_bytes``); a local
   Ray cluster of 2 CPUs (``ray start --head``, ``pipeline/distributed/local_cluster.py``) orders each
   part as a Ray task (``order_part``, what ``partitioned_stream`` runs); the parts' orders are
   joined, part after part (the greedy's ``stretches`` layout), into a stream file
   (``write_stream``). The deal's files are kept, so a cluster lost mid-run (another Ray user on
   the machine) is started again for the parts still missing.
   Measured: wall and CPU seconds of the driver and of every Ray process (from /proc, polled), and
   each process's peak RSS (its VmHWM).
3. **diagnose** (a fresh process): per segment file, each sequence's (cluster, tokens) and
   (length bin, tokens) entries to a compact file; then the stream and 5 uniform shuffles of the
   sequences (``default_rng(seed + 1 + s).permutation(M)``, as bench_order's shuffles), each read in
   stretches of ``STRETCH`` positions gathered from those files and fed to
   ``pipeline.reports.streamed.StreamedDiagnostics``: prefix errors at 240 log-spaced prefixes
   t < M, every batch's deviation and the worst window of every length batch * 2**i. Reported: the
   share of prefixes below all 5 shuffles (all; past the first tenth), the worst window over the
   best shuffle's worst per length (and the largest ratio), the mean batch deviation, for clusters
   and length bins.

    python benchmarks/bench_order_100m.py                       # M = 100M (hours on 2 cores, ~20 GB of disk)
    python benchmarks/bench_order_100m.py --sequences 1000000 --out order_stream_1m
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from numba import njit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_order import BATCH, _commit, _machine, synthetic_docs  # noqa: E402

from pipeline.config import RayConfig  # noqa: E402
from pipeline.distributed.engine import map_tasks  # noqa: E402
from pipeline.distributed.local_cluster import cluster_pids, local_cluster  # noqa: E402
from pipeline.distributed.shards import Shard  # noqa: E402
from pipeline.ordering.composition import log_spaced_points  # noqa: E402
from pipeline.ordering.engine import OrderParams  # noqa: E402
from pipeline.ordering.partitioned import deal, order_part  # noqa: E402
from pipeline.ordering.parts import PART_BYTES_PER_SEQUENCE, n_parts, part_sizes, write_stream  # noqa: E402
from pipeline.ordering.segment_files import SegmentFiles, write_segment_file  # noqa: E402
from pipeline.packing.pack import pack_concat  # noqa: E402
from pipeline.reports.streamed import StreamedDiagnostics  # noqa: E402

L, K, B, SHUFFLES, POINTS = 2048, 1000, 100, 5, 240
LAYOUT = "stretches"  # the greedy's part layout (pipeline.ordering.parts): part after part
STRETCH = 1 << 23  # stream positions gathered at once by the diagnostics
MEAN_STREAM_LENGTH = 503  # synthetic_docs' mean document length (log-normal 5.5, 1.2, clipped)


def _status(pid: int | str, field: str) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")[:80]
    except OSError:
        return ""


# ---------------------------------------------------------------- generate


def generate(work: Path, m: int, per_file: int, seed: int) -> list[Path]:
    """The segment files of m sequences, ``per_file`` a file (each file's documents drawn afresh)."""
    folder = work / "segments"
    folder.mkdir(parents=True, exist_ok=True)
    files, done = [], 0
    for f in range(-(-m // per_file)):
        n = min(per_file, m - done)
        path = folder / f"seg{f:05d}.npz"
        if not path.is_file():
            n_docs = int(n * L / MEAN_STREAM_LENGTH * 1.1) + 1000
            cluster, length = synthetic_docs(n_docs, seed * 100_003 + f, K)
            seg = pack_concat(np.random.default_rng(seed * 100_003 + f).permutation(n_docs), length, L).segments
            seq = seg["sequence_id"].to_numpy()
            if seq.max() < n:  # too few documents drawn for n full sequences
                raise RuntimeError(f"file {f}: {seq.max() + 1} sequences from {n_docs} documents, {n} needed")
            keep = seq < n
            seq, doc, tok = seq[keep], seg["doc_id"].to_numpy()[keep], seg["n_tokens"].to_numpy()[keep]
            first = np.r_[True, doc[1:] != doc[:-1]]
            write_segment_file(path, (seq + done).astype(np.int64), tok.astype(np.int32), cluster[doc].astype(np.int32),
                               length[doc].astype(np.int32), first)
        files.append(path)
        done += n
        print(f"generate: {done:,} / {m:,} sequences", flush=True)
    return files


# ---------------------------------------------------------------- order (the driver, a fresh process)


def _poll(stop: threading.Event, temp_dir: Path, procs: dict[int, dict]) -> None:
    """Every Ray process's peak RSS (VmHWM) and CPU seconds, and the driver's, until ``stop``."""
    me = os.getpid()
    while not stop.wait(0.5):
        for pid in [me, *cluster_pids(temp_dir)]:
            hwm = _status(pid, "VmHWM")
            if hwm <= 0:
                continue
            p = procs.setdefault(pid, {"titles": set(), "peak_rss_mb": 0.0, "cpu_s": 0.0})
            p["peak_rss_mb"] = max(p["peak_rss_mb"], hwm)
            p["cpu_s"] = max(p["cpu_s"], _cpu_s(pid))
            p["titles"].add(_title(pid).split("/")[-1])


def _params(part_bytes: int) -> OrderParams:
    """The default objective; ``order_part_bytes`` the default unless ``part_bytes`` is given."""
    return OrderParams(length_bins=B, batch_size=BATCH, **({"order_part_bytes": part_bytes} if part_bytes else {}))


def _order_parts(pieces: list[list[str]], meta: str, params: OrderParams, seed: int, work: Path, procs: dict) -> float:
    """Each part ordered as a Ray task on a fresh local cluster (polled for every process's peak);
    parts whose order file exists are skipped, so a cluster lost mid-run is started again and only
    the missing parts run. Returns the cluster's start-up seconds."""
    shards = [Shard(f"greedy part {p}", ("greedy", params, seed, pieces[p], meta, str(work / f"order{p:05d}.npy")),
                    (work / f"order{p:05d}.npy",)) for p in range(len(pieces))]
    up = 0.0
    for attempt in range(3):
        t0 = time.perf_counter()
        with local_cluster([2]) as (address, temp_dir):
            up += time.perf_counter() - t0
            stop = threading.Event()
            poller = threading.Thread(target=_poll, args=(stop, temp_dir, procs), daemon=True)
            poller.start()
            try:
                map_tasks(order_part, shards, engine="ray", ray_cfg=RayConfig(address=address))
                return up
            except Exception as exc:  # noqa: BLE001 - a lost cluster: start another, run the parts still missing
                print(f"order: attempt {attempt + 1} lost its cluster ({type(exc).__name__}: {str(exc)[:200]})", flush=True)
            finally:
                stop.set()
                poller.join()
    raise RuntimeError("three local clusters lost")


def order(work: Path, seed: int, part_bytes: int) -> dict:
    """The deal (here, the driver), the parts on a local Ray cluster, their orders joined into ``stream.npy``."""
    files = sorted((work / "segments").glob("seg*.npz"))
    params = _params(part_bytes)
    procs: dict[int, dict] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    corpus = SegmentFiles(files, params)
    scan = time.perf_counter() - t0
    m = corpus.n_sequences
    parts = n_parts(m, params.order_part_bytes, params.batch_size)
    print(f"order: {m:,} sequences in {parts} parts", flush=True)
    dealt = work / "parts"
    t1 = time.perf_counter()
    reused = (dealt / "dealt.json").is_file()
    if reused:  # a rerun after a lost cluster: the deal's files are kept (and the deal timed by the `deal` child)
        pieces, meta = json.loads((dealt / "dealt.json").read_text())
    else:
        dealt.mkdir(parents=True, exist_ok=True)
        pieces, meta = deal(corpus, part_sizes(m, parts, params.batch_size, LAYOUT), dealt)
        (dealt / "dealt.json").write_text(json.dumps([pieces, meta]))
    deal_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    up = _order_parts(pieces, meta, params, seed, dealt, procs)
    parts_s = time.perf_counter() - t2 - up
    t3 = time.perf_counter()
    write_stream([dealt / f"order{p:05d}.npy" for p in range(parts)], params.batch_size, work / "stream.npy", LAYOUT)
    stream_s = time.perf_counter() - t3
    me = os.getpid()
    driver = procs.pop(me, {"peak_rss_mb": 0.0})
    driver["peak_rss_mb"] = max(driver["peak_rss_mb"], _status("self", "VmHWM"))
    ray = sorted(procs.values(), key=lambda p: -p["peak_rss_mb"])
    return {"M": m, "parts": parts, "order_part_bytes": params.order_part_bytes, "part_bytes_per_sequence": PART_BYTES_PER_SEQUENCE,
            "files": len(files), "scan_s": scan, "deal_s": deal_s, "deal_reused": reused, "cluster_start_s": up, "parts_s": parts_s,
            "layout": LAYOUT, "stream_s": stream_s,
            "order_s": deal_s + parts_s + stream_s, "wall_s": time.perf_counter() - t0,
            "driver_cpu_s": time.process_time() - c0, "driver_peak_rss_mb": driver["peak_rss_mb"],
            "ray_processes": len(ray), "ray_cpu_s": sum(p["cpu_s"] for p in ray),
            "largest_ray_peak_rss_mb": ray[0]["peak_rss_mb"] if ray else 0.0,
            "largest_task_worker_peak_rss_mb": max((p["peak_rss_mb"] for p in ray if {"ray::IDLE", "ray::_worker_call"} & p["titles"]),
                                                   default=0.0),
            "ray_process_peaks": [{"titles": sorted(t for t in p["titles"] if t), "peak_rss_mb": round(p["peak_rss_mb"], 1),
                                   "cpu_s": round(p["cpu_s"], 1)} for p in ray[:12]]}


def deal_only(work: Path, part_bytes: int) -> dict:
    """The deal alone, timed, into a scratch folder it then removes: its figures when the order's
    run reused an earlier deal's files."""
    t0, c0 = time.perf_counter(), time.process_time()
    params = _params(part_bytes)
    corpus = SegmentFiles(sorted((work / "segments").glob("seg*.npz")), params)
    m = corpus.n_sequences
    scratch = work / "deal-timing"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        deal(corpus, part_sizes(m, n_parts(m, params.order_part_bytes, params.batch_size), params.batch_size, LAYOUT), scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"deal_wall_s": time.perf_counter() - t0, "deal_cpu_s": time.process_time() - c0, "deal_peak_rss_mb": _status("self", "VmHWM"),
            "load_average_at_end": os.getloadavg()[0]}


# ---------------------------------------------------------------- diagnose (a fresh process)


def compact(work: Path, params: OrderParams) -> tuple[list[Path], np.ndarray, np.ndarray, int]:
    """Per segment file, each sequence's clusters and length-bin entries (counts uint8, groups int16,
    tokens uint16); the groups' global tokens; the number of length bins."""
    files = sorted((work / "segments").glob("seg*.npz"))
    corpus = SegmentFiles(files, params)
    n_bins = corpus.bin_edges.size + 1
    tot_c, tot_b, out, at = np.zeros(K, np.int64), np.zeros(n_bins, np.int64), [], 0
    for a, b in corpus.ranges(1 << 62):
        path = work / "compact" / f"c{len(out):05d}.npz"
        if not path.is_file():
            f, _ = corpus.chunk(a, b)
            arrays = {}
            for kind, x in (("c", f.clusters), ("b", f.bins)):
                if np.diff(x.indptr).max() > 255 or x.data.max() > 65535:
                    raise RuntimeError("a sequence has more than 255 groups or 65,535 tokens in one: widen the compact files")
                arrays |= {f"{kind}_count": np.diff(x.indptr).astype(np.uint8), f"{kind}_group": x.indices.astype(np.int16),
                           f"{kind}_tokens": x.data.astype(np.uint16)}
            path.parent.mkdir(exist_ok=True)
            np.savez(path, first=np.int64(a), **arrays)
        with np.load(path) as z:
            tot_c += np.bincount(z["c_group"], weights=z["c_tokens"], minlength=K).astype(np.int64)
            tot_b += np.bincount(z["b_group"], weights=z["b_tokens"], minlength=n_bins).astype(np.int64)
        out.append(path)
        at = b
    return out, tot_c, tot_b, at


@njit(cache=True)
def _place(count, src_ptr, src_group, src_tokens, rows, dest_ptr, dest_group, dest_tokens, dest_rows):
    """Copy the entries of source sequences ``rows`` to destination sequences ``dest_rows``."""
    for i in range(rows.size):
        r, d = rows[i], dest_rows[i]
        a, w = src_ptr[r], dest_ptr[d]
        for k in range(count[r]):
            dest_group[w + k] = src_group[a + k]
            dest_tokens[w + k] = src_tokens[a + k]


def _gather(ids: np.ndarray, files: list[Path], starts: np.ndarray, kinds=("c", "b")) -> dict[str, tuple]:
    """The entries of sequences ``ids`` (in this order), read file by file from the compact files."""
    by = np.argsort(ids, kind="stable")
    srt = ids[by]
    counts = {k: np.zeros(ids.size, np.int64) for k in kinds}
    cuts = np.searchsorted(srt, starts)
    for f, path in enumerate(files):
        lo, hi = cuts[f], cuts[f + 1] if f + 1 < len(files) else srt.size
        if lo == hi:
            continue
        with np.load(path) as z:
            for k in kinds:
                counts[k][by[lo:hi]] = z[f"{k}_count"][srt[lo:hi] - starts[f]]
    out = {}
    for k in kinds:
        ptr = np.zeros(ids.size + 1, np.int64)
        np.cumsum(counts[k], out=ptr[1:])
        out[k] = (ptr, np.empty(ptr[-1], np.int16), np.empty(ptr[-1], np.uint16))
    del counts
    for f, path in enumerate(files):
        lo, hi = cuts[f], cuts[f + 1] if f + 1 < len(files) else srt.size
        if lo == hi:
            continue
        with np.load(path) as z:
            for k in kinds:
                cnt = z[f"{k}_count"]
                src_ptr = np.zeros(cnt.size + 1, np.int64)
                np.cumsum(cnt, out=src_ptr[1:])
                ptr, group, tokens = out[k]
                _place(cnt, src_ptr, z[f"{k}_group"], z[f"{k}_tokens"], srt[lo:hi] - starts[f], ptr, group, tokens, by[lo:hi])
    return out


def _read(path: Path, a: int, b: int) -> np.ndarray:
    """Elements [a, b) of a 1-D int64 ``.npy``, read without mapping the file."""
    with open(path, "rb") as fh:
        np.lib.format.read_magic(fh)
        np.lib.format.read_array_header_1_0(fh)
        offset = fh.tell()
    return np.fromfile(path, dtype=np.int64, count=b - a, offset=offset + 8 * a)


def stream_figures(path: Path, files: list[Path], starts: np.ndarray, taus: dict, m: int, work: Path) -> dict:
    points = log_spaced_points(m, POINTS)
    points = points[points < m]
    diags = {k: StreamedDiagnostics(taus[k], BATCH, points, spill=work) for k in taus}
    for a in range(0, m, STRETCH):
        got = _gather(_read(path, a, min(m, a + STRETCH)), files, starts)
        for k, (ptr, group, tokens) in got.items():
            diags[k].add(ptr, group, tokens)
        del got
    out = {}
    for k, d in diags.items():
        fig = d.finish()
        out[k] = {"prefix_error": fig.prefix_error, "batch_dev": float(fig.batch_dev.mean()), "window_lengths": fig.window_lengths,
                  "window_worst": fig.window_worst}
    return out


def diagnose(work: Path, seed: int) -> dict:
    t0 = time.perf_counter()
    params = OrderParams(length_bins=B, batch_size=BATCH)
    files, tot_c, tot_b, m = compact(work, params)
    starts = np.array([int(np.load(p)["first"]) for p in files], dtype=np.int64)
    taus = {"c": tot_c / tot_c.sum(), "b": tot_b / tot_b.sum()}
    compact_s = time.perf_counter() - t0
    greedy = stream_figures(work / "stream.npy", files, starts, taus, m, work)
    shuffles = []
    for s in range(SHUFFLES):
        path = work / "shuffle.npy"
        np.save(path, np.random.default_rng(seed + 1 + s).permutation(m))
        shuffles.append(stream_figures(path, files, starts, taus, m, work))
        path.unlink()
        print(f"diagnose: shuffle {s + 1} of {SHUFFLES}", flush=True)
    points = log_spaced_points(m, POINTS)
    points = points[points < m]
    out = {"prefixes": int(points.size), "compact_s": compact_s, "diagnose_s": time.perf_counter() - t0,
           "diagnose_peak_rss_mb": _status("self", "VmHWM")}
    for kind, name in (("c", "cluster"), ("b", "bin")):
        g = greedy[kind]
        below = np.all(g["prefix_error"][None] < np.stack([s[kind]["prefix_error"] for s in shuffles]), axis=0)
        best = np.min(np.stack([s[kind]["window_worst"] for s in shuffles]), axis=0)
        ratio = g["window_worst"] / best
        out |= {f"{name}_below_all": float(below.mean()), f"{name}_below_last90": float(below[points > m / 10].mean()),
                f"{name}_window_lengths": g["window_lengths"].tolist(), f"{name}_window_ratio": ratio.tolist(),
                f"{name}_window_ratio_max": float(ratio.max()), f"{name}_batch_dev": g["batch_dev"],
                f"{name}_shuffle_batch_dev": float(np.mean([s[kind]["batch_dev"] for s in shuffles]))}
    return out


# ---------------------------------------------------------------- main


def _child(stage: str, work: Path, seed: int, part_bytes: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", stage, "--work", str(work), "--seed", str(seed),
                           "--part-bytes", str(part_bytes)],
                          stdout=subprocess.PIPE, text=True)
    if proc.returncode:
        raise RuntimeError(f"{stage} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sequences", type=int, default=100_000_000)
    ap.add_argument("--file-sequences", type=int, default=1 << 21)
    ap.add_argument("--seed", type=int, default=55)
    ap.add_argument("--work", default="/tmp/bench-order-100m")
    ap.add_argument("--out", default="")
    ap.add_argument("--part-bytes", type=int, default=0, help="order_part_bytes (default: the config's default)")
    ap.add_argument("--child", default="")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (segment files, stream)")
    a = ap.parse_args()
    work = Path(a.work)
    if a.child:
        run = {"order": lambda: order(work, a.seed, a.part_bytes), "deal": lambda: deal_only(work, a.part_bytes),
               "diagnose": lambda: diagnose(work, a.seed)}[a.child]
        print(json.dumps(run()), flush=True)
        return
    name = a.out or f"order_stream_{a.sequences // 1_000_000}m"
    commit, dirty = _commit()
    doc = {"benchmark": "bench_order_100m.py", "commit": commit, "modified_files": dirty, "machine": _machine(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "objective": OrderParams().objective, "K": K, "L": L, "length_bins": B,
           "batch": BATCH, "shuffles": SHUFFLES, "points": POINTS, "file_sequences": a.file_sequences}
    t0 = time.perf_counter()
    generate(work, a.sequences, a.file_sequences, a.seed)
    doc["generate_s"] = time.perf_counter() - t0
    doc["segment_files_gb"] = sum(p.stat().st_size for p in (work / "segments").glob("*.npz")) / 1e9
    doc["order"] = _child("order", work, a.seed, a.part_bytes)
    print(json.dumps(doc["order"]), flush=True)
    timing = None
    if doc["order"]["deal_reused"]:  # the deal timed again, beside the diagnostics (mostly one core)
        timing = subprocess.Popen([sys.executable, __file__, "--child", "deal", "--work", str(work), "--part-bytes", str(a.part_bytes)],
                                  stdout=subprocess.PIPE, text=True)
    doc["quality"] = _child("diagnose", work, a.seed, a.part_bytes)
    if timing is not None:
        out, _ = timing.communicate()
        if timing.returncode:
            raise RuntimeError(f"deal failed (exit {timing.returncode})")
        doc["deal"] = json.loads(out.strip().splitlines()[-1])
    doc["load_average_at_end"] = os.getloadavg()[0]
    out = REPO / "benchmarks" / "results" / f"{name}.json"
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
