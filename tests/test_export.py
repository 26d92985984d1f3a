"""Exports keep Strata's order: every format read back with the trainer's own code yields the
global batches, in order, token for token, for 1 rank and for 2 ranks x 2 workers."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.errors import StrataInputError
from pipeline.export import export_stream, stream_from_arrays
from pipeline.packing.pack import SequenceStore, pack

# MosaicML streaming's package __init__ also imports ``streaming.vision`` (torchvision, which has no
# build for this CPU torch); its reader lives in ``streaming.base`` and never touches vision.
# Registering the package without running its __init__ imports ``streaming.base`` as shipped.
IMPORT_STREAMING = (
    "import importlib.util, sys\n"
    "_spec = importlib.util.find_spec('streaming')\n"
    "if _spec is not None and 'streaming' not in sys.modules:\n"
    "    sys.modules['streaming'] = importlib.util.module_from_spec(_spec)\n"
)

L, G, EOS, PAD, VOCAB = 32, 8, 1, 0, 5000
SETUPS = [(1, 1), (2, 2)]  # (world size, workers)
EXPORT_DOC = Path(__file__).resolve().parents[1] / "docs" / "export.md"


def recipe(name: str) -> str:
    """The code block under ``<!-- recipe: name -->`` in docs/export.md (the tests run it verbatim)."""
    found = re.search(rf"<!-- recipe: {re.escape(name)} -->\n```[a-z]*\n(.*?)```", EXPORT_DOC.read_text(encoding="utf-8"), re.S)
    assert found, f"docs/export.md has no recipe {name!r}"
    return found.group(1)


def run_recipe(name: str, **names) -> dict:
    """Execute a docs recipe with the upper-case placeholders it reads bound to ``names``; its namespace."""
    namespace = dict(names)
    exec(compile(recipe(name), f"docs/export.md[{name}]", "exec"), namespace)
    return namespace


def _data(variant: str, seed: int = 0):
    return _raw(variant, seed)[:3]


def _raw(variant: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 90, size=160)
    tokens = rng.integers(2, VOCAB, size=int(lengths.sum())).astype(np.uint16)
    offsets = np.r_[0, np.cumsum(lengths)]
    tokens[offsets[1:] - 1] = EOS  # every document stream ends with EOS
    packing = pack(variant, rng.permutation(lengths.size), lengths, L, seed=seed)
    order = rng.permutation(packing.n_sequences)
    store = SequenceStore(tokens, offsets, packing.segments, L, pad_id=PAD)
    stream = stream_from_arrays(tokens, offsets, packing.segments, order, L, eos_id=EOS, pad_id=PAD)
    return stream, store, order, tokens, offsets


def _mixture_data(tmp: Path):
    """The same corpus as a ``greedy_mixture`` schedule: sequences repeated or left out, so the
    stream's length differs from the number of packed sequences."""
    import polars as pl

    from pipeline.ordering.engine import OrderParams, run_strategy

    stream, store, _, tokens, offsets = _raw("concat")
    lengths = np.diff(offsets)
    docs = pl.DataFrame({"doc_id": np.arange(lengths.size), "cluster": np.arange(lengths.size) % 3, "n_tokens": lengths})
    (tmp / "weights.json").write_text('{"0": 0.6, "1": 0.3, "2": 0.1}')
    params = OrderParams(length_bins=8, mixture_weights_file=str(tmp / "weights.json"), max_sequence_copies=3,
                         mixture_budget_tokens=200 * L)
    order = run_strategy("greedy_mixture", docs, stream.segments, L, params, 0).order["sequence_id"].to_numpy()
    assert np.bincount(order).max() > 1 and order.size != store.n_sequences
    return stream_from_arrays(tokens, offsets, stream.segments, order, L, eos_id=EOS, pad_id=PAD), store, order


def _curriculum_data(tmp: Path):
    """The same corpus ordered by ``greedy_curriculum`` (a 2-knot curriculum over 3 clusters)."""
    import polars as pl

    from pipeline.ordering.engine import OrderParams, run_strategy

    stream, store, _, tokens, offsets = _raw("concat")
    lengths = np.diff(offsets)
    docs = pl.DataFrame({"doc_id": np.arange(lengths.size), "cluster": np.arange(lengths.size) % 3, "n_tokens": lengths})
    (tmp / "knots.yaml").write_text("knots:\n  - tokens: 500\n    logits: {0: 2.0}\n  - tokens: 6000\n    logits: {2: 2.0}\n")
    params = OrderParams(length_bins=8, curriculum=str(tmp / "knots.yaml"))
    order = run_strategy("greedy_curriculum", docs, stream.segments, L, params, 0).order["sequence_id"].to_numpy()
    assert np.array_equal(np.sort(order), np.arange(store.n_sequences))
    return stream_from_arrays(tokens, offsets, stream.segments, order, L, eos_id=EOS, pad_id=PAD), store, order


@pytest.fixture(scope="module", params=["permutation", "greedy_mixture", "greedy_curriculum"])
def concat(request, tmp_path_factory):
    """The ordered stream of a concat packing: a permutation, a greedy_mixture schedule and a
    greedy_curriculum order."""
    if request.param == "permutation":
        return _data("concat")
    make = _mixture_data if request.param == "greedy_mixture" else _curriculum_data
    return make(tmp_path_factory.mktemp(request.param))


def expected_batches(store, order, global_batch=G) -> np.ndarray:
    """(steps, G, L): Strata's global batches, in order."""
    steps = order.size // global_batch
    return store.batch(order[: steps * global_batch])[0].reshape(steps, global_batch, L)


def test_numpy_flat_file_and_torch_dataset(tmp_path, concat):
    stream, store, order = concat
    export_stream(stream, "numpy", tmp_path / "np", global_batch=G, meta={"strategy": "test"})
    meta = json.loads((tmp_path / "np" / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["seq_len"] == L and meta["n_sequences"] == order.size
    # nanoGPT-style reader: a headerless memmap, sequence p at p * seq_len
    flat = np.memmap(tmp_path / "np" / "tokens.bin", dtype=meta["dtype"], mode="r")
    assert flat.size == order.size * L
    np.testing.assert_array_equal(flat.reshape(-1, L), store.batch(order)[0])
    # OLMo-core: NumpyFSLDataset over the raw file, its shuffle=False loader for R ranks x W workers
    want = expected_batches(store, order)
    for world, workers in SETUPS:
        np.testing.assert_array_equal(_olmo_core_batches(tmp_path / "np", world, workers, tmp_path / f"olmo{world}"), want)

    from torch.utils.data import DataLoader

    from pipeline.export.torch_dataset import GlobalBatchSampler, OrderedSequences, collate_packed

    ds = OrderedSequences(tmp_path / "np")
    want = expected_batches(store, order)
    for world, workers in SETUPS:
        per_rank = []
        for rank in range(world):
            sampler = GlobalBatchSampler(len(ds), G, rank, world)
            dl = DataLoader(ds, batch_sampler=sampler, num_workers=workers, collate_fn=collate_packed)
            per_rank.append([b["input_ids"].numpy() for b in dl])
        got = np.stack([np.concatenate([per_rank[r][s] for r in range(world)]) for s in range(len(per_rank[0]))])
        np.testing.assert_array_equal(got, want)
    # resumable: starting at step 3 continues exactly where step 2 ended
    resumed = [b["input_ids"].numpy() for b in DataLoader(ds, batch_sampler=GlobalBatchSampler(len(ds), G, 0, 1, start_step=3),
                                                          collate_fn=collate_packed)]
    np.testing.assert_array_equal(np.stack(resumed), want[3:])


def _olmo_core_batches(export_dir: Path, world: int, workers: int, work_dir: Path) -> np.ndarray:
    """(steps, G, L): every rank's batches from docs/export.md's OLMo-core recipe, put in place by
    their instance index."""
    pytest.importorskip("olmo_core")
    got = None
    for rank in range(world):
        ns = run_recipe("olmo-core", DIR=str(export_dir), VOCAB=VOCAB, G=G, WORK_DIR=str(work_dir), R=world, RANK=rank, W=workers)
        meta, batches = ns["meta"], list(ns["loader"])
        steps = meta["n_sequences"] // G
        got = np.zeros((steps, G, meta["seq_len"]), np.int64) if got is None else got
        assert len(batches) == steps
        for s, b in enumerate(batches):
            idx = b["index"].numpy()
            assert (idx // G == s).all()  # every instance of step s comes from global batch s
            got[s, idx % G] = b["input_ids"].numpy()
    return got


def test_torch_dataset_masks_documents_and_padding(tmp_path):
    stream, store, order = _data("padding", seed=1)
    export_stream(stream, "numpy", tmp_path / "np", global_batch=G)
    from pipeline.export.torch_dataset import OrderedSequences, collate_packed

    ds = OrderedSequences(tmp_path / "np")
    for p in range(0, len(ds), 7):
        toks, rows, starts, filled = store.masked_batch(order[p : p + 1])
        item = ds[p]
        np.testing.assert_array_equal(item["input_ids"].numpy(), toks[0])
        assert int(item["seq_lengths"].sum()) == L
        pos = item["position_ids"].numpy()
        cuts = np.flatnonzero(pos == 0)
        # every document segment starts a piece; padding positions are never labels
        assert set(starts.tolist()) <= set(cuts.tolist())
        labels = item["labels"].numpy()
        assert (labels[~filled[0]] == -100).all() and (labels[cuts] == -100).all()
        assert (labels[filled[0] & (pos > 0)] == toks[0][filled[0] & (pos > 0)]).all()
    batch = collate_packed([ds[0], ds[1]])
    assert batch["cu_seqlens"][-1] == 2 * L and batch["cu_seqlens"].dtype == torch.int32


@pytest.mark.parametrize("variant", ["padding", "concat", "best_fit"])
def test_torch_dataset_masked_batch_equals_the_stores(tmp_path, variant):
    """Strata's loop trains on a numpy export (benchmarks/gpu_check.py does): the reader's batches,
    segment starts and padding equal the sequence store's for the same sequences."""
    stream, store, order = _data(variant, seed=2)
    export_stream(stream, "numpy", tmp_path / "np", global_batch=G)
    from pipeline.export.torch_dataset import OrderedSequences

    ds = OrderedSequences(tmp_path / "np")
    assert (ds.n_sequences, ds.seq_len) == (order.size, L)
    positions = np.r_[np.arange(order.size)[::-1], 5]  # every sequence, out of order, one twice
    got, want = ds.masked_batch(positions), store.masked_batch(order[positions])
    if variant != "padding":  # (padding packs one document piece per sequence)
        assert want[1].size > positions.size  # several documents per sequence: the starts are tested
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    if variant != "concat":
        assert not want[3].all()  # padding is there, and marked alike


def test_megatron_indexed_and_gpt_dataset(tmp_path, concat):
    pytest.importorskip("megatron.core")
    from megatron.core.datasets import helpers
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from pipeline.export.megatron import gpt_indices

    stream, store, order = concat
    out = tmp_path / "meg"
    export_stream(stream, "megatron", out, global_batch=G)
    prefix = str(out / "tokens")
    indexed = IndexedDataset(prefix)
    assert len(indexed) == order.size
    rows = store.batch(order)[0]
    for k in (0, 1, order.size - 2):
        np.testing.assert_array_equal(indexed[k], rows[k])
    np.testing.assert_array_equal(indexed[order.size - 1], np.r_[rows[-1], EOS])
    # our cache is exactly what Megatron's own sample-index builder gives for this dataset unshuffled
    doc, sample, _ = gpt_indices(order.size, L)
    built = helpers.build_sample_idx(indexed.sequence_lengths.copy(), doc, L, 1, int(indexed.sequence_lengths.sum()), True, True)
    np.testing.assert_array_equal(built, sample)

    n_steps = order.size // G
    cache = tmp_path / "cache"
    train = megatron_from_recipe(out, tmp_path / "tok", cache, n_steps)
    want = expected_batches(store, order)
    for world, workers in SETUPS:
        got = _megatron_batches(train, n_steps * G, world, workers)
        np.testing.assert_array_equal(got, want)
    # without the cache GPTDataset shuffles: the test would notice a missing/misnamed cache
    shuffled = megatron_from_recipe(out, tmp_path / "tok", cache, n_steps, path_to_cache=str(tmp_path / "fresh"))
    assert not np.array_equal(shuffled[0]["tokens"].numpy(), want[0, 0])


def save_tokenizer(directory: Path) -> Path:
    """A word-level tokenizer with Strata's pad and EOS ids, saved as a transformers tokenizer."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<pad>": PAD, "<eos>": EOS, "a": 2}, unk_token="a"))
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>").save_pretrained(str(directory))
    return directory


def megatron_from_recipe(export_dir: Path, tokenizer_dir: Path, cache: Path, n_steps: int, **overrides):
    """The train GPTDataset Megatron builds with docs/export.md's recipe config (``overrides`` replace fields)."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset

    if not tokenizer_dir.exists():
        save_tokenizer(tokenizer_dir)
    ns = run_recipe("megatron", TOKENIZER_DIR=str(tokenizer_dir), L=L, DIR=str(export_dir), CACHE=str(cache),
                    TRAIN_ITERS=n_steps, G=G)
    config = dataclasses.replace(ns["config"], **overrides)
    return BlendedMegatronDatasetBuilder(GPTDataset, [n_steps * G, None, None], lambda: True, config).build()[0]


def _megatron_batches(dataset, total: int, world: int, workers: int) -> np.ndarray:
    """Megatron-LM's MegatronPretrainingSampler (data_samplers.py): every run of
    micro_batch x world consecutive samples is one step, rank r takes the r-th micro-batch."""
    from torch.utils.data import DataLoader

    micro = G // world
    per_rank = []
    for rank in range(world):
        batches = [list(range(s, s + G))[rank * micro : (rank + 1) * micro] for s in range(0, total, G)]
        dl = DataLoader(dataset, batch_sampler=batches, num_workers=workers)
        per_rank.append([b["tokens"].numpy() for b in dl])
    return np.stack([np.concatenate([per_rank[r][s] for r in range(world)]) for s in range(total // G)])


def _streaming():
    """MosaicML streaming's ``streaming.base`` (see ``IMPORT_STREAMING``), or skip where it is not installed."""
    exec(IMPORT_STREAMING, {})
    return pytest.importorskip("streaming.base")


@pytest.mark.parametrize("world,workers", SETUPS)
def test_mds_layout_follows_streaming_partition(tmp_path, concat, world, workers):
    """streaming's own reader and partition function: rank r's DataLoader (W workers, batches
    handed to the workers in turn) reads the r-th slice of every global batch."""
    base = _streaming()
    from streaming.base.partition import get_partitions

    stream, store, order = concat
    out = tmp_path / "mds"
    export_stream(stream, "mds", out, global_batch=G, world_size=world, workers=workers)
    ds = base.StreamingDataset(local=str(out), shuffle=False, batch_size=G // world, num_canonical_nodes=1)
    n = order.size // G * G
    assert ds.num_samples == n
    samples = np.stack([ds.get_item(i)["input_ids"] for i in range(n)])
    part = get_partitions("orig", n, 1, 1, world, workers, G // world)  # (node, rank, worker, batch, sample)
    per_rank = [[samples[ids[ids >= 0]] for j in range(part.shape[3]) for w in range(workers)
                 for ids in [part[0, r, w, j]] if (ids >= 0).any()] for r in range(world)]
    got = np.stack([np.concatenate([per_rank[r][s] for r in range(world)]) for s in range(n // G)])
    np.testing.assert_array_equal(got, expected_batches(store, order))


def test_mds_with_streaming_library(tmp_path, concat):
    """docs/export.md's StreamingDataset recipe, one process per rank (streaming joins them in a process group)."""
    _streaming()
    stream, store, order = concat
    want = expected_batches(store, order)
    for world, workers in SETUPS:
        out = tmp_path / f"mds{world}"
        export_stream(stream, "mds", out, global_batch=G, world_size=world, workers=workers)
        code = (IMPORT_STREAMING + f"DIR, G, R, W = {str(out)!r}, {G}, {world}, {workers}\n" + recipe("mds")
                + "import numpy as np\nnp.save(sys.argv[1], np.stack([b['input_ids'].numpy() for b in dl]))\n")
        port = str(29500 + world + os.getpid() % 1000)
        procs, dests = [], []
        for rank in range(world):  # the ranks run at once: streaming joins them in a process group
            env = {**os.environ, "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "RANK": str(rank),
                   "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
            dests.append(tmp_path / f"rank{world}_{rank}.npy")
            procs.append(subprocess.Popen([sys.executable, "-c", code, str(dests[-1])], env=env))
        assert all(p.wait(timeout=180) == 0 for p in procs)
        got = [np.load(d) for d in dests]
        np.testing.assert_array_equal(np.concatenate(got, axis=1)[: want.shape[0]], want)


def test_hf_parquet_with_trainer(tmp_path, concat):
    datasets = pytest.importorskip("datasets")
    from accelerate.data_loader import prepare_data_loader
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    stream, store, order = concat
    out = tmp_path / "hf"
    export_stream(stream, "hf", out, global_batch=G)
    ds = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "cache"))
    assert ds.num_rows == order.size
    np.testing.assert_array_equal(np.array(ds[:5]["input_ids"]), store.batch(order[:5])[0])
    row = ds[3]
    assert sum(row["seq_lengths"]) == L and row["position_ids"][0] == 0
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=L))
    want = expected_batches(store, order)
    for world, workers in SETUPS:
        args = TrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=G // world,
                                 train_sampling_strategy="sequential", dataloader_num_workers=workers,
                                 dataloader_drop_last=True, report_to=[], use_cpu=True)
        trainer = Trainer(model=model, args=args, train_dataset=ds.with_format("torch"))
        if world == 1:
            per_rank = [[b["input_ids"].numpy() for b in trainer.get_train_dataloader()]]
        else:  # the dataloader each of the `world` processes gets from accelerate
            base = trainer.get_train_dataloader().base_dataloader
            per_rank = [[b["input_ids"].numpy() for b in prepare_data_loader(base, num_processes=world, process_index=r,
                                                                             put_on_device=False)]
                        for r in range(world)]
        got = np.stack([np.concatenate([per_rank[r][s] for r in range(world)]) for s in range(len(per_rank[0]))])
        np.testing.assert_array_equal(got, want)


def test_bad_batching_is_refused(tmp_path, concat):
    stream, _, _ = concat
    with pytest.raises(StrataInputError, match="not divisible"):
        export_stream(stream, "numpy", tmp_path / "x", global_batch=6, world_size=4)
    with pytest.raises(StrataInputError, match="unknown export format"):
        export_stream(stream, "tfrecord", tmp_path / "x", global_batch=8)
    assert not (tmp_path / "x").exists()


def _data_root(root: Path, variant: str = "concat") -> tuple:
    """A data root holding the documented artifacts an export reads (tokens, sequences, ordering, tokenizer)."""
    import polars as pl

    from pipeline.data.token_index import write_single_run
    from pipeline.storage.layout import Layout

    stream, store, order, tokens, offsets = _raw(variant)
    layout = Layout(root)
    for d in ("tokens", "sequences", "orderings"):
        (root / d).mkdir(parents=True, exist_ok=True)
    write_single_run(tokens, layout.tokens)
    np.save(layout.doc_offsets, offsets)
    stream.segments.write_parquet(layout.segments)
    layout.sequences_meta.write_text(json.dumps({"seq_len": L, "packing": variant, "freeze_prefix": 0}))
    pl.DataFrame({"position": np.arange(order.size), "sequence_id": order}).write_parquet(layout.ordering("greedy"))
    save_tokenizer(layout.tokenizer)
    return store, order


def test_cli_export(tmp_path, capsys):
    from assets.cli import main

    store, order = _data_root(tmp_path / "root")
    (tmp_path / "cfg.yaml").write_text(f"seq_len: {L}\nbatch_size: {G}\n")
    base = ["export", "--data-root", str(tmp_path / "root"), "--config", str(tmp_path / "cfg.yaml")]
    assert main([*base, "--strategy", "greedy", "--format", "numpy", "--out", str(tmp_path / "out")]) == 0
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["strategy"] == "greedy" and meta["global_batch"] == G and meta["eos_id"] == EOS
    assert len(meta["lineage"]["ordering_sha256"]) == 64
    exported = np.fromfile(tmp_path / "out" / "tokens.bin", dtype=np.uint16).reshape(-1, L)
    np.testing.assert_array_equal(exported, store.batch(order)[0])
    assert "sequences" in capsys.readouterr().out
    # no ordering for the strategy, a training-time strategy, a wrong seq_len: exit code 2 with the fix
    assert main([*base, "--strategy", "random", "--format", "numpy", "--out", str(tmp_path / "o2")]) == 2
    assert main([*base, "--strategy", "odm", "--format", "hf", "--out", str(tmp_path / "o3")]) == 2
    (tmp_path / "bad.yaml").write_text("seq_len: 64\n")
    bad = ["export", "--data-root", str(tmp_path / "root"), "--config", str(tmp_path / "bad.yaml")]
    assert main([*bad, "--strategy", "greedy", "--format", "numpy", "--out", str(tmp_path / "o4")]) == 2
    err = capsys.readouterr().err
    assert "materialize orderings[random]" in err and "online" in err and "x seq_len 64" in err


def test_the_stream_reads_the_token_store_the_sequences_were_packed_from(tmp_path):
    from pipeline.data.token_index import write_single_run
    from pipeline.export import open_stream
    from pipeline.packing.stored import packed_tokens, sequence_store
    from pipeline.storage.layout import Layout, tokens_fingerprint

    store, order = _data_root(tmp_path / "root", "padding")
    layout = Layout(tmp_path / "root")
    meta = json.loads(layout.sequences_meta.read_text())
    layout.sequences_meta.write_text(json.dumps({**meta, "tokens": tokens_fingerprint(layout)}))
    stream = open_stream(layout, "greedy", eos_id=EOS, pad_id=PAD)
    np.testing.assert_array_equal(stream.read(order), store.batch(order)[0])  # padding and inserted EOS included
    np.testing.assert_array_equal(sequence_store(layout).rows(order[::-1]), store.batch(order[::-1])[0])
    tokens, _ = packed_tokens(layout)
    changed = np.asarray(tokens).copy()
    changed[3] += 1
    write_single_run(changed, layout.tokens)  # the tokens asset re-ran on an edited document
    with pytest.raises(StrataInputError, match="token store changed since the sequences were packed"):
        open_stream(layout, "greedy", eos_id=EOS, pad_id=PAD)
    with pytest.raises(StrataInputError, match="rematerialize sequences"):
        sequence_store(layout)
