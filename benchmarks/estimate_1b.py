"""10⁹ documents / 5 × 10⁸ sequences on paper (issue 55): cores × hours and memory per worker,
from the per-part, per-band and per-shard costs measured in ``benchmarks/results/*.json``.

Nothing here is measured: each figure is a measured one scaled to the target size by the rule its
row names (linear in documents or sequences unless said otherwise), so it is as good as the
measurement it comes from (2 loaded cores, synthetic instances) and the rule. The published figures
of datatrove and NeMo Curator are quoted beside them with their sources, in their own units: they
are other corpora and other hardware, not the same work.

Inputs: ``partitioned_order_10m.json`` (else ``partitioned_order_1m.json``), ``near_bands_3m.json`` (else ``_1m``),
``clean_shards_1m.json``, ``small_files.json``, ``pack_memory.json``. Writes ``benchmarks/results/estimate_1b.json``
(rendered by ``benchmarks/tables.py``, table ``estimate_1b``).

    python benchmarks/estimate_1b.py
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.config import DedupConfig  # noqa: E402
from pipeline.ordering.engine import OrderParams  # noqa: E402
from pipeline.ordering.partitioned import DEAL_CHUNK  # noqa: E402
from pipeline.ordering.parts import PART_BYTES_PER_SEQUENCE, n_parts  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
DOCS = 1_000_000_000
SEQUENCES = 500_000_000  # a 10¹²-token corpus at L = 2,048
SEGMENTS = DOCS + SEQUENCES  # packing cuts at most one document at each sequence's end
PER_SHARD_STAGES = ("corpus_shards", "token_shards", "embedding_shards", "cluster_shards", "clean_shards", "quality_shards")
# the driver's arrays in the partitioned ordering (pipeline/ordering/partitioned.py: Corpus, and the finished order)
DRIVER_BYTES_PER_DOC = 8 + 8 + 1  # cluster, stream length (int64 each), the documents-held mask
DRIVER_BYTES_PER_SEGMENT = 8 + 8 + 4  # sequence_id, doc_id (int64), n_tokens (int32)
DRIVER_BYTES_PER_SEQUENCE = 8 + 8  # the sequences' first segments, the finished order

# Published figures for MinHash deduplication at scale, quoted with their sources (read 2026-11-29).
PUBLISHED = [
    {"tool": "NeMo Curator (Dask + RAPIDS, 2024)",
     "states": "deduplicated the 1.1 trillion token RedPajama dataset in 1.8 hours with 64 NVIDIA A100 GPUs (fuzzy deduplication)",
     "gpu_hours": 64 * 1.8,
     "source": "https://github.com/NVIDIA/NeMo-Curator/blob/06bcba4503a9b5c1781331408e873f5442a3a077/README.md"},
    {"tool": "NeMo Curator (Ray, 26.04)",
     "states": "fuzzy dedup of a RedPajama v2 subset on 3 nodes of H100 80 GB: 0.65 h against 10.7 h for a CPU-based alternative;"
               " 2.05 h, 1.01 h, 0.50 h on 1, 2, 4 nodes (the subset's size is not given there)",
     "gpu_hours": None,
     "source": "https://github.com/NVIDIA-NeMo/Curator/blob/003e6c16e7857a60ed7438d085a4c046a1ff0a0f/README.md"
               " (from https://docs.nvidia.com/nemo/curator/latest/about/concepts/scaling/throughput)"},
    {"tool": "datatrove (a user's Slurm benchmark, not the maintainers')",
     "states": "MinHash stage 1 (signatures) on 4 TB / 8 TB: 71 / 123 min with 1,200 tasks, 36 / 61 min with 2,400 tasks;"
               " stage 2 (buckets): 25 / 18 min with 300 tasks, 17 / > 38 min with 600 tasks (cores per task and documents not given)",
     "gpu_hours": None,
     "source": "https://github.com/huggingface/datatrove/issues/298"},
    {"tool": "datatrove (maintainers' example)",
     "states": "no measured time or memory in the README or the example; examples/minhash_deduplication.py asks Slurm for: stage 1"
               " (signatures) 1,000 tasks of up to 5 h; stage 2 (buckets) 14 tasks, one a bucket, of up to 90 h; stage 3"
               " (clusters) 1 task, 2 CPUs × 70 GB a CPU, up to 90 h (limits, not measurements)",
     "gpu_hours": None,
     "source": "https://github.com/huggingface/datatrove/blob/19f3b97f6af54d96108a6ed41e64b351df4d965d/examples/minhash_deduplication.py"},
]


def _load(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def _source(name: str, doc: dict) -> dict:
    return {"file": f"benchmarks/results/{name}.json", "commit": str(doc.get("commit", ""))[:12], "date": doc.get("date")}


def ordering_rows() -> tuple[list[dict], dict]:
    name = "partitioned_order_10m" if (RESULTS / "partitioned_order_10m.json").is_file() else "partitioned_order_1m"
    doc = _load(name)
    single, parted = doc["cases"]
    m, p_measured = parted["M"], parted["parts"]
    bound = OrderParams().order_part_bytes
    parts = n_parts(SEQUENCES, bound, OrderParams().batch_size)
    part_measured, part_target = m / p_measured, SEQUENCES / parts
    scale = part_target / part_measured
    worker_mb = parted["largest_worker_peak_rss_mb"] * (scale if scale > 1 else 1.0)
    worker_cpu = parted["workers_cpu_s"] / m * SEQUENCES
    driver_cpu = parted["driver_cpu_s"] / m * SEQUENCES
    driver_bytes = DRIVER_BYTES_PER_DOC * DOCS + DRIVER_BYTES_PER_SEGMENT * SEGMENTS + DRIVER_BYTES_PER_SEQUENCE * SEQUENCES
    chunks = math.ceil(SEQUENCES / DEAL_CHUNK)
    info = {"source": _source(name, doc), "measured_sequences": m, "measured_parts": p_measured, "parts": parts,
            "order_part_bytes": bound, "bytes_per_sequence": PART_BYTES_PER_SEQUENCE, "part_sequences": part_target,
            "measured_part_sequences": part_measured, "deal_chunks": chunks, "deal_files": chunks * parts,
            "single_process_peak_mb_per_sequence": single["driver_peak_rss_mb"] / single["M"]}
    rows = [
        {"stage": "`orderings`: each part's greedy", "runs": f"{parts} workers (Ray tasks), parts of {part_target:,.0f} sequences",
         "measured": f"{p_measured} parts of {part_measured:,.0f} sequences at M = {m:,}: {parted['workers_cpu_s']:,.0f} CPU s,"
                     f" largest worker {parted['largest_worker_peak_rss_mb']:,.0f} MB",
         "rule": "CPU linear in sequences; a worker's memory is its part's" + (f" (× {scale:.1f}: larger parts)" if scale > 1 else ""),
         "core_hours": worker_cpu / 3600, "core_hours_high": None, "worker_gb": worker_mb / 1000, "driver_gb": None},
        {"stage": "`orderings`: the deal (driver)", "runs": "the step process, one core",
         "measured": f"{parted['driver_cpu_s']:,.0f} CPU s on the driver at M = {m:,}, P = {p_measured}",
         "rule": f"linear in sequences; its per-sequence loop over parts grows with P ({p_measured} → {parts}): low end if the"
                 " features dominate, high end if the loop does",
         "core_hours": driver_cpu / 3600, "core_hours_high": driver_cpu * parts / p_measured / 3600, "worker_gb": None,
         "driver_gb": driver_bytes / 1e9},
    ]
    return rows, info


def near_rows() -> tuple[list[dict], dict]:
    name = "near_bands_3m" if (RESULTS / "near_bands_3m.json").is_file() else "near_bands_1m"
    doc = _load(name)
    n = doc["docs"]
    cores = doc.get("cpus_allowed", doc["machine"]["cores"])
    bands = DedupConfig().near_num_perm // DedupConfig().near_rows
    tasks = [c for c in doc["cases"] if c["tasks"]]
    one_band = next((c for c in tasks if c["tasks"] == bands), max(tasks, key=lambda c: c["tasks"]))
    widest = max(tasks, key=lambda c: c["tasks"])
    parts = -(-widest["tasks"] // bands) if widest["tasks"] > bands else 1
    part_docs = n / parts  # the documents a task holds (about)
    parts_1b = math.ceil(DOCS / part_docs)  # parts a band so a task holds what the measured one held
    tasks_1b = bands * parts_1b
    info = {"source": _source(name, doc), "measured_docs": n, "bands": bands, "measured_parts": parts, "parts": parts_1b,
            "tasks": tasks_1b, "part_docs": part_docs, "worker_peak_mb": widest["largest_task_peak_rss_mb"],
            "one_band_task_bytes_per_doc": (one_band["largest_task_peak_rss_mb"] - one_band["task_rss_before_mb"]) * 1e6 / n}
    rows = [{"stage": "`clean`: near pairs, a band and key part a task", "runs": f"{tasks_1b:,} tasks ({bands} bands × {parts_1b:,}"
             f" key parts), each holding about {part_docs:,.0f} documents' keys",
             "measured": f"{n:,} documents: {bands} tasks (a band each) in {one_band['wall_s']:.1f} s, {widest['tasks']} tasks"
                         f" ({parts} key parts a band) in {widest['wall_s']:.1f} s wall on {cores} core{'s' if cores != 1 else ''};"
                         f" largest task {widest['largest_task_peak_rss_mb']:,.0f} MB",
             "rule": "memory: a task's part kept at the measured part's documents (flat); time: low end a band read once"
                     f" (the {bands}-task case, linear in documents), high end as built: every part task reads every document's"
                     " signature row (quadratic in documents at a fixed part size)",
             "core_hours": cores * one_band["wall_s"] * DOCS / n / 3600,
             "core_hours_high": cores * widest["wall_s"] * (DOCS / n) * (tasks_1b / widest["tasks"]) / 3600,
             "worker_gb": widest["largest_task_peak_rss_mb"] / 1000, "driver_gb": None}]
    return rows, info


def clean_rows() -> tuple[list[dict], dict]:
    doc = _load("clean_shards_1m")
    first = doc["runs"][0]
    n, cores = first["documents"], doc["machine"]["cores"]
    parts = first["clean_parts_s"]
    scale = DOCS / n
    shards = math.ceil(DOCS / doc["shard_docs"])
    info = {"source": _source("clean_shards_1m", doc), "measured_docs": n, "shard_docs": doc["shard_docs"], "shards": shards,
            "gather_peak_bytes_per_doc": first["clean_alone_peak_rss_mb"] * 1e6 / n}
    rows = [
        {"stage": "`clean_shards`: hashes, signatures, n-gram hits", "runs": f"a task a unit, {shards:,} shards of {doc['shard_docs']:,}",
         "measured": f"{first['clean_shards_partitions']} partitions, {n:,} documents: {first['clean_shards_wall_s']:.1f} s wall on {cores}"
                     " cores (each partition a Dagster run)",
         "rule": "cores × wall, linear in documents; a worker holds one unit (not measured)",
         "core_hours": cores * first["clean_shards_wall_s"] * scale / 3600, "core_hours_high": None, "worker_gb": None, "driver_gb": None},
        {"stage": "`clean`: exact duplicates, decontamination (driver)", "runs": "the step process",
         "measured": f"exact {parts['exact']:.2f} s, decontamination {parts['decontam']:.2f} s at {n:,} documents",
         "rule": "linear in documents; the driver holds the hashes and each document's representative (8 B each)",
         "core_hours": (parts["exact"] + parts["decontam"]) * scale / 3600, "core_hours_high": None, "worker_gb": None,
         "driver_gb": 16 * DOCS / 1e9},
        {"stage": "`clean`: SemDeDup (driver)", "runs": "the step process, a cluster at a time",
         "measured": f"{parts['semantic']:.1f} s at {n:,} documents",
         "rule": "the sum of the clusters' squared sizes: quadratic in documents at the same K (a flat index per cluster)",
         "core_hours": parts["semantic"] * scale ** 2 / 3600, "core_hours_high": None, "worker_gb": None, "driver_gb": None},
        {"stage": "`clean` today: one index in one process", "runs": "the step process",
         "measured": f"peak {first['clean_alone_peak_rss_mb']:,} MB at {n:,} documents", "rule": "memory linear in documents",
         "core_hours": None, "core_hours_high": None, "worker_gb": None,
         "driver_gb": first["clean_alone_peak_rss_mb"] * 1e6 / n * DOCS / 1e9},
    ]
    return rows, info


def dagster_rows(shards: int) -> tuple[list[dict], dict]:
    doc = _load("small_files")
    run = next(r for r in doc["runs"] if r["run"] == "files")
    runs = shards * len(PER_SHARD_STAGES)
    info = {"source": _source("small_files", doc), "partition_runs": runs, "per_shard_stages": list(PER_SHARD_STAGES),
            "storage_gb": runs * run["dagster_bytes_per_file"] / 1e9}
    rows = [{"stage": "Dagster: a run a shard partition",
             "runs": f"{runs:,} runs ({len(PER_SHARD_STAGES)} per-shard stages × {shards:,} shards)",
             "measured": f"{run['wall_s_per_partition']:.2f} s and {run['dagster_bytes_per_file'] / 1000:,.0f} KB of event storage a"
                         " partition run",
             "rule": "linear in partition runs (one after another in `strata run`)",
             "core_hours": runs * run["wall_s_per_partition"] / 3600, "core_hours_high": None, "worker_gb": None,
             "driver_gb": info["storage_gb"]}]
    return rows, info


def packing_row() -> tuple[dict, dict]:
    """The ``concat`` packing in its step process, and its source: what its peak and its check's add
    per document (``pack_memory.json``, the larger of the two), linear in documents; their seconds a
    document at the larger size, as cores × hours (an upper bound: a step's wall on 2 cores)."""
    doc = _load("pack_memory")
    per_doc = max(doc["added_bytes_a_document"]["pack_streamed"], doc["added_bytes_a_document"]["check_streamed"])
    n = max(doc["docs"])
    seconds = sum(r["seconds"] for r in doc["runs"] if r["docs"] == n and r["mode"] in ("pack_streamed", "check_streamed"))
    hours = seconds / n * DOCS / 3600
    return {"stage": "`sequences`: packing and its check (driver)", "runs": "the step process",
            "measured": f"pack_memory.json: {n:,} documents, concat streamed ({per_doc:.1f} B a document added)",
            "rule": "linear in documents", "core_hours": hours, "core_hours_high": None, "worker_gb": None,
            "driver_gb": per_doc * DOCS / 1e9}, {"source": _source("pack_memory", doc)}


def main() -> None:
    order, order_info = ordering_rows()
    near, near_info = near_rows()
    clean, clean_info = clean_rows()
    dagster, dagster_info = dagster_rows(clean_info["shards"])
    packing, packing_info = packing_row()
    doc = {"benchmark": "estimate_1b.py", "documents": DOCS, "sequences": SEQUENCES, "segments": SEGMENTS,
           "rows": order + [packing] + clean[:1] + near + clean[1:] + dagster,
           "ordering": order_info, "packing": packing_info, "near": near_info, "clean": clean_info, "dagster": dagster_info,
           "published": PUBLISHED}
    out = RESULTS / "estimate_1b.json"
    out.write_text(json.dumps(doc, indent=1))
    for r in doc["rows"]:
        print(r["stage"], "|", r["core_hours"], r["core_hours_high"], "|", r["worker_gb"], "|", r["driver_gb"])
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
