"""Benchmark: the quality-aware orderings' held-out loss at equal training tokens (issue 56).

On the built-in corpus (no ``corpus.path``: ``pipeline/data/builtin_corpus.py``, 3,000 documents),
scored by ``fasttext_trained`` (DCLM's recipe, trained by Strata offline): positives are the
corpus's ``docs`` source (Python's reference documentation and module docstrings: edited prose,
the stand-in for DCLM's curated positives), negatives a seeded sample of built-in documents
*beyond* the corpus's 3,000 (more standard-library code and ``/usr/share/doc`` files, none of them
in the corpus: the stand-in for DCLM's pool of web text). Four orderings, trained at the demo's
budget (30 steps x 16 x 256 = 122,880 tokens, the same for every run) over the same seeds:

- ``random``;
- ``quality_balanced``: greedy, ``objective: custom`` with ``families: [cluster, length_bin, quality_bin:0.5]``
  (every window holds each quality quartile at its share);
- ``anneal``: greedy_blend over ``mixture.column: quality`` (4 bins): the first 80% of the tokens
  uniform over the quartiles, the last 20% from the top two (0.4 / 0.6, at most 3 copies);
- ``ascending``: greedy_blend, four stages of 25%, each from one quartile, lowest first.

``mixture_budget_tokens`` is the training budget, so each blend's schedule is exactly the tokens
trained on (its stages are stages of the training run). One config holds one ``mixture``, so
anneal and ascending are two data roots: root ``a`` (random, quality_balanced, anneal) and root
``b`` (ascending), same corpus, seeds, scorer and packing. Before pairing, the script asserts that
the two roots' packed sequences, held-out split, token offsets and quality scores are
byte-identical. Each run's ``heldout_batch/loss`` (nats per token at the last step, per held-out
document) is paired with random's over the same seed and document; the intervals are the ablation
report's (``pipeline.reports.stats.paired_differences``, ``pipeline.reports.paired.paired_delta``:
two-way bootstrap over seeds x documents).

    nice -n 5 python benchmarks/bench_quality_ablation.py [--seeds 0 1 2] [--work DIR]

Writes ``benchmarks/results/quality_ablation.json``; ``benchmarks/tables.py`` renders it in docs/quality.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ablate import commit, machine  # noqa: E402

from pipeline.quality.builtin_labels import CORPUS_DOCS, TRAINING, write_builtin_labels  # noqa: E402
from pipeline.reports.paired import paired_delta  # noqa: E402
from pipeline.reports.stats import HELDOUT_METRIC, paired_differences  # noqa: E402
from pipeline.reports.tables import run_units  # noqa: E402

STEPS, BATCH, SEQ_LEN = 30, 16, 256  # the demo's budget (pipeline/config_source.py DEMO_SETTINGS)
ANNEAL = [{"until_tokens": 0.8, "weights": {"0": 0.25, "1": 0.25, "2": 0.25, "3": 0.25}},
          {"weights": {"0": 0.0, "1": 0.0, "2": 0.4, "3": 0.6}}]
ASCENDING = [{"until_tokens": 0.25, "weights": {"0": 1.0}}, {"until_tokens": 0.5, "weights": {"1": 1.0}},
             {"until_tokens": 0.75, "weights": {"2": 1.0}}, {"weights": {"3": 1.0}}]
NAMES = {("a", "random"): "random", ("a", "greedy"): "quality_balanced", ("a", "greedy_blend"): "anneal",
         ("b", "greedy_blend"): "ascending"}
SAME_BYTES = ("sequences/segments.parquet", "sequences/meta.json", "tokens/doc_offsets.npy", "quality/documents.parquet",
              "documents.parquet")


def labelled_files(work: Path, negatives: int) -> tuple[Path, Path, dict]:
    """The demo's labels (``pipeline.quality.builtin_labels``): positives the corpus's ``docs`` source, negatives
    a seeded sample of built-in documents beyond the corpus; their documents per source."""
    pos, neg, labels = write_builtin_labels(work, CORPUS_DOCS, negatives)
    return pos, neg, labels.sources()


def config(root: Path, pos: Path, neg: Path, seeds: list[int], strategies: list[str], stages: list[dict]) -> dict:
    return {"data_root": str(root), "seeds": seeds, "max_steps": STEPS, "batch_size": BATCH, "seq_len": SEQ_LEN,
            "warmup_steps": 3, "heldout_every": 10, "heldout_fraction": 0.1, "heldout_docs": 256,
            "embed_method": "shallow", "embed_max_tokens": 128, "strategies": strategies,
            "objective": "custom", "families": ["cluster", "length_bin", "quality_bin:0.5"],
            "quality": {"enabled": True, **TRAINING, "positives": str(pos), "negatives": str(neg)},
            "mixture": {"column": "quality", "bins": 4, "stages": stages, "max_repetition": {"2": 3, "3": 3}},
            "mixture_budget_tokens": STEPS * BATCH * SEQ_LEN, "mixture_tolerance": 0.15}


def run_root(cfg: dict, path: Path) -> dict:
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    t0, c0 = time.perf_counter(), os.times()
    proc = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(path), "--select", "*training_runs"],
                          capture_output=True, text=True)
    c1 = os.times()
    if proc.returncode != 0:
        sys.exit(f"strata run {path} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return {"wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(c1.children_user + c1.children_system
                                                                          - c0.children_user - c0.children_system, 1)}


def digest(path: Path) -> str:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(path).as_posix().encode() if path.is_dir() else b"")
        h.update(p.read_bytes())
    return h.hexdigest()


def same_inputs(a: Path, b: Path) -> dict:
    """The sha256 of each shared input, asserted equal across the two roots."""
    out = {}
    for rel in (*SAME_BYTES, "heldout"):
        da, db = digest(a / rel), digest(b / rel)
        assert da == db, f"{rel} differs between {a} and {b}: the roots cannot be paired"
        out[rel] = da[:16]
    return out


def units_of(roots: dict[str, Path]):
    import polars as pl

    parts = []
    for tag, root in roots.items():
        with duckdb.connect(str(root / "strata.duckdb"), read_only=True) as con:
            curve = con.sql("SELECT * FROM heldout_curve").pl()
            tokens = con.sql("SELECT strategy, seed, max(tokens_seen) AS t FROM heldout_curve GROUP BY ALL").pl()
        u = run_units(curve, None).filter(pl.col("metric") == HELDOUT_METRIC)
        names = {s: n for (t, s), n in NAMES.items() if t == tag}
        parts.append((u.filter(pl.col("strategy").is_in(list(names))).with_columns(pl.col("strategy").replace(names)),
                      tokens.filter(pl.col("strategy").is_in(list(names))).with_columns(pl.col("strategy").replace(names))))
    return pl.concat([p[0] for p in parts]), pl.concat([p[1] for p in parts])


def run(work: Path, seeds: list[int], negatives: int) -> dict:
    """Both roots of ``work`` built and trained on ``seeds``; ``<work>.json`` records the wall and CPU times."""
    work.mkdir(parents=True, exist_ok=True)
    pos, neg, sources = labelled_files(work, negatives)
    cfgs = {"a": config(work / "a", pos, neg, seeds, ["random", "greedy", "greedy_blend"], ANNEAL),
            "b": config(work / "b", pos, neg, seeds, ["greedy_blend"], ASCENDING)}
    timing = {}
    for tag in ("a", "b"):
        timing[tag] = run_root(cfgs[tag], work / f"{tag}.yaml")
        print(f"{work} root {tag}: {timing[tag]}", flush=True)
    record = {"seeds": seeds, "timing": timing, "sources": sources}
    Path(f"{work}.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


def stream_figure(work: Path, path: Path) -> None:
    """Each ordering's quality along the tokens a run trains on, its first ``STEPS * BATCH`` sequences
    (``pipeline.reports.quality_stream``), the four in one figure."""
    import polars as pl

    from pipeline.reports.quality_stream import plot_quality_stream, quality_along_stream
    from pipeline.storage.layout import Layout

    tables, prefix = [], {}
    for (tag, strategy), name in NAMES.items():
        t, p = quality_along_stream(Layout(work / tag), [strategy], max_sequences=STEPS * BATCH)
        tables.append(t.with_columns(strategy=pl.lit(name)))
        prefix[name] = p[strategy]
    plot_quality_stream(pl.concat(tables), prefix, path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--work", default="/tmp/strata_quality_ablation")
    ap.add_argument("--combine", nargs="+", default=[],
                    help="instead of running: pair the runs of these work folders (each run with its own --seeds; <work>.json read)")
    ap.add_argument("--negatives", type=int, default=400)
    ap.add_argument("--partial", default="", help="a note marking the results partial (e.g. fewer seeds than planned)")
    ap.add_argument("--out", default="benchmarks/results/quality_ablation.json")
    ap.add_argument("--figure", default="", help="also draw the four orderings' quality along the stream here (a PNG)")
    args = ap.parse_args()
    import polars as pl

    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    info = {"benchmark": "bench_quality_ablation.py", "commit": commit(), "machine": machine(), "date": start}
    works = [Path(w) for w in args.combine] or [Path(args.work)]
    records = [json.loads(Path(f"{w}.json").read_text()) for w in works] if args.combine else [run(works[0], args.seeds, args.negatives)]
    seeds = [s for r in records for s in r["seeds"]]
    assert len(set(seeds)) == len(seeds), f"a seed trained twice: {seeds}"
    roots = {(w, tag): w / tag for w in works for tag in ("a", "b")}
    first = next(iter(roots.values()))
    hashes = {str(r): same_inputs(first, r) for r in list(roots.values())[1:]}
    parts = [units_of({"a": w / "a", "b": w / "b"}) for w in works]
    units, tokens = pl.concat([p[0] for p in parts]), pl.concat([p[1] for p in parts])
    assert tokens["t"].n_unique() == 1, tokens  # equal training tokens
    means = (units.group_by("strategy", "seed").agg(pl.col("value").mean()).group_by("strategy")
             .agg(mean=pl.col("value").mean(), std=pl.col("value").std(), n_seeds=pl.len()).sort("strategy"))
    rows = []
    for name in ("quality_balanced", "anneal", "ascending"):
        d = paired_differences(units, HELDOUT_METRIC, name, "random")
        per_seed = d.mean(axis=1).tolist()
        rows.append({"strategy": name, "per_seed_delta": per_seed, **paired_delta(d)})
        print(f"{name:17s} Δ {rows[-1]['delta']:+.4f} [{rows[-1]['ci_low']:+.4f}, {rows[-1]['ci_high']:+.4f}]  per seed "
              + " ".join(f"{x:+.4f}" for x in per_seed), flush=True)
    sources = records[0].get("sources") or records[0]["scorer"]["sources"]
    timing = {f"{w.name}/{tag}": t for w, r in zip(works, records) for tag, t in r["timing"].items()}
    out = {**info, "seeds": sorted(seeds), "training_tokens": int(tokens["t"][0]), "steps": STEPS, "batch_size": BATCH,
           "seq_len": SEQ_LEN, "heldout_documents": int(units["unit"].n_unique()), "metric": HELDOUT_METRIC,
           "scorer": {"name": TRAINING["scorer"], "sources": sources, **{k: v for k, v in TRAINING.items() if k != "scorer"}},
           "stages": {"anneal": ANNEAL, "ascending": ASCENDING}, "same_bytes_sha256": hashes,
           "loss": means.to_dicts(), "delta_vs_random": rows, "timing": timing,
           "wall_min": round(sum(t["wall_s"] for t in timing.values()) / 60, 1), **({"partial": args.partial} if args.partial else {})}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    if args.figure:
        stream_figure(works[0], Path(args.figure))
        print(f"wrote {args.figure}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
