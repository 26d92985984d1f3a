"""The docs' tables of measured figures, rendered from the benchmarks' result files.

A measured figure in the docs lives in a block between two markers::

    <!-- table: s3_vs_disk -->
    | ... the table ... |
    <!-- /table -->

whose name is a key of :data:`TABLES`: a function of the results folder (``benchmarks/results``)
returning the block's markdown, read from the JSON a benchmark wrote (each table names its
benchmark and, where the file records them, the commit, date and machine). The prose around a
block says what the figures mean; the figures themselves come only from here, so a rerun of a
benchmark updates the docs with one command and a doc cannot drift from its results file.

    python benchmarks/tables.py           # rewrite every block of docs/*.md and README.md
    python benchmarks/tables.py --check   # rewrite nothing; exit 1 naming each block out of sync

Exit 2 with the file and line for an unknown table name, an unclosed block or a missing results
file.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
OPEN = re.compile(r"^<!-- table: ([A-Za-z0-9_.-]+) -->$")
CLOSE = "<!-- /table -->"


class TableError(Exception):
    """A doc's markers or a results file that cannot be rendered (exit 2)."""


def _load(results: Path, name: str) -> dict:
    path = results / f"{name}.json"
    if not path.is_file():
        raise TableError(f"{path}: no such results file (run the benchmark that writes it, or remove the block)")
    return json.loads(path.read_text())


def _machine(doc: dict) -> str:
    m = doc.get("machine") or {}
    load = m.get("loadavg_at_start", m.get("load_average_at_start"))
    load = f" (load average {load:.1f} at the start)" if load is not None else ""
    return f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores{load}"


def order_prefix_markdown(doc: dict) -> str:
    """The table of a ``bench_order.py --prefix`` results file (docs/ordering.md, "Greedy at scale")."""
    head = ("| case | M | K | Zipf | L | clusters: below all, all prefixes | last 90% | length bins: all | last 90% |"
            " batch dev. clusters mean / worst | bins mean / worst | wall s | CPU s | peak RSS |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in doc["cases"]:
        pct = lambda v: f"{100 * v:.1f}%"  # noqa: E731
        lines.append(
            f"| {r['mode']} | {r['M']:,} | {r['K']} | {r['zipf']} | {r['L']} | {pct(r['cluster_below_all'])} |"
            f" {pct(r['cluster_below_last90'])} | {pct(r['bin_below_all'])} | {pct(r['bin_below_last90'])} |"
            f" {r['cluster_dev']:.4f} / {r['cluster_dev_max']:.4f} | {r['bin_dev']:.4f} / {r['bin_dev_max']:.4f} |"
            f" {r['seconds']:.1f} | {r['cpu_s']:.1f} | {r['peak_rss_mb']:.0f} MB |")
    lines.append("")
    lines.append(f"`{doc['benchmark']}` at {doc['commit'][:12]}, {doc['date']}, {_machine(doc)};"
                 f" objective {doc['objective']}, batch {doc['batch']},"
                 f" {doc['points']} log-spaced prefixes, {doc['shuffles']} shuffles.")
    return "\n".join(lines)


def s3_vs_disk(results: Path, name: str = "s3_vs_disk") -> str:
    """``bench_s3.py``: the same corpus to orderings from a local folder and from an S3 server
    (``name``: the results file, one a corpus size)."""
    doc = _load(results, name)
    lines = ["| corpus read from | to orderings, wall s | `corpus_shards` s | `corpus` s |", "|---|---:|---:|---:|"]
    for key, label in (("disk", "local folder"), ("s3", "`s3://` (moto server)")):
        run = doc[key]
        lines.append(f"| {label} | {run['wall_s']:.1f} | {run['corpus_shards_s']:.2f} | {run['corpus_s']:.2f} |")
    lines.append(f"| **s3 / disk** | **{doc['ratio_wall']:.2f}×** | {doc['ratio_corpus_shards']:.2f}× | |")
    load = ", ".join(f"{v:.1f}" for v in doc.get("loadavg", []))
    lines.append("")
    lines.append(f"`bench_s3.py`: {doc['docs']:,} documents in {doc['shards']} JSONL.gz shards"
                 f" ({doc['corpus_bytes'] / 1e6:.1f} MB), {doc['cores']} cores (load average {load});"
                 f" server: {doc['server']}. From `benchmarks/results/{name}.json`.")
    return "\n".join(lines)


def ablate_simulation(results: Path) -> str:
    """``bench_ablate.py``: simulated ``strata ablate`` campaigns, one row a case."""
    doc = _load(results, "ablate_simulation")
    lines = ["| true Δ (rel.) | held-out documents | P(better) | P(worse) | P(equivalent) | P(unresolved) |"
             " mean runs | most runs |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in doc["cases"]:
        lines.append(f"| {c['delta_rel']:+.3f} | {c['units_available']} | {c['p_better']:.3f} | {c['p_worse']:.3f} |"
                     f" {c['p_equivalent']:.3f} | {c['p_unresolved']:.3f} | {c['runs']:.1f} | {c['runs_max']} |")
    lines.append("")
    lines.append(f"`{doc['benchmark']}` at {doc['commit'][:12]}, {doc['date']}, {_machine(doc)};"
                 f" {doc['campaigns']:,} campaigns a case, budget {doc['budget_runs']:.0f} runs.")
    return "\n".join(lines)


def ablate_campaign(results: Path) -> str:
    """A finished ``strata ablate`` campaign (``record_campaign.py``): each round's grid, Δ, interval
    and verdict per strategy, then the compute it took."""
    doc = _load(results, "ablate_campaign")
    lines = ["| round | strategy | seeds × documents | Δ (nats) | anytime-valid 95% interval | verdict | spent (min) |",
             "|---:|---|---|---:|---|---|---:|"]
    for r in doc["rounds"]:
        lines.append(f"| {r['round']} | {r['strategy']} | {r['n_seeds']} × {r['n_units']} | {r['delta']:+.4f} |"
                     f" [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] | {r['verdict']} | {r['spent_s'] / 60:.1f} |")
    last = doc["rounds"][-1]
    proc = doc["process"]
    lines.append("")
    lines.append(f"Margin ±{last['margin']:.4f} nats ({last['effect_rel']:.1%} of {last['baseline']}'s"
                 f" {last['baseline_mean']:.4f}); budget {last['budget_s'] / 60:.0f} min;"
                 f" {last['spent_tokens']:,} training tokens. The process: {proc['wall_s'] / 60:.1f} min wall,"
                 f" {proc['cpu_s'] / 60:.1f} min CPU, peak RSS {proc['peak_rss_mb']:,.0f} MB."
                 f" `strata ablate` at {doc['commit'][:12]}, {doc['date']}, {_machine(doc)}. {doc.get('note', '')}")
    return "\n".join(lines)


def _share(x: float | None) -> str:
    return f"{x:.3f}" if x is not None else "–"


def clean_planted(results: Path, name: str = "clean_planted") -> str:
    """``bench_clean.py``: recall per planted kind, precision per detector (contamination per
    evaluation set), the near and semantic threshold sweeps, and the near pass's speed against
    datasketch alone (``name``: the results file, one a corpus size)."""
    doc = _load(results, name)
    th = doc["params"]["threshold"]
    sem = doc.get("semantic")
    detector = {"exact": "exact (normalized hash)", **{k: f"near (MinHash, J ≥ {th:g})" for k in doc["recall"] if k != "exact"}}
    lines = ["| planted kind | detector | planted | found | recall |", "|---|---|---:|---:|---:|"]
    for kind, r in doc["recall"].items():
        lines.append(f"| {kind} | {detector[kind]} | {r['planted']:,} | {r['found']:,} | {_share(r['recall'])} |")
    if sem:
        at = sem["by_threshold"][f"{sem['threshold']:g}"]
        for kind, r in at["recall"].items():
            lines.append(f"| {kind} | semantic (cosine > {sem['threshold']:g}); near alone {sem['found_by_near'][kind]} |"
                         f" {r['planted']:,} | {r['found']:,} | {_share(r['recall'])} |")
    for name, r in doc["contamination"].items():
        lines.append(f"| contamination: {name} | 13-grams | {r['planted']:,} | {r['found']:,} | {_share(r['recall'])} |")
    lines += ["", "| detector | flagged | correct | precision |", "|---|---:|---:|---:|"]
    rows = [(k, r) for k, r in doc["precision"].items()]
    if sem:
        rows.append((f"semantic (negatives: {sem['same_topic_negatives']['pairs_same_topic_same_cluster']:,} same-topic pairs"
                     " in a cluster)", at["semantic"]))
    rows += [(f"contamination: {name} ({r['natural_overlap']:,} by natural overlap)", r) for name, r in doc["contamination"].items()]
    for name, r in rows:
        lines.append(f"| {name} | {r['flagged']:,} | {r['correct']:,} | {_share(r['precision'])} |")
    sweep = doc["threshold_sweep"]
    kinds = [k for k in doc["recall"] if k != "exact"]
    lines += ["", "| near_threshold | " + " | ".join(kinds) + " | precision | pairs with true J < threshold | LSH candidates | near s |",
              "|---:|" + "---:|" * (len(kinds) + 4)]
    for t, r in sweep.items():
        lines.append(f"| {t} | " + " | ".join(_share(r["recall"][k]) for k in kinds) + f" | {_share(r['near']['precision'])} |"
                     f" {r['true_jaccard_below_threshold']:,} | {r['lsh_candidates']:,} | {r['near_s']:.1f} |")
    if sem:
        sk = list(at["recall"])
        lines += ["", "| semantic_threshold | " + " | ".join(sk) + " | precision | wrong pairs (same topic) |",
                  "|---:|" + "---:|" * (len(sk) + 2)]
        for t, r in sem["by_threshold"].items():
            cells = " | ".join(_share(r["recall"][k]["recall"]) for k in sk)
            wrong = f"{r['wrong_pairs']:,} ({r['wrong_pairs_same_topic']:,})"
            lines.append(f"| {t} | {cells} | {_share(r['semantic']['precision'])} | {wrong} |")
    sec = doc["seconds"]
    lines.append("")
    lines.append(f"Near pass over {doc['near_docs']:,} documents: {doc['near_docs_per_s']:,.0f} docs/s against datasketch alone"
                 f" {doc['datasketch_docs_per_s']:,.0f} docs/s (**{doc['ratio_vs_datasketch']:.2f}×**); exact {sec['exact']:.1f} s,"
                 f" decontamination {sec['decontam']:.1f} s (+ {sec['eval_ngrams_build']:.1f} s for"
                 f" {sum(r['eval_ngrams'] for r in doc['contamination'].values()):,} eval n-grams); resident memory"
                 f" {doc['rss_mb']['text_pass_start']:,.0f} MB at the start of the text pass (the texts, the evaluation n-grams),"
                 f" {doc['rss_mb']['text_pass_end']:,.0f} MB at its end (the LSH index and signatures held).")
    if sem:
        e, neg = sem["embedding"], sem["same_topic_negatives"]
        lines.append(f"Semantic corpus: a subset of {sem['docs']:,} documents ({sem['base_docs']:,} base over {sem['topics']} topics,"
                     f" {sem['per_kind']} copies a kind; paraphrases replace {sem['synonym_share']['mean_replaced']:.0%} of the words),"
                     f" embedded with {e['model']} ({e['method']}, {e['max_tokens']} tokens) in {sem['seconds']['embed']:.0f} s,"
                     f" k-means k = {e['k']} in {sem['seconds']['kmeans']:.1f} s; {sem['copies_in_original_cluster']} of"
                     f" {sem['per_kind'] * len(sk)} copies share their original's cluster. Cosine of a copy with its original"
                     " (median, 10th percentile): " + ", ".join(f"{k.removeprefix('semantic_')} {q['median']:.3f}, {q['p10']:.3f}"
                                                                for k, q in sem["copy_cosine"].items()) +
                     f"; of a base document with the closest other document of its topic in its cluster: median"
                     f" {neg['best_same_topic_cosine']['median']:.3f}, 90th percentile {neg['best_same_topic_cosine']['p90']:.3f},"
                     f" {neg['above_0.9']} above 0.9.")
    lines.append(f"`{doc['benchmark']} --docs {doc['base_docs']}` ({doc['docs']:,} documents) at {doc['commit'][:12]}, {doc['date']},"
                 f" {_machine(doc)}; {doc['wall_s'] / 60:.1f} min wall, peak RSS {doc['peak_rss_mb_total']:,.0f} MB.")
    return "\n".join(lines)


def mixture_anchors(results: Path) -> str:
    """``bench_mixture_anchors.py``: the same named sources and weights through megatron-core's
    ``BlendedDataset``, OLMo-core's source mixture and shuffle, and ``greedy_blend``."""
    doc = _load(results, "mixture_anchors")
    methods = list(doc["methods"])
    head = ("| batch | scheduler | sources: batch L1 mean / worst | clusters | length bins | sequences (distinct) | max copies |"
            " build s (first) |")
    lines = [head, "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for b in doc["batches"]:
        for name in methods:
            r = doc["methods"][name]
            m = r["per_batch"][str(b)]
            lines.append(f"| {b} | {name} | {m['source_dev_mean']:.4f} / {m['source_dev_max']:.4f} |"
                         f" {m['cluster_dev_mean']:.4f} / {m['cluster_dev_max']:.4f} | {m['bin_dev_mean']:.4f} / {m['bin_dev_max']:.4f} |"
                         f" {r['positions']:,} ({r['distinct_sequences']:,}) | {r['max_copies']} | {r['build_seconds']:.2f}"
                         f" ({r['first_build_seconds']:.2f}) |")
    strata = next(n for n in methods if n.startswith("Strata"))
    anchors = [n for n in methods if n != strata]
    lines.append("")
    for b in doc["batches"]:
        got = {n: doc["methods"][n]["per_batch"][str(b)] for n in methods}
        parts = []
        for key, label in (("source", "sources"), ("cluster", "clusters"), ("bin", "length bins")):
            best = min(anchors, key=lambda n: got[n][f"{key}_dev_mean"])
            mine, theirs = got[strata][f"{key}_dev_mean"], got[best][f"{key}_dev_mean"]
            verdict = ("equal to" if abs(mine - theirs) < 5e-5 else
                       f"{theirs / mine:.2f}x lower than" if mine < theirs else f"**worse** ({mine / theirs:.2f}x) than")
            parts.append(f"{label} {verdict} the best anchor's ({best.split()[0]})")
        lines.append(f"Batch {b}: Strata's mean per-batch L1 — " + "; ".join(parts)
                     + f"; the floor for sources at this batch is {doc['source_floor'][str(b)]:.4f}.")
    fastest = min(anchors, key=lambda n: doc["methods"][n]["build_seconds"])
    build, theirs = doc["methods"][strata]["build_seconds"], doc["methods"][fastest]["build_seconds"]
    lines.append(f"Build: Strata {build:.2f} s, " + ("**slower**" if build > theirs else "faster")
                 + f" than {fastest.split()[0]} ({theirs:.2f} s).")
    src = ", ".join(f"{n} {v['weight']:.2f} (corpus {v['corpus_share']:.2f}, {v['documents']:,} docs)" for n, v in doc["sources"].items())
    lines.append("")
    lines.append(f"`{doc['benchmark']}` at {doc['commit'][:12]}, {doc['date']}, {_machine(doc)}; {doc['documents']:,} demo-corpus"
                 f" documents packed per source into {doc['sequences']:,} sequences of {doc['seq_len']}; weights {src};"
                 f" schedule {doc['schedule_tokens']:,} tokens, max_repetition {doc['max_repetition']:g}; k-means k={doc['k']},"
                 f" {doc['length_bins']} length bins; megatron-core {doc['versions']['megatron-core']},"
                 f" ai2-olmo-core {doc['versions']['ai2-olmo-core']}.")
    return "\n".join(lines)


def clean_shards(results: Path, name: str = "clean_shards_1m") -> str:
    """``bench_clean_shards.py``: the clean stage from scratch, after an appended shard, and a scratch
    root over the appended corpus."""
    doc = _load(results, name)
    lines = ["| run | `clean_shards` partitions run | their s | `clean` s | held-out rescan s | near (LSH) s | semantic s |"
             " `clean` alone: s, peak RSS MB | `*clean` process s |", "|---" + "|---:" * 8 + "|"]
    for r in doc["runs"]:
        parts = r["clean_parts_s"]
        lines.append(f"| {r['run']} ({r['documents']:,} documents) | {r['clean_shards_partitions']} | {r['clean_shards_wall_s']:.1f} |"
                     f" {r['clean_wall_s']:.1f} | {parts['heldout_scan']:.1f} | {parts['near']:.1f} | {parts['semantic']:.1f} |"
                     f" {r['clean_alone_wall_s']:.1f}, {r['clean_alone_peak_rss_mb']:,} | {r['process_wall_s']:.1f} |")
    m = doc["machine"]
    lines.append("")
    lines.append(f"`bench_clean_shards.py --docs {doc['docs']} --shard-docs {doc['shard_docs']}` at {doc['commit'][:12]}, {doc['date']},"
                 f" {m['cpu']}, {m['cores']} cores (load average {m['load_average_at_start']:.1f} at the start);"
                 f" the appended root's `clean/documents.parquet` equals the scratch root's byte for byte:"
                 f" **{'yes' if doc['append_equals_scratch'] else 'no'}**. From `benchmarks/results/{name}.json`.")
    return "\n".join(lines)


def near_recall(results: Path, name: str = "near_recall") -> str:
    """``bench_near_recall.py``: each MinHash setting's LSH banding against the exact Jaccard of planted
    near copies (docs/cleaning.md, "Near-duplicate recall"); the default setting in bold."""
    doc = _load(results, name)
    lines = ["| permutations | bands × rows | P(candidate) at 0.8 | LSH recall (≥ 0.8) | recall (≥ 0.8) | 0.80–0.85 | 0.85–0.90 |"
             " 0.90–1 | found with true J < 0.7 | candidates | LSH s |", "|---:" * 11 + "|"]
    for s in doc["settings"]:
        default = (s["num_perm"], s["rows"]) == (72, 6) and s["how"].startswith("pipeline")
        perms = f"{s['num_perm']}" + (" (datasketch, before)" if s["how"].startswith("datasketch") else " (default)" if default else "")
        bands = f"{s['bands']} × {s['rows']}" + (" (datatrove)" if (s["bands"], s["rows"]) == (14, 8) else "")
        by = s["recall_by_true_jaccard"]
        cells = [perms, bands, f"{s['s_curve_at_threshold']:.3f}", f"{s['lsh_recall']:.3f}", f"{s['recall']:.3f}",
                 f"{by['0.8-0.85']:.3f}", f"{by['0.85-0.9']:.3f}", f"{by['0.9-1']:.3f}", f"{s['found_pairs_below_threshold_minus_0.1']}",
                 f"{s['candidates']:,}", f"{s['lsh_s']:.2f}"]
        lines.append("| " + " | ".join(f"**{c}**" if default else c for c in cells) + " |")
    lines.append("")
    base = doc["docs"] - doc["planted_pairs"]
    lines.append(f"`{doc['benchmark']} --docs {base} --copies {doc['planted_pairs']}` ({doc['docs']:,} documents,"
                 f" {doc['planted_pairs']:,} planted pairs) at {doc['commit'][:12]}, {doc['date'][:10]}, {_machine(doc)};"
                 f" {doc['wall_s']:.0f} s wall. From `benchmarks/results/{name}.json`.")
    return "\n".join(lines)


def partitioned_order(results: Path, name: str = "partitioned_order_1m") -> str:
    """``bench_partitioned_order.py``: the one-process greedy and the partitioned one, side by side."""
    doc = _load(results, name)
    pct = lambda v: f"{100 * v:.1f}%"  # noqa: E731
    lines = ["| ordering | parts | wall s | CPU s: driver + workers | peak RSS MB: driver / largest worker |"
             " prefixes below all 5 shuffles: clusters, all / last 90% | length bins | worst window / best shuffle's, max over lengths:"
             " clusters / bins | batch dev. mean: clusters / bins | vs one process |", "|---|---:" + "|---:" * 8 + "|"]
    single = doc["cases"][0]
    for r in doc["cases"]:
        ratio = " / ".join(f"{r[f'{k}_batch_dev'] / single[f'{k}_batch_dev']:.3f}x" for k in ("cluster", "bin"))
        workers = f"{r['largest_worker_peak_rss_mb']:,.0f}" if r["parts"] > 1 else "—"
        lines.append(f"| {r['mode']} | {r['parts']} | {r['seconds']:.1f} | {r['driver_cpu_s']:.1f} + {r['workers_cpu_s']:.1f} |"
                     f" {r['driver_peak_rss_mb']:,.0f} / {workers} |"
                     f" {pct(r['cluster_below_all'])} / {pct(r['cluster_below_last90'])} |"
                     f" {pct(r['bin_below_all'])} / {pct(r['bin_below_last90'])} |"
                     f" {r['cluster_window_ratio_max']:.3f} / {r['bin_window_ratio_max']:.3f} |"
                     f" {r['cluster_batch_dev']:.4f} / {r['bin_batch_dev']:.4f} | {ratio} |")
    lines.append("")
    lines.append(f"`{doc['benchmark']}` at {doc['commit'][:12]}, {doc['date']}, {_machine(doc)}; M = {single['M']:,} sequences,"
                 f" K = {doc['K']}, L = {doc['L']}, {doc['length_bins']} length bins, objective {doc['objective']}, batch {doc['batch']},"
                 f" {doc['points']} log-spaced prefixes, {doc['shuffles']} shuffles. From `benchmarks/results/{name}.json`.")
    return "\n".join(lines)


def order_stream(results: Path, names: tuple[str, ...] = ("order_stream_100m", "order_stream_100m_batches")) -> str:
    """``bench_order_100m.py``: the partitioned greedy through a local Ray cluster, from segment files to
    a stream file, a row per part layout measured (``stretches``: part after part; ``batches``: batch
    by batch, a file without ``layout``); every process's peak, and the stream's figures against 5
    shuffles and the one-process greedy at 10M (``partitioned_order_10m.json``: the same generator and objective)."""
    docs = [(name, _load(results, name)) for name in names if (results / f"{name}.json").is_file()]
    single = _load(results, "partitioned_order_10m")["cases"][0]
    pct = lambda v: f"{100 * v:.1f}%"  # noqa: E731
    layout = lambda d: d["order"].get("layout", "batches")  # noqa: E731
    lines = ["| parts make the stream | sequences | parts | wall s: read the files / the parts on Ray (the deal: below) |"
             " CPU s: driver + Ray processes | peak RSS MB: driver / largest Ray worker / diagnostics |", "|---|---:|---:|---:|---:|---:|"]
    for _, doc in docs:
        o, q = doc["order"], doc["quality"]
        lines.append(f"| {layout(doc)} | {o['M']:,} | {o['parts']} | {o['scan_s']:,.0f} / {o['order_s']:,.0f} |"
                     f" {o['driver_cpu_s']:,.0f} + {o['ray_cpu_s']:,.0f} |"
                     f" {o['driver_peak_rss_mb']:,.0f} / {o['largest_task_worker_peak_rss_mb']:,.0f} / {q['diagnose_peak_rss_mb']:,.0f} |")
    lines += ["", "| family | parts make the stream | prefixes below all 5 shuffles: all / past the first tenth |"
              " worst window / best shuffle's worst, max over lengths |"
              " batch dev. mean | shuffles' | one-process greedy at 10M | ratio |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for kind, label in (("cluster", "clusters"), ("bin", "length bins")):
        for _, doc in docs:
            q = doc["quality"]
            lines.append(f"| {label} | {layout(doc)} | {pct(q[f'{kind}_below_all'])} / {pct(q[f'{kind}_below_last90'])} |"
                         f" {q[f'{kind}_window_ratio_max']:.3f} | {q[f'{kind}_batch_dev']:.4f} | {q[f'{kind}_shuffle_batch_dev']:.4f} |"
                         f" {single[f'{kind}_batch_dev']:.4f} | {q[f'{kind}_batch_dev'] / single[f'{kind}_batch_dev']:.3f}x |")
    lines.append("")
    for name, doc in docs:
        o, q = doc["order"], doc["quality"]
        lines.append(f"{layout(doc).capitalize()}: `{doc['benchmark']}` at {doc['commit'][:12]}, {doc['date']}, {_machine(doc)};"
                     f" M = {o['M']:,} sequences in {o['files']} segment files ({doc['segment_files_gb']:.1f} GB), K = {doc['K']},"
                     f" L = {doc['L']}, {doc['length_bins']} length bins, objective {doc['objective']}, batch {doc['batch']},"
                     f" `order_part_bytes` {o['order_part_bytes']:,}; {q['prefixes']} log-spaced prefixes, {doc['shuffles']} shuffles,"
                     f" windows of {len(q['cluster_window_lengths'])} lengths ({q['cluster_window_lengths'][0]:,} to"
                     f" {q['cluster_window_lengths'][-1]:,} sequences). From `benchmarks/results/{name}.json`.")
        lines.append("")
    return "\n".join(lines[:-1])


def _amount(x: float | None, high: float | None = None) -> str:
    if x is None:
        return "—"
    fmt = (lambda v: f"{v:,.0f}") if x >= 10 else (lambda v: f"{v:,.1f}")  # noqa: E731
    return fmt(x) + (f" – {fmt(high)}" if high is not None else "")


def estimate_1b(results: Path) -> str:
    """``estimate_1b.py``: 10⁹ documents / 5 × 10⁸ sequences on paper, from the measured costs; then
    the published figures of datatrove and NeMo Curator, quoted with their sources."""
    doc = _load(results, "estimate_1b")
    lines = [f"| stage | runs on, at {doc['documents']:,} documents / {doc['sequences']:,} sequences | measured | scaled by |"
             " cores × hours | memory per worker, GB | driver (or storage), GB |", "|---|---|---|---|---:|---:|---:|"]
    for r in doc["rows"]:
        lines.append(f"| {r['stage']} | {r['runs']} | {r['measured']} | {r['rule']} | {_amount(r['core_hours'], r['core_hours_high'])} |"
                     f" {_amount(r['worker_gb'])} | {_amount(r['driver_gb'])} |")
    sources = sorted({(k, v["source"]["file"], v["source"]["commit"], str(v["source"]["date"])) for k, v in doc.items()
                      if isinstance(v, dict) and "source" in v}, key=lambda t: t[1])
    lines.append("")
    lines.append("From " + "; ".join(f"`{f}` ({c}, {d[:10]})" for _, f, c, d in sources) + ", by `benchmarks/estimate_1b.py`"
                 " (`benchmarks/results/estimate_1b.json`); every figure is a measured one scaled by its row's rule, on the"
                 " measurements' 2 loaded cores.")
    lines += ["", "| published | what it states | source |", "|---|---|---|"]
    for p in doc["published"]:
        lines.append(f"| {p['tool']} | {p['states']} | {p['source']} |")
    return "\n".join(lines)


def quality_scoring(results: Path) -> str:
    """``bench_quality.py``: each scorer through Strata against its library alone, then 1M documents
    through the quality stage's per-shard path."""
    doc = _load(results, "quality_scoring")
    ft, hf, big = doc["fasttext"], doc["hf_classifier"], doc.get("big")
    lines = ["| scorer | documents | Strata s | library alone s | Strata / library |", "|---|---:|---:|---:|---:|",
             f"| `fasttext` (`predict(k=-1)` on one-line texts) | {ft['docs']:,} | {ft['strata_s']:.3f} | {ft['library_s']:.3f} |"
             f" **{ft['ratio']:.2f}×** |",
             f"| `hf_classifier` ({hf['model']}, {hf['max_tokens']} tokens, batches of {hf['batch_size']}, {hf['torch_threads']}"
             f" torch thread{'s' if hf['torch_threads'] != 1 else ''}; tokenizer + forward) |"
             f" {hf['docs']:,} | {hf['strata_s']:.3f} | {hf['library_s']:.3f} | **{hf['ratio']:.2f}×** |"]
    if big:
        lines += ["", "| documents | characters | shards | scoring wall s | documents / s | CPU s | peak RSS |",
                  "|---:|---:|---:|---:|---:|---:|---:|",
                  f"| {big['scored']:,} | {big['chars'] / 1e6:,.0f} M | {big['shards']} of {big['shard_docs']:,} |"
                  f" {big['score_wall_s']:.1f} | {big['docs_per_s']:,} | {big['cpu_s']:.1f} | {big['peak_rss_mb']:,} MB |"]
    m = doc["fasttext_model"]
    lines.append("")
    lines.append(f"`{doc['benchmark']}` at {doc['commit'][:12]}, {doc['date']}, {_machine(doc)}; best of the interleaved repeats;"
                 f" the fastText model ({m['model_mb']} MB, held-out AUC {m.get('heldout_auc', float('nan')):.3f}) trained by"
                 " `fasttext_trained` on demo documents. From `benchmarks/results/quality_scoring.json`.")
    return "\n".join(lines)


def _mb(value, before=None) -> str:
    """``value`` MB (``before``: in brackets), or a dash where the run did not record it."""
    if value is None:
        return "—"
    return f"{value:,.0f}" + (f" ({before:,.0f})" if before is not None else "")


def near_bands(results: Path, name: str = "near_bands") -> str:
    """``bench_near_bands.py``: the clean gather's near pairs from one index and from band-group tasks
    (beyond the 12 bands: a task a band and key part)."""
    doc = _load(results, name)
    anon = any("largest_task_peak_anon_mb" in r for r in doc["cases"])
    head = ["near pairs", "wall s", "driver peak RSS MB (after imports)"] + (["driver anonymous peak MB"] if anon else [])
    head += ["largest task peak RSS MB (after imports)"] + (["largest task anonymous peak MB"] if anon else [])
    head += ["pairs", "candidates compared", "pairs equal the one index's"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 2) + "---|"]
    bands = 12
    for r in doc["cases"]:
        t = r["tasks"]
        how = "one index in the driver (`near_band_tasks: 0`)" if not t else f"`near_band_tasks: {t}`"
        if t > bands:
            how += f" ({-(-t // bands)} key parts a band)"
        same = {True: "yes", False: "**no**", None: "(no one-index case)"}[r["same_pairs_as_one_index"]]
        row = [how, f"{r['wall_s']:.2f}", _mb(r["driver_peak_rss_mb"], r["rss_before_mb"])]
        row += [_mb(r.get("driver_peak_anon_mb"))] if anon else []
        row += [_mb(r["largest_task_peak_rss_mb"], r["task_rss_before_mb"]) if t else "—"]
        row += [_mb(r.get("largest_task_peak_anon_mb")) if t else "—"] if anon else []
        row += [f"{r['pairs']:,}", f"{r['candidates']:,}", same]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append(f"`{doc['benchmark']} --docs {doc['docs']} --copies {doc['copies']}` ({doc['shards']} signature files,"
                 f" {doc['planted_pairs_found']:,} of the planted copies found) at {doc['commit'][:12]}, {doc['date'][:10]},"
                 f" {_machine(doc)}" + (f", {doc['cpus_allowed']} core allowed (`taskset`)" if "cpus_allowed" in doc else "")
                 + "; a peak RSS counts the pages of files its process memory-mapped"
                 + ("; the anonymous peak (sampled) does not" if anon else "") + f". From `benchmarks/results/{name}.json`.")
    return "\n".join(lines)


def datatrove_compare(results: Path, name: str = "datatrove_compare") -> str:
    """``bench_datatrove.py``: near duplicates of the same documents by Strata, datatrove and datasketch."""
    doc = _load(results, name)
    t = doc["tools"]
    what = {"strata": "Strata: signatures + band tasks (check >= 0.8) + union-find",
            "strata_unverified": "Strata, every candidate kept (threshold 0)",
            "datatrove": "datatrove 0.10.1: MinHash stages 1–4 (`LocalPipelineExecutor`)",
            "datasketch": "datasketch alone: `MinHash` + `MinHashLSH` query, then insert",
            "datasketch_verified": "datasketch alone, its candidates checked (>= 0.8)"}
    lines = ["| near duplicates | groups | documents in groups | documents removed | largest group | wall s | CPU s |"
             " documents / s | documents / CPU s | peak RSS MB (largest process) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, label in what.items():
        r = t[key]
        shared = {"datasketch_verified": " (the same run)", "strata_unverified": " (Strata's signatures)"}.get(key, "")
        lines.append(f"| {label} | {r['groups']:,} | {r['documents_in_groups']:,} | {r['documents_removed']:,} | {r['largest_group']:,} |"
                     f" {r['wall_s']:.1f}{shared} | {r['cpu_s']:.1f} | {r['docs_per_s']:,} | {doc['docs'] / r['cpu_s']:,.0f} |"
                     f" {r['peak_rss_mb']:,.0f} |")
    lines += ["", "| stage | processes | wall s | CPU s | stage process peak RSS MB | largest other process MB |",
              "|---|---:|---:|---:|---:|---:|"]
    seen = set()
    for key in ("strata", "strata_unverified", "datatrove", "datasketch"):
        for r in t[key]["stages"]:
            if r["stage"] in seen:
                continue
            seen.add(r["stage"])
            lines.append(f"| `{r['stage']}` | {r['processes']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {_mb(r['stage_peak_rss_mb'])} |"
                         f" {_mb(r['largest_worker_peak_rss_mb'])} |")
    lines += ["", "| agreement | groups identical | co-grouped pairs (first / second / both) | Jaccard of co-grouped pairs |"
              " Jaccard of documents in groups | Jaccard of removed documents |", "|---|---:|---:|---:|---:|---:|"]
    for key, r in doc["agreement"].items():
        a, b = key.split("_vs_")
        lines.append(f"| {a} vs {b} | {r['groups_identical']:,} | {r['co_grouped_pairs_a']:,} / {r['co_grouped_pairs_b']:,} /"
                     f" {r['co_grouped_pairs_both']:,} | {r['co_grouped_pairs_jaccard']:.3f} | {r['documents_in_groups_jaccard']:.3f} |"
                     f" {r['removed_jaccard']:.3f} |")
    lines.append("")
    lines.append(f"`{doc['benchmark']} --docs {doc['docs']}` ({doc['shards']} Parquet shards, {doc['chars'] / 1e6:,.0f} M characters)"
                 f" at {doc['commit'][:12]}, {doc['date'][:10]}, {_machine(doc)}, {doc['cpus_allowed']} core allowed"
                 f" (`taskset`), Strata's `near_band_tasks: {doc['band_tasks']}`; datatrove {doc['versions']['datatrove']},"
                 f" datasketch {doc['versions']['datasketch']}. From `benchmarks/results/{name}.json`.")
    return "\n".join(lines)


def clean_tasks(results: Path, name: str = "clean_tasks") -> str:
    """``bench_clean_tasks.py``: the clean gather's exact duplicates and SemDeDup in its process and as tasks."""
    doc = _load(results, name)
    lines = ["| exact + semantic | exact wall s | semantic wall s | driver peak RSS MB (after imports) |"
             " largest exact task peak RSS MB (after imports) | largest semantic task peak RSS MB (after imports) |"
             " exact duplicates | semantic pairs | equal to the gather's |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in doc["cases"]:
        how = "in the driver (`clean_tasks: 0`)" if not r["tasks"] else f"`clean_tasks: {r['tasks']}`"
        ex = f"{r['largest_exact_task_peak_rss_mb']:,.0f} ({r['exact_task_rss_before_mb']:,.0f})" if r["tasks"] else "—"
        sem = f"{r['largest_semantic_task_peak_rss_mb']:,.0f} ({r['semantic_task_rss_before_mb']:,.0f})" if r["tasks"] else "—"
        driver = f"{r['driver_peak_rss_mb']:,.0f} ({r['rss_before_mb']:,.0f})"
        lines.append(f"| {how} | {r['exact_wall_s']:.2f} | {r['semantic_wall_s']:.2f} | {driver} | {ex} | {sem} |"
                     f" {r['exact_duplicates']:,} | {r['semantic_pairs']:,} | {'yes' if r['same_as_in_the_gather'] else '**no**'} |")
    lines.append("")
    lines.append(f"`{doc['benchmark']} --docs {doc['docs']} --copies {doc['copies']}` ({doc['shards']} hash and embedding files,"
                 f" {doc['clusters']:,} clusters, {doc['dim']}-value embeddings) at {doc['commit'][:12]}, {doc['date'][:10]},"
                 f" {_machine(doc)}; a peak counts the memory-mapped pages its process read. From `benchmarks/results/{name}.json`.")
    return "\n".join(lines)


def small_files(results: Path, name: str = "small_files") -> str:
    """``bench_small_files.py``: ``strata run --select corpus_shards`` over one-document files, a
    partition a file against grouped by ``corpus.group_bytes``, and the same documents in one file."""
    doc = _load(results, name)
    what = {"files": "a partition a file", "grouped": "grouped", "grouped_edit": "grouped, one file edited, run again",
            "grouped_large": "grouped", "one_file": "the same documents in one file"}
    lines = ["| run | files | `group_bytes` | partitions run | wall s | s a partition | ms a file | Dagster storage KB | KB a file |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["runs"]:
        lines.append(f"| {what.get(r['run'], r['run'])} | {r['files']:,} | {r['group_bytes']:,} | {r['partitions_run']:,} |"
                     f" {r['process_wall_s']:.1f} | {r['wall_s_per_partition']:.2f} | {r['wall_ms_per_file']:,.1f} |"
                     f" {r['dagster_storage_bytes'] / 1000:,.0f} | {r['dagster_bytes_per_file'] / 1000:,.1f} |")
    same = "equal" if doc["grouped_large_documents_equal_one_file"] else "NOT equal"
    lines.append("")
    lines.append(f"`{doc['benchmark']}` at {doc['commit'][:12]}, {doc['date']}, {_machine(doc)}; wall: the whole `strata run` process"
                 " (its start and the corpus's listing included); Dagster storage: the data root's after the run (the edited run's"
                 f" holds the first run's too). The grouped files' validated documents (id, text, source, in order) are {same} to"
                 f" the one file's. From `benchmarks/results/{name}.json`.")
    return "\n".join(lines)


def _fmt_mde(v: float | None) -> str:
    return "—" if v is None or v != v else f"{v:.4f}"  # NaN below 2 seeds


def quality_ablation(results: Path) -> str:
    """``bench_quality_ablation.py``: the quality-aware orderings' held-out loss vs random at equal training tokens."""
    doc = _load(results, "quality_ablation")
    loss = {r["strategy"]: r for r in doc["loss"]}
    lines = ["| ordering | held-out loss (nats/token, mean ± std over seeds) | Δ vs random | 95% interval | per seed Δ | MDE |",
             "|---|---:|---:|---|---|---:|"]
    def cell(r: dict) -> str:
        return f"{r['mean']:.4f}" + (f" ± {r['std']:.4f}" if r.get("std") is not None else "")

    lines.append(f"| random | {cell(loss['random'])} | | | | |")
    for d in doc["delta_vs_random"]:
        delta = f"{d['delta']:+.4f}"
        lines.append(f"| {d['strategy']} | {cell(loss[d['strategy']])} | {'**' + delta + '**' if d['significant'] else delta} |"
                     f" [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}] | {' '.join(f'{x:+.4f}' for x in d['per_seed_delta'])} |"
                     f" {_fmt_mde(d['mde'])} |")
    partial = " **Partial**: " + doc["partial"] + "." if doc.get("partial") else ""
    lines.append("")
    one = " (one seed: the interval covers the documents' variation only)" if len(doc["seeds"]) == 1 else ""
    n = len(doc["seeds"])
    lines.append(f"{n} seed{'s' if n > 1 else ''} ({', '.join(map(str, doc['seeds']))}) × {doc['heldout_documents']} held-out documents,"
                 f" {doc['training_tokens']:,} training tokens per run ({doc['steps']} steps × {doc['batch_size']} × {doc['seq_len']});"
                 f" `{doc['metric']}`; intervals: two-way bootstrap over seeds × documents{one} (bold: excludes zero)."
                 f" `strata run` wall {doc['wall_min']} min, summed over the data roots."
                 f" `{doc['benchmark']}` at {doc['commit'][:12]}, {doc['date']}, {_machine(doc)}."
                 f" From `benchmarks/results/quality_ablation.json`.{partial}")
    return "\n".join(lines)


def scale_1m_run(results: Path) -> str:
    """``bench_scale.py --strata-run`` at 1M documents beside the same path stage by stage: each
    stage's peak heap (RssAnon of the process tree), the clean gather's parts, the data root by folder."""
    run, staged = _load(results, "scale_1m_run"), _load(results, "scale_1m_stages")
    alone = {r["stage"]: r for r in staged["stages"]}
    lines = ["| stage | peak heap in the one `strata run`, GB | peak heap run alone, GB |", "|---|---:|---:|"]
    for stage, gb in run["peak_anon_gb_by_step"].items():
        own = alone.get(stage, {}).get("peak_anon_gb")
        lines.append(f"| `{stage}` | {gb:.2f} | {'—' if own is None else f'{own:.2f}'} |")
    lines.append(f"| **the whole run** | **{run['peak_anon_gb']:.2f}** | {alone['total']['peak_anon_gb']:.2f} |")
    parts = run["clean_parts"]["peak_rss_mb"]
    lines += ["", "| `clean` gather part | " + " | ".join(parts) + " |", "|---|" + "---:|" * len(parts),
              "| peak resident MB in the one run (VmHWM: heap and touched file pages) | "
              + " | ".join(f"{v:,.0f}" for v in parts.values()) + " |",
              "| peak resident MB run alone | " + " | ".join(f"{v:,.0f}" for v in alone["clean parts"]["peak_rss_mb"].values()) + " |"]
    docs = run["training_docs"]
    folders = {k: v for k, v in sorted(run["root_mb_by_folder"].items(), key=lambda kv: -kv[1]) if v >= 1}
    lines += ["", "| data root folder | MB | bytes a training document |", "|---|---:|---:|"]
    lines += [f"| `{k}/` | {v:,.1f} | {v * 2**20 / docs:,.0f} |" for k, v in folders.items()]
    lines.append(f"| **the root** | **{run['root_gb'] * 1024:,.0f}** | {run['root_gb'] * 2**30 / docs:,.0f} |")
    kinds = {k: v for k, v in sorted(run["clean_bytes_by_kind"].items(), key=lambda kv: -kv[1]) if v >= 2**20}
    lines.append("")
    lines.append("Of `clean/`: " + ", ".join(f"`{k}` {v / 2**20:,.0f} MB ({v / docs:,.1f} B a document)" for k, v in kinds.items())
                 + ". MB and GB are 2^20 and 2^30 bytes.")
    lines.append("")
    lines.append(f"`bench_scale.py --docs 1000000 --shard-docs 125000 --strata-run` at {run['commit'][:12]}, {run['date']}"
                 f" ({docs:,} training documents, {run['wall_s']:,.1f} s wall, load average {run['load_average_at_end']:.1f} at the end),"
                 f" and the same path stage by stage, each stage in a process of its own (`bench_scale.py --docs 1000000"
                 f" --no-baselines`, {staged['commit'][:12]}, {staged['date']}); a stage's peak in the one run is the tree's"
                 " highest sample from the previous asset's materialization to its own (partitions side by side included)."
                 " From `benchmarks/results/scale_1m_run.json` and `scale_1m_stages.json`.")
    return "\n".join(lines)


def export_writers(results: Path, name: str = "export_writers") -> str:
    """``bench_export.py --writers``: the flat formats by one writer and by several, each export in a
    fresh process; medians over the repeats, with the walls' range."""
    doc = _load(results, name)
    lines = ["| format | writers | wall s (median; range of the repeats) | driver CPU s | workers' CPU s (together) |"
             " driver peak RSS MB (after imports) |"
             " largest worker peak RSS MB | load average | same bytes as 1 writer |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    keys = list(dict.fromkeys((r["format"], r["writers"]) for r in doc["cases"]))
    for fmt, n in keys:
        rs = [r for r in doc["cases"] if r["format"] == fmt and r["writers"] == n]

        def med(k: str, rs=rs) -> float:
            return float(statistics.median([r[k] for r in rs]))

        walls, loads = [r["wall_s"] for r in rs], [r["load_average"] for r in rs]
        worker, worker_cpu = (f"{med('largest_worker_peak_rss_mb'):,.0f}", f"{med('workers_cpu_s'):.1f}") if n > 1 else ("—", "—")
        spread = f" ({min(walls):.1f}–{max(walls):.1f})" if len(walls) > 1 else ""
        lines.append(f"| {fmt} | {n} | {med('wall_s'):.1f}{spread} | {med('driver_cpu_s'):.1f} |"
                     f" {worker_cpu} | {med('driver_peak_rss_mb'):,.0f} ({med('rss_before_mb'):,.0f}) | {worker} |"
                     f" {'–'.join(dict.fromkeys(f'{x:.1f}' for x in (min(loads), max(loads))))} |"
                     f" {'yes' if all(r['same_bytes_as_first'] for r in rs) else '**no**'} |")
    first = doc["cases"][0]
    lines.append("")
    lines.append(f"`{doc['benchmark']} {' '.join(str(n) for n in sorted({r['writers'] for r in doc['cases']}))}`:"
                 f" {first['sequences']:,} sequences × {doc['seq_len']} = {first['tokens']:,} tokens,"
                 f" {f'{len(walls)} repeats alternating' if len(walls) > 1 else 'one run a case'},"
                 f" at {doc['commit'][:12]}, {doc['date'][:10]}, {_machine(doc)}. From `benchmarks/results/{name}.json`.")
    return "\n".join(lines)


def pack_memory(results: Path) -> str:
    """``bench_pack_memory.py``: the packing and its token-conservation check, the segments whole or a
    stretch / batch at a time, at two corpus sizes, and what each adds per document between them."""
    doc = _load(results, "pack_memory")
    sizes = doc["docs"]
    what = {"pack_whole": "`pack`, then the table written", "pack_streamed": "`pack_concat_file`",
            "check_whole": "`conservation` on the table read whole", "check_streamed": "`conservation_file`"}
    head = " | ".join(f"{n / 1e6:g}M docs: {w}" for n in sizes for w in ("s", "peak MiB"))
    lines = [f"| step | {head} | bytes a document added |", "|---|" + "---:|" * (2 * len(sizes) + 1)]
    for mode, label in what.items():
        cells = []
        for n in sizes:
            r = next(r for r in doc["runs"] if r["mode"] == mode and r["docs"] == n)
            cells += [f"{r['seconds']:,.1f}", f"{r['peak_mib']:,.0f}"]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {doc['added_bytes_a_document'][mode]:,.1f} |")
    segs = ", ".join(f"{int(v):,}" for v in doc["segments"].values())
    lines += ["", f"`bench_pack_memory.py --docs {' '.join(str(n) for n in sizes)}` at {doc['commit'][:12]}, {doc['date']},"
              f" {doc['machine']['cores']} cores; `concat`, L = {doc['seq_len']:,}, log-normal lengths ({segs} segments). Each step in"
              " a fresh process; peak: its VmHWM; \"bytes a document added\": the peaks' difference over the documents' (the"
              " order and lengths included, made a chunk at a time). From `benchmarks/results/pack_memory.json`."]
    return "\n".join(lines)


def ray_driver_beside(results: Path, before: str, now_name: str, flags: str, beside: str) -> str:
    """``before``'s run before beside ``bench_scale.py --strata-run --engine ray`` on the same generator
    after the per-shard stages' workers write their own results (``now_name``: the run's own JSON, or
    ``ray_driver_partial.py report``'s of a run stopped before its end, its one case)."""
    doc, now = _load(results, before), _load(results, now_name)
    run = whole = next(iter(now["runs"].values())) if now.get("partial") else now
    cut = ""
    if doc.get("partial") and not now.get("partial"):  # the run before stopped early: its stages only, to compare
        steps = {k: v for k, v in run["ray_by_step"].items() if k in doc["runs"]["before"]["ray_by_step"]}
        run = {**run, "ray_by_step": steps, "complete": True, "finished_stages": list(steps),
               "ray_peaks_gb": {k: max(v.get(k, 0.0) for v in steps.values()) for k in run["ray_peaks_gb"]},
               "wall_s": sum(v["wall_s"] for v in steps.values()),
               "ray_bytes_received": sum(v["ray_bytes_received"] for v in steps.values())}
        cut = (f" It ran to its end; its rows are the stages the run before finished (its whole run: {whole['wall_s']:,.0f} s, the"
               f" driver's processes at most {whole['ray_peaks_gb']['driver_tree_gb']:.2f} GB, {whole['ray_bytes_received']:,} bytes"
               f" received from Ray in all).")
    both = {**doc, "side_by_side": False, "runs": {"before": doc["runs"]["before"], "workers write": run}}
    table = ray_driver(results, before, both)
    stopped = (f" It was stopped before its end: the stages it finished, from samples {now['sample_interval_s']:.0f} s apart"
               f" (`benchmarks/ray_driver_partial.py`) taken from {run['sampled_from']} (it started at {run['run_started']})."
               if now.get("partial") else "")
    return (table + f"\n\nThe run \"workers write\": `bench_scale.py --docs {now['docs']} --shard-docs {now['shard_docs']} --strata-run"
            f" --engine ray {flags}` at {now['commit'][:12]}, {now['date']}, alone but beside {beside} (its walls are"
            f" load's).{stopped}{cut} It received {run['ray_bytes_received']:,} bytes from Ray in"
            f" {'the stages measured' if now.get('partial') or cut else 'all'}. The run \"before\" is the table above's (run beside that"
            f" table's \"after\"). From `benchmarks/results/{now_name}.json`.")


def ray_driver(results: Path, name: str = "ray_driver_1m", doc: dict | None = None) -> str:
    """``bench_scale.py --ray-driver``: one ``strata run`` with ``engine: ray`` before (the clean
    gather's duplicates in the driver) and after (they and the greedy family's parts as Ray tasks):
    by stage, the driver's peak heap, the largest Ray worker's and the bytes the driver took from Ray."""
    doc = doc or _load(results, name)
    runs = doc["runs"]
    cases = list(runs)
    head = " | ".join(f"{c}: {what}" for c in cases for what in ("s", "driver GB", "Ray worker GB", "received MB"))
    lines = [f"| stage | {head} |", "|---|" + "---:|" * 4 * len(cases)]
    steps = list(dict.fromkeys(k for c in cases for k in runs[c]["ray_by_step"]))
    for step in steps:
        cells = []
        for c in cases:
            r = runs[c]["ray_by_step"].get(step)
            cells += (["—"] * 4 if r is None else
                      [f"{r['wall_s']:,.0f}", f"{r.get('driver_tree_gb', 0):.2f}", f"{r.get('ray_worker_max_gb', 0):.2f}",
                       f"{r['ray_bytes_received'] / 2**20:,.1f}"])
        done = {runs[c]["ray_by_step"].get(step, {}).get("partitions_done") for c in cases} - {None}
        shards = -(-doc["docs"] // doc["shard_docs"])
        part = (f" ({' / '.join(str(d) for d in sorted(done))} of {shards} shards)"
                if doc.get("partial") and step.endswith("_shards") and done and max(done) < shards else "")
        lines.append(f"| `{step}`{part} | " + " | ".join(cells) + " |")
    cells = []
    for c in cases:
        r, peaks = runs[c], runs[c]["ray_peaks_gb"]
        cells += [f"**{r['wall_s']:,.0f}**", f"**{peaks['driver_tree_gb']:.2f}**", f"**{peaks['ray_worker_max_gb']:.2f}**",
                  f"**{r['ray_bytes_received'] / 2**20:,.1f}**"]
    lines.append(f"| **{'the stages measured' if doc.get('partial') else 'the whole run'}** | " + " | ".join(cells) + " |")
    lines.append("")
    for c in cases:
        r, peaks, o = runs[c], runs[c]["ray_peaks_gb"], runs[c]["options"]
        keys = ", ".join(f"`{k}: {v}`" for k, v in o.items() if k != "partition_workers")
        lines.append(f"- **{c}** ({keys}): the driver's largest process {peaks['driver_max_proc_gb']:.2f} GB of heap, its resident set"
                     f" (file pages included) {peaks['driver_main_rss_gb']:.2f} GB; Ray's processes together"
                     f" {peaks['ray_total_gb']:.2f} GB,"
                     f" its largest daemon {peaks['ray_daemon_max_gb']:.2f} GB;"
                     + (f" {r['training_docs']:,} training documents;" if r.get("training_docs") else "")
                     + (f" stopped before its end: the stages it finished, {len(r['finished_stages'])};"
                        if doc.get("partial") and not r.get("complete") else "")
                     + (f" load average {r['load_average_at_end']:.1f} at the end." if not doc.get("partial") or r.get("complete") else ""))
    lines.append("")
    how = " --side-by-side" if doc.get("side_by_side") else ""
    first = next(iter(runs.values()))
    partial = (" The runs were stopped before their end; the figures are those of the stages (and shard partitions) each finished,"
               f" from samples {doc['sample_interval_s']:.0f} s apart (`benchmarks/ray_driver_partial.py`) taken from"
               f" {first.get('sampled_from')} (the runs started at {first.get('run_started')}: the first shards' seconds and peaks"
               " are left out; their bytes are not)." if doc.get("partial") else "")
    together = " The two runs ran at once, each with its own Ray instance, so each wall includes the other's load." if how else ""
    lines.append(f"`bench_scale.py --docs {doc['docs']} --shard-docs {doc['shard_docs']} --ray-driver{how}` at {doc['commit'][:12]},"
                 f" {doc['date']}, {doc['machine']['cores']} cores.{together}{partial}"
                 " \"driver GB\": the peak heap (RssAnon) of `strata run`'s own processes"
                 " (the Ray processes it starts left out); \"Ray worker GB\": the largest Ray worker's; \"received MB\": the Ray objects"
                 " the driver took from workers (their size in Ray's object store); a stage's figures run from the previous"
                 f" materialization to its own. MB and GB are 2^20 and 2^30 bytes. From `benchmarks/results/{name}.json`.")
    return "\n".join(lines)


TABLES: dict[str, Callable[[Path], str]] = {
    "s3_vs_disk": s3_vs_disk,
    "s3_vs_disk_1m": lambda results: s3_vs_disk(results, "s3_vs_disk_1m"),
    "order_prefix": lambda results: order_prefix_markdown(_load(results, "order_prefix")),
    "order_prefix_design": lambda results: order_prefix_markdown(_load(results, "order_prefix_design")),
    "ablate_simulation": ablate_simulation,
    "ablate_campaign": ablate_campaign,
    "clean_planted": clean_planted,
    "mixture_anchors": mixture_anchors,
    "clean_1m": lambda results: clean_planted(results, "clean_1m"),
    "clean_shards_1m": clean_shards,
    "near_recall": near_recall,
    "near_bands": near_bands,
    "near_bands_1m": lambda results: near_bands(results, "near_bands_1m"),
    "near_bands_3m": lambda results: near_bands(results, "near_bands_3m"),
    "datatrove_compare": datatrove_compare,
    "clean_tasks": clean_tasks,
    "partitioned_order_1m": partitioned_order,
    "partitioned_order_10m": lambda results: partitioned_order(results, "partitioned_order_10m"),
    "partitioned_order_1m_16parts": lambda results: partitioned_order(results, "partitioned_order_1m_16parts"),
    "estimate_1b": estimate_1b,
    "order_stream_100m": order_stream,
    "quality_scoring": quality_scoring,
    "small_files": small_files,
    "quality_ablation": quality_ablation,
    "scale_1m_run": scale_1m_run,
    "export_writers": export_writers,
    "export_writers_1b": lambda results: export_writers(results, "export_writers_1b"),
    "ray_driver_1m": ray_driver,
    "ray_driver_200k": lambda results: ray_driver(results, "ray_driver_200k"),
    "ray_driver_200k_units": lambda results: ray_driver_beside(results, "ray_driver_200k", "ray_driver_200k_units",
                                                                "--tasks 4 --order-part-bytes 1000000", "this project's test suite"),
    "ray_driver_1m_units": lambda results: ray_driver_beside(results, "ray_driver_1m", "ray_driver_1m_units",
                                                             "--tasks 4 --order-part-bytes 5000000", "bench_pack_memory.py's runs"),
    "pack_memory": pack_memory,
}


def render(text: str, results: Path, where: str = "<doc>") -> str:
    """``text`` with every table block's body rendered from ``results``."""
    out: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        out.append(lines[i])
        m = OPEN.match(lines[i].strip())
        i += 1
        if not m:
            continue
        name, start = m.group(1), i
        if name not in TABLES:
            raise TableError(f"{where}:{start}: unknown table {name!r} (one of: {', '.join(sorted(TABLES))})")
        while i < len(lines) and lines[i].strip() != CLOSE:
            if OPEN.match(lines[i].strip()):
                break
            i += 1
        if i == len(lines) or lines[i].strip() != CLOSE:
            raise TableError(f"{where}:{start}: table {name!r} has no closing {CLOSE} before the next block or the end")
        out.extend(TABLES[name](results).split("\n"))
    return "\n".join(out)


def doc_paths(root: Path) -> list[Path]:
    """The docs that may hold table blocks: ``docs/*.md`` and ``README.md``."""
    return sorted((root / "docs").glob("*.md")) + [p for p in [root / "README.md"] if p.is_file()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a doc's tables differ from the results")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the results folder (default: benchmarks/results)")
    ap.add_argument("--root", type=Path, default=REPO, help="the folder holding docs/ and README.md (default: the repo)")
    args = ap.parse_args(argv)
    stale = []
    try:
        for path in doc_paths(args.root):
            text = path.read_text()
            new = render(text, args.results, str(path))
            if new != text:
                stale.append(path)
                if not args.check:
                    path.write_text(new)
    except TableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in stale:
        print(f"{path}: {'out of sync with' if args.check else 'rewritten from'} {args.results}"
              + (" (run: python benchmarks/tables.py)" if args.check else ""))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
