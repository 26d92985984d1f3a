"""Tokenize + embed throughput (docs/s): the local engine against Ray with one and with two nodes.

    python benchmarks/bench_ray.py [--docs 600 --shard-docs 100 --max-tokens 256 --node-cpus 1]

Real demo-corpus texts written as one validated corpus shard; tokenization with the embedding
model's tokenizer (``tokenize_unit``), then all-MiniLM-L6-v2 sentence embeddings (``embed_unit``),
both cut into the same work units of ``--shard-docs`` documents and mapped by
:func:`pipeline.distributed.units.map_corpus_shards`, as the assets do. Engines:

- ``local``: this process, torch on every core, and again with one torch thread (what a 1-CPU
  Ray actor uses: on a loaded machine, multi-threaded torch can lose more than it gains);
- ``ray x1``: a real Ray cluster of one node (``--node-cpus`` CPUs; one 1-CPU model actor per CPU);
- ``ray x2``: two nodes on this machine (two raylets), the same CPUs each.

Each row times both stages end to end from a cold start (the Ray rows include connecting to the
cluster and starting the actors, which load the model), and checks that the embeddings are
byte-identical to the local engine's. Cluster start-up (``ray start``) is not timed. Set
STRATA_SHARED to the shared folder (default ../shared beside the repository).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.config import RayConfig, StrataConfig  # noqa: E402
from pipeline.data.shard_docs import ShardDocs, read_shard_docs  # noqa: E402
from pipeline.data.token_shards import tokenize_unit  # noqa: E402
from pipeline.distributed.local_cluster import local_cluster  # noqa: E402
from pipeline.distributed.units import load_unit, map_corpus_shards  # noqa: E402
from pipeline.offline import set_offline  # noqa: E402
from pipeline.represent.embedding_shards import embed_unit  # noqa: E402
from pipeline.represent.embeddings import default_model_path  # noqa: E402

SHARED = Path(os.environ.get("STRATA_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))


def texts(n: int) -> list[str]:
    out = []
    with gzip.open(SHARED / "data" / "corpus" / "demo_corpus.jsonl.gz", "rt", encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i % 7 == 0:
                out.append(json.loads(line)["text"])
                if len(out) == n:
                    break
    return out


def run(corpus: Path, n: int, cfg: StrataConfig, work: Path) -> tuple[float, float, np.ndarray]:
    """Seconds to tokenize and to embed the ``n`` documents of the shard ``corpus`` on ``cfg.engine`` (fresh
    folders), and the embeddings."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(default_model_path()) / "tokenizer.json"))
    tok_args = (tok.to_str(), tok.token_to_id("[SEP]"), np.dtype(np.uint16).str)
    emb_args = ("sentence", "", cfg.embed_max_tokens, cfg.embed_batch_size, False)
    shards = [ShardDocs.of("bench", corpus)]
    shutil.rmtree(work, ignore_errors=True)
    out: dict[str, list[np.ndarray]] = {}

    def stage(name: str, fn, args: tuple, actors: bool = False) -> float:
        t0 = time.perf_counter()
        map_corpus_shards(shards, fn, lambda s, a, b: (*args, read_shard_docs(s, a, b)["text"].to_list()),
                          lambda shard, files: out.__setitem__(name, [load_unit(f)[0] for f in files]), lambda s: False,
                          stage=name, key="bench", work_dir=work / name, cfg=cfg, actors=actors)
        return time.perf_counter() - t0

    tok_s = stage("tokens", tokenize_unit, tok_args)
    emb_s = stage("embeddings", embed_unit, emb_args, actors=True)
    return tok_s, emb_s, np.concatenate(out["embeddings"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=600)
    ap.add_argument("--shard-docs", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--node-cpus", type=int, default=1)
    args = ap.parse_args()
    set_offline()
    docs = texts(args.docs)
    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    corpus = work / "shard.parquet"
    import polars as pl

    pl.DataFrame({"text": docs, "heldout": [False] * len(docs)}).write_parquet(corpus, row_group_size=8192)
    base = dict(shard_docs=args.shard_docs, embed_max_tokens=args.max_tokens)
    print(f"{len(docs)} documents, {args.shard_docs} a shard, first {args.max_tokens} tokens, {os.cpu_count()} cores on this machine")
    rows = []
    tok_s, emb_s, ref = run(corpus, len(docs), StrataConfig(engine="local", **base), work / "local")
    rows.append(("local (this process)", tok_s, emb_s, True))
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tok_s, emb_s, emb = run(corpus, len(docs), StrataConfig(engine="local", **base), work / "local1")
    torch.set_num_threads(threads)
    rows.append(("local, 1 torch thread", tok_s, emb_s, emb.tobytes() == ref.tobytes()))
    for nodes in (1, 2):
        with local_cluster([args.node_cpus] * nodes) as (address, _):
            cfg = StrataConfig(engine="ray", ray=RayConfig(address=address), **base)
            tok_s, emb_s, emb = run(corpus, len(docs), cfg, work / f"ray{nodes}")
        rows.append((f"ray x{nodes} node{'s' if nodes > 1 else ''} ({args.node_cpus} CPU each)", tok_s, emb_s,
                     emb.tobytes() == ref.tobytes()))
    shutil.rmtree(work, ignore_errors=True)
    n = len(docs)
    print(f"\n{'engine':34} {'tokenize s':>10} {'embed s':>8} {'docs/s':>8} {'tok docs/s':>10} {'emb docs/s':>10}  same bytes")
    for name, t, e, same in rows:
        print(f"{name:34} {t:10.2f} {e:8.2f} {n / (t + e):8.1f} {n / t:10.0f} {n / e:10.1f}  {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
