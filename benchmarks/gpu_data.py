"""Build the input of the GPU check (``benchmarks/gpu_check.py``) on a CPU machine: numpy exports of
the random, greedy and cluster_sorted orderings of a demo-corpus sample, and its fixed held-out
batch, in a folder the GPU machine gets with ``carry: ["gpu_data"]`` (docs/training.md, "GPU check").

    python benchmarks/gpu_data.py [--out gpu_data] [--corpus PATH] [--max-docs 30000] [--work DIR]

Runs Strata's own graph up to the orderings (``strata run --select '*orderings'``) on a seeded
``max_docs`` sample of the corpus (vocabulary 8,192, k = 32, seq_len 2,048, concat packing,
shallow embeddings), then writes:

- ``OUT/<strategy>/``: ``strata export --format numpy`` of each ordering (``tokens.bin``,
  ``label_mask.bin``, ``segments.parquet``, ``meta.json``), read on the GPU machine by
  ``pipeline.export.torch_dataset.OrderedSequences``;
- ``OUT/heldout.npz``: the training stage's held-out batch (``tokens``, ``filled``, ``units``);
- ``OUT/manifest.json``: vocabulary size, strategies, what the data was built from, and the
  folder's size in bytes (it must stay under the 64 MiB a device run carries).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STRATEGIES = ("random", "greedy", "cluster_sorted")
DEMO_CORPUS = REPO.parent / "shared" / "data" / "corpus" / "demo_corpus.jsonl.gz"
MAX_BYTES = 30 * 1000 * 1000  # the limit for the carried data


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def write_gpu_data(layout, strategies, out: Path, heldout, vocab_size: int, source: dict) -> dict:
    """Export every strategy's ordering under ``layout`` as ``numpy`` into ``out/<strategy>`` and
    write ``heldout.npz`` (a :class:`~pipeline.training.heldout.HeldoutBatch`) and
    ``manifest.json``; returns the manifest."""
    from pipeline.export import export_ordering

    out.mkdir(parents=True, exist_ok=True)
    for strategy in strategies:
        export_ordering(layout, strategy, "numpy", str(out / strategy), global_batch=1)
    np.savez_compressed(out / "heldout.npz", tokens=heldout.tokens.astype(np.int32), filled=heldout.filled,
             units=np.array(heldout.units, dtype=str))
    manifest = {"vocab_size": int(vocab_size), "strategies": list(strategies), "source": source}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    manifest["bytes"] = folder_bytes(out)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def config_of(corpus: Path, max_docs: int) -> dict:
    """The data root's configuration (written as YAML next to it)."""
    return {"corpus": {"path": str(corpus), "source_field": "domain", "max_docs": max_docs},
            "heldout_fraction": 0.02, "heldout_docs": 256, "vocab_size": 8192, "k": 32, "seq_len": 2048,
            "packing": "concat", "strategies": list(STRATEGIES), "seeds": [0], "embed_method": "shallow",
            "embed_max_tokens": 128}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "gpu_data"))
    ap.add_argument("--corpus", default=str(DEMO_CORPUS), help="a JSONL(.gz) corpus with a domain field (default: the demo corpus)")
    ap.add_argument("--max-docs", type=int, default=30000, help="seeded document sample (the export's size follows it)")
    ap.add_argument("--work", default=None, help="data root to build in (default: a temporary folder, removed after)")
    args = ap.parse_args()

    import shutil

    import yaml

    from assets.runner import materialize_all, prepare_environment
    from pipeline.config import resolve_config
    from pipeline.data.tokenizer import load_tokenizer
    from pipeline.storage.layout import Layout
    from pipeline.training.stage import load_heldout_batch

    corpus = Path(args.corpus).resolve()
    if not corpus.is_file():
        print(f"gpu_data: corpus not found: {corpus}. Fix: pass --corpus PATH (a JSONL corpus)", file=sys.stderr)
        return 2
    work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="strata-gpu-data-"))
    work.mkdir(parents=True, exist_ok=True)
    config = work / "gpu_data.yaml"
    config.write_text(yaml.safe_dump(config_of(corpus, args.max_docs), sort_keys=True), encoding="utf-8")
    prepare_environment(str(config), str(work))  # as `strata run` does (DAGSTER_HOME, threads)
    materialize_all(str(config), str(work), select="*orderings")
    cfg = resolve_config(str(config), str(work))
    layout = Layout(cfg.root)
    tok = load_tokenizer(layout.tokenizer)
    held = load_heldout_batch(layout, cfg.heldout_docs, tok)
    out = Path(args.out).resolve()
    if out.exists():
        shutil.rmtree(out)
    source = {"corpus": corpus.name, "config": config_of(corpus.name, args.max_docs)}  # type: ignore[arg-type]
    manifest = write_gpu_data(layout, STRATEGIES, out, held, len(tok), source)
    if not args.work:
        shutil.rmtree(work)
    for strategy in STRATEGIES:
        meta = json.loads((out / strategy / "meta.json").read_text(encoding="utf-8"))
        print(f"{strategy}: {meta['n_sequences']:,} sequences x {meta['seq_len']} tokens, {folder_bytes(out / strategy):,} bytes")
    print(f"held-out batch: {held.n_docs} documents; {out}: {manifest['bytes']:,} bytes in all")
    if manifest["bytes"] > MAX_BYTES:
        print(f"gpu_data: {out} holds {manifest['bytes']:,} bytes, more than {MAX_BYTES:,}. Fix: lower --max-docs", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
