"""A frozen prefix: appending shards keeps the stream's first P sequences byte-identical in the
orderings, the sequences and every export format, packs and orders only the rest, accounts for
every token, and the greedy after the prefix recovers the whole stream's cluster balance."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dagster as dg
import duckdb
import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
import yaml
from helpers import demo_slice

from pipeline.clean.removals import applied_removals, packed_stream, removed_documents
from pipeline.config import config_from_dict
from pipeline.errors import StrataInputError
from pipeline.export.numpy_tokens import open_numpy
from pipeline.ordering.composition import composition
from pipeline.ordering.engine import OrderParams, run_strategy
from pipeline.packing import frozen
from pipeline.packing.pack import SequenceStore, conservation, pack
from pipeline.packing.stored import sequence_store
from pipeline.reports.diagnostics import prefix_errors
from pipeline.represent.embeddings import default_model_path
from pipeline.storage.layout import Layout, Store

SHARD_ASSETS = ("corpus_shards", "token_shards", "embedding_shards", "cluster_shards")
P = 12  # frozen sequences
FORMATS = ["numpy", "megatron", "hf"]


def _materialize(cfg_path, cwd, expect_ok: bool = True, freeze: int = P) -> subprocess.CompletedProcess:
    """``strata run --freeze-prefix P`` up to the exports (the config file does not set it)."""
    env = {**os.environ, "DAGSTER_HOME": ""}
    proc = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(cfg_path), "--select", "*exports",
                           "--freeze-prefix", str(freeze)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if expect_ok:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _write_shard(path, recs) -> None:
    pl.DataFrame([{"id": r["id"], "text": r["text"][:3000], "domain": r["domain"]} for r in recs]).write_parquet(path)


def _ran(instance: dg.DagsterInstance, asset: str, after: int) -> tuple[list[str], int]:
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), after_storage_id=after),
                                              limit=100).records
    return sorted((r.partition_key or "").split("@")[0] for r in records), max([after] + [r.storage_id for r in records])


def _latest(instance: dg.DagsterInstance, asset: str, partition: str | None = None) -> dict:
    event = instance.get_latest_materialization_event(dg.AssetKey(asset)) if partition is None else \
        instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]),
                                        limit=1).records[0].event_log_entry.asset_materialization
    mat = event.asset_materialization if hasattr(event, "asset_materialization") else event
    return {k: v.value for k, v in mat.metadata.items()}


def _snapshot(layout: Layout, strategy: str) -> dict:
    """What a trainer that consumed the first P positions read, from every artifact."""
    order = Store(layout).ordering(strategy).order
    L = Store(layout).sequences.seq_len
    out = {"order": order[:P].copy(), "rows": sequence_store(layout).batch(order[:P])[0]}
    numpy_dir, meg_dir, hf_dir = (layout.export_dir(strategy, f) for f in FORMATS)
    meta = json.loads((numpy_dir / "meta.json").read_text())
    width = np.dtype(meta["dtype"]).itemsize
    out["numpy"] = (numpy_dir / "tokens.bin").read_bytes()[: P * L * width]
    out["megatron"] = (meg_dir / "tokens.bin").read_bytes()[: P * L * width]
    from megatron.core.datasets.indexed_dataset import IndexedDataset  # the trainer's own reader

    indexed = IndexedDataset(str(meg_dir / "tokens"))
    out["megatron_reader"] = np.stack([indexed[i] for i in range(P)])
    out["numpy_reader"] = np.asarray(open_numpy(numpy_dir)[0][:P]).copy()
    hf = pq.read_table(sorted((hf_dir / "data").glob("*.parquet"))[0]).slice(0, P)
    out["hf"] = np.array(hf["input_ids"].to_pylist())
    out["meta"] = meta
    return out


def _stream_error(order: np.ndarray, segments: pl.DataFrame, cluster: np.ndarray, t: np.ndarray) -> np.ndarray:
    comp = composition(segments["sequence_id"].to_numpy(), cluster[segments["doc_id"].to_numpy()], segments["n_tokens"].to_numpy(),
                       order.size, int(cluster.max()) + 1)
    position = np.empty(order.size, np.int64)
    position[order] = np.arange(order.size)
    return prefix_errors(comp, position, t)


@pytest.mark.integration
def test_append_twice_keeps_the_frozen_prefix(tmp_path, request):
    recs = demo_slice(250)
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(3):
        _write_shard(shards / f"part-{i}.parquet", recs[i * 50 : (i + 1) * 50])
    cfg = {"data_root": str(tmp_path / "root"), "corpus": {"path": str(shards), "source_field": "domain"},
           "tokenizer": default_model_path(), "embed_method": "shallow", "embed_max_tokens": 32, "k": 4, "seq_len": 128,
           "heldout_fraction": 0.05, "strategies": ["greedy", "random"], "export": {"formats": FORMATS}, "batch_size": 4,
           "length_bins": 8, "packing": "best_fit"}  # best_fit: frozen sequences with padding
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    root, layout = request.config.rootpath, Layout(tmp_path / "root")

    _materialize(cfg_path, root)
    instance = dg.DagsterInstance.from_config(str(layout.root / "dagster"))
    marks = {a: _ran(instance, a, 0)[1] for a in SHARD_ASSETS}
    first = {s: _snapshot(layout, s) for s in cfg["strategies"]}
    for s in cfg["strategies"]:
        rec = frozen.load(layout, s)
        assert rec.sequences == P and np.array_equal(rec.sequence_ids, first[s]["order"])
        assert first[s]["meta"]["frozen"]["sequences"] == P and len(first[s]["meta"]["frozen"]["version_chain"]) == 1
    sizes = [Store(layout).ordering("greedy").order.size]

    for new in (3, 4):  # append a shard, twice
        copy = [{**recs[1], "id": f"copy-{new}", "text": recs[1]["text"].upper()}]  # an exact duplicate: the clean stage removes it
        _write_shard(shards / f"part-{new}.parquet", recs[new * 50 : (new + 1) * 50] + copy)
        _materialize(cfg_path, root)
        for a in SHARD_ASSETS:  # only the new shard's partitions ran
            ran, marks[a] = _ran(instance, a, marks[a])
            assert ran == [f"part-{new}.parquet"], (a, ran)
        assert _latest(instance, "sequences")["frozen_sequences_kept"] == len(np.unique(np.concatenate([first[s]["order"] for s in first])))
        for s in cfg["strategies"]:
            now = _snapshot(layout, s)
            for key in ("order", "rows", "numpy", "megatron", "hf", "megatron_reader", "numpy_reader"):  # artifact by artifact
                assert np.array_equal(np.asarray(now[key]), np.asarray(first[s][key])) if key not in ("numpy", "megatron") \
                    else now[key] == first[s][key], (s, key, new)
            np.testing.assert_array_equal(now["rows"], now["megatron_reader"])  # the readers read the frozen sequences
            np.testing.assert_array_equal(now["rows"], now["hf"])
            chain = now["meta"]["frozen"]["version_chain"]
            assert [c["version"] for c in chain] == list(range(new - 1)) and chain[-1]["shards"][-1] == f"part-{new}.parquet"
            meta = _latest(instance, "orderings", s)
            assert meta["frozen_sequences"] == P and meta["frozen_version"] == new - 2
            assert meta["cluster_error_at_boundary"] > 0 and meta["cluster_error_after_mean"] > 0  # the boundary, in the UI
            exported = _latest(instance, "exports", s)
            assert all(exported[f"{f}/kept_sequences"] == P for f in FORMATS), exported  # extended, not rewritten
        sizes.append(Store(layout).ordering("greedy").order.size)
        _removals_spare_the_prefix(layout)
    assert sizes[0] < sizes[1] < sizes[2]

    # every token placed once or reported dropped, and only tails (< seq_len per packed run) dropped
    segments = pl.read_parquet(layout.segments)
    stream = np.diff(np.load(layout.doc_offsets))
    kept, removed = packed_stream(layout, stream)  # the planted copies left training
    acc = conservation(segments, kept, 128, gaps=True)
    assert acc["ok"] and acc["tokens_kept"] + acc["tokens_dropped"] + sum(removed.values()) == int(stream.sum())
    assert removed["exact"] > 0
    assert acc["tokens_dropped"] == _latest(instance, "sequences")["tokens_dropped"] == 0  # best_fit drops nothing
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        rows = con.execute("SELECT strategy, frozen_sequences, version FROM ordering_frozen_prefix ORDER BY strategy").fetchall()
    assert rows == [("greedy", P, 2), ("random", P, 2)]

    # the whole stream's cluster balance recovers: near the end within 1.5x of the greedy from scratch
    docs = pl.read_parquet(layout.documents, columns=["doc_id", "n_tokens"]).join(pl.read_parquet(layout.clusters), on="doc_id")
    docs = docs.with_columns(pl.col("n_tokens") + 1).sort("doc_id")
    cluster = docs["cluster"].to_numpy()
    scratch_seg = pack("best_fit", np.random.default_rng(0).permutation(stream.size), stream, 128).segments
    params = OrderParams.from_config(config_from_dict({**cfg, "data_root": str(tmp_path / "x")}))
    scratch = run_strategy("greedy", docs, scratch_seg, 128, params, 0).order["sequence_id"].to_numpy()
    order = Store(layout).ordering("greedy").order
    m = order.size
    tail = np.arange(3 * m // 4, m)
    got, want = _stream_error(order, segments, cluster, tail).mean(), _stream_error(scratch, scratch_seg, cluster, tail).mean()
    rand = _stream_error(Store(layout).ordering("random").order, segments, cluster, tail).mean()
    assert got <= 1.5 * want, (got, want, rand)
    assert got < rand  # the check can fail: the random suffix does not recover as the greedy does

    # an edit inside the prefix is refused, naming the shard and the fix; nothing is overwritten
    packed = {p: p.read_bytes() for p in (layout.segments, layout.sequences_meta, layout.export_dir("greedy", "numpy") / "tokens.bin")}
    rec = frozen.load(layout, "greedy")
    victim = rec.segments.row(0, named=True)
    part = shards / victim["shard"]
    kept = pl.read_parquet(part)
    edited = kept.with_columns(
        pl.when(pl.col("id") == victim["id"]).then(pl.lit("edited. ") + pl.col("text")).otherwise(pl.col("text")).alias("text"))
    edited.write_parquet(part)
    proc = _materialize(cfg_path, root, expect_ok=False)
    assert proc.returncode != 0
    assert f"shard {victim['shard']}: document '{victim['id']}' is edited but lies in the frozen prefix" in proc.stdout + proc.stderr
    assert "Fix: restore that document" in proc.stdout + proc.stderr
    assert all(p.read_bytes() == b for p, b in packed.items())
    with pytest.raises(StrataInputError, match="token store changed since the sequences were packed"):
        sequence_store(layout)  # the tokens asset re-ran: the kept segments would read other ids
    kept.write_parquet(part)
    # a deleted shard whose documents all lie in the suffix just leaves it
    (shards / "part-4.parquet").unlink()
    _materialize(cfg_path, root)
    for s in cfg["strategies"]:
        now = _snapshot(layout, s)
        assert all(np.array_equal(np.asarray(now[k]), np.asarray(first[s][k]))
                   for k in ("order", "rows", "hf", "megatron_reader", "numpy_reader"))
        assert now["numpy"] == first[s]["numpy"] and now["megatron"] == first[s]["megatron"]
    assert Store(layout).ordering("greedy").order.size < sizes[-1]
    # freeze_prefix 0 unfreezes: the records and their rows are gone, the stream is re-packed from scratch
    _materialize(cfg_path, root, freeze=0)
    assert not (layout.root / "frozen").exists()
    assert "frozen" not in json.loads((layout.export_dir("greedy", "numpy") / "meta.json").read_text())
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM ordering_frozen_prefix").fetchone()[0] == 0
    stream = np.diff(np.load(layout.doc_offsets))
    order = np.random.default_rng(0).permutation(stream.size)
    gone = set(applied_removals(layout)["doc_id"].to_list())  # the planted copies, no prefix sparing them now
    assert gone == set(removed_documents(layout)["doc_id"].to_list())
    fresh = pack("best_fit", np.array([d for d in order if d not in gone]), stream, 128).segments
    assert pl.read_parquet(layout.segments).equals(fresh)


def _removals_spare_the_prefix(layout: Layout) -> None:
    """The packing left out every document the clean stage removed but those a frozen prefix holds."""
    removed = removed_documents(layout)
    assert removed is not None  # the planted copies
    held = set(frozen.frozen_docs(frozen.load_all(layout), frozen.doc_keys(layout)).tolist())
    applied = applied_removals(layout)
    applied_ids = set(applied["doc_id"].to_list()) if applied is not None else set()
    assert applied_ids == set(removed["doc_id"].to_list()) - held
    assert not applied_ids & set(pl.read_parquet(layout.segments)["doc_id"].to_list())


def _records_of(tmp_path, n_docs: int = 30, seq_len: int = 16, variant: str = "concat", atom: float | None = None, name: str = "concat"):
    """A corpus of ``n_docs`` documents, its packing and a frozen prefix of 4 of its sequences."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(3, 40, n_docs)
    keys = pl.DataFrame({"doc_id": np.arange(n_docs), "id": [f"d{i}" for i in range(n_docs)],
                         "content_hash": [f"h{i}" for i in range(n_docs)], "shard": ["a.jsonl"] * 15 + ["b.jsonl"] * (n_docs - 15)})
    packed = pack(variant, rng.permutation(n_docs), lengths, seq_len, atom_multiple=atom)
    ids = np.array([5, 0, 7, 2])
    seg = packed.segments.join(pl.DataFrame({"sequence_id": ids, "position": np.arange(4)}), on="sequence_id").join(keys, on="doc_id")
    rec = frozen.FrozenPrefix("greedy", 4, seg.select(list(frozen.RECORD_SCHEMA)).cast(frozen.RECORD_SCHEMA),
                              {"seq_len": seq_len, "packing": name, "chain": []})
    return rec, keys, lengths, packed


@pytest.mark.parametrize("variant,atom,name", [("concat", None, "concat"), ("padding", None, "padding"),
                                               ("best_fit", None, "best_fit"), ("concat", 0.5, "concat-x0.5")])
def test_pack_frozen_keeps_frozen_sequences_and_packs_the_rest(tmp_path, variant, atom, name):
    rec, keys, lengths, packed = _records_of(tmp_path, variant=variant, atom=atom, name=name)
    more = np.r_[lengths, [25, 9, 31]]  # three appended documents
    keys2 = pl.concat([keys, pl.DataFrame({"doc_id": [30, 31, 32], "id": ["n0", "n1", "n2"], "content_hash": ["x", "y", "z"],
                                           "shard": ["c.jsonl"] * 3})])
    out, (updated,) = frozen.pack_frozen([rec], keys2, more, variant, atom, 16, name, 0)
    acc = conservation(out.segments, more, 16, gaps=True)
    assert acc["ok"] and acc["tokens_dropped"] == out.tokens_dropped < 16  # at most the new packing's tail
    assert out.tokens_in == int(more.sum()) and out.tokens_packed == out.n_sequences * 16
    assert out.tokens_packed == out.tokens_in - out.tokens_dropped + out.tokens_eos_added + out.tokens_padding
    assert np.array_equal(updated.sequence_ids, [5, 0, 7, 2])  # ids kept after an append
    tokens = np.arange(int(more.sum()))
    offsets = np.r_[0, np.cumsum(more)]
    before = SequenceStore(tokens[: lengths.sum()], offsets[: lengths.size + 1], packed.segments, 16,
                           pad_id=-1).batch(np.array([5, 0, 7, 2]))[0]
    after = SequenceStore(tokens, offsets, out.segments, 16, pad_id=-1).batch(updated.sequence_ids)[0]
    np.testing.assert_array_equal(before, after)
    assert np.array_equal(np.unique(out.segments["sequence_id"]), np.arange(out.n_sequences))
    again, _ = frozen.pack_frozen([rec], keys2, more, variant, atom, 16, name, 0)
    assert again.segments.equals(out.segments)  # seeded: the same inputs give the same packing


def test_removed_documents_outside_the_prefix_leave_and_inside_it_are_refused(tmp_path):
    """The clean stage's removals with a frozen prefix: a document no frozen sequence holds is not
    packed (its tokens accounted as removed), the frozen sequences keep their rows; one a frozen
    sequence holds cannot be left out (the packing keeps it: pipeline/packing/stage.py)."""
    rec, keys, lengths, packed = _records_of(tmp_path)
    held = frozen.frozen_docs([rec], keys)
    assert held.size and np.array_equal(held, np.unique(rec.segments.join(keys, on=["id", "content_hash"])["doc_id"]))
    outside = np.setdiff1d(np.arange(30), held)[:4]
    leave = np.zeros(30, bool)
    leave[outside] = True
    out, (updated,) = frozen.pack_frozen([rec], keys, lengths, "concat", None, 16, "concat", 0, leave_out=leave)
    assert not set(out.segments["doc_id"].to_list()) & set(outside.tolist())
    kept = np.where(leave, 0, lengths)
    acc = conservation(out.segments, kept, 16, gaps=True)
    assert acc["ok"] and acc["tokens_kept"] + acc["tokens_dropped"] == int(lengths.sum() - lengths[outside].sum())
    assert out.tokens_in == int(kept.sum()) and out.tokens_dropped == acc["tokens_dropped"]
    tokens, offsets = np.arange(int(lengths.sum())), np.r_[0, np.cumsum(lengths)]
    before = SequenceStore(tokens, offsets, packed.segments, 16).batch(np.array([5, 0, 7, 2]))[0]
    np.testing.assert_array_equal(before, SequenceStore(tokens, offsets, out.segments, 16).batch(updated.sequence_ids)[0])
    leave[held[0]] = True
    with pytest.raises(ValueError, match="lies in a frozen prefix"):
        frozen.pack_frozen([rec], keys, lengths, "concat", None, 16, "concat", 0, leave_out=leave)


def test_edits_inside_the_prefix_are_refused_and_suffix_deletions_leave(tmp_path):
    rec, keys, lengths, _ = _records_of(tmp_path)
    inside = set(rec.segments["id"].to_list())
    victim = sorted(inside)[0]
    edited = keys.with_columns(
        pl.when(pl.col("id") == victim).then(pl.lit("changed")).otherwise(pl.col("content_hash")).alias("content_hash"))
    with pytest.raises(StrataInputError, match=rf"shard .*document '{victim}' is edited but lies in the frozen prefix.*Fix: restore"):
        frozen.pack_frozen([rec], edited, lengths, "concat", None, 16, "concat", 0)
    outside = [i for i in range(30) if f"d{i}" not in inside]
    keep = np.setdiff1d(np.arange(30), outside[:3])  # delete three suffix-only documents: doc ids renumbered
    keys3 = keys[keep].with_columns(doc_id=pl.Series(np.arange(keep.size)))
    out, (updated,) = frozen.pack_frozen([rec], keys3, lengths[keep], "concat", None, 16, "concat", 0)
    assert conservation(out.segments, lengths[keep], 16, gaps=True)["ok"]
    tokens = np.arange(int(lengths.sum()))
    offsets = np.r_[0, np.cumsum(lengths)]
    old = SequenceStore(tokens, offsets, rec.segments.join(keys.select("id", "doc_id"), on="id"), 16).batch(np.array([5, 0, 7, 2]))[0]
    new_tokens = np.concatenate([tokens[offsets[d] : offsets[d + 1]] for d in keep])
    new = SequenceStore(new_tokens, np.r_[0, np.cumsum(lengths[keep])], out.segments, 16).batch(updated.sequence_ids)[0]
    np.testing.assert_array_equal(old, new)


def test_freeze_prefix_config(tmp_path):
    ok = config_from_dict({"freeze_prefix": "consumed:30x4", "strategies": ["greedy"], "tokenizer": "gpt2"})
    assert frozen.frozen_count(ok.freeze_prefix) == 120
    # the launchpad's string
    assert config_from_dict({"freeze_prefix": "24", "strategies": ["greedy"], "tokenizer": "gpt2"}).freeze_prefix == 24
    from assets.params import PARAM_CLASSES

    assert PARAM_CLASSES["sequences"].model_fields["freeze_prefix"].annotation == str | None  # on the sequences launchpad
    run = tmp_path / "runs" / "greedy" / "seed0"
    run.mkdir(parents=True)
    pl.DataFrame({"position": np.arange(37), "sequence_id": np.arange(37)}).write_parquet(run / "stream.parquet")
    assert frozen.frozen_count(f"consumed:{run}") == frozen.frozen_count(f"consumed:{run / 'stream.parquet'}") == 37
    with pytest.raises(StrataInputError, match="no training stream"):
        frozen.frozen_count(f"consumed:{tmp_path / 'nothing'}")
    with pytest.raises(StrataInputError, match="repack documents"):
        config_from_dict({"freeze_prefix": 8, "strategies": ["greedy", "cluster_packed"], "tokenizer": "gpt2"})
    with pytest.raises(StrataInputError, match="fixed tokenizer"):
        config_from_dict({"freeze_prefix": 8, "strategies": ["greedy"]})
    with pytest.raises(StrataInputError, match="consumed:STEPSxGLOBAL_BATCH"):
        config_from_dict({"freeze_prefix": "half", "strategies": ["greedy"], "tokenizer": "gpt2"})


def test_greedy_after_its_own_prefix_continues_the_greedy():
    """Started from the running counts of the greedy's own first P picks, the greedy picks exactly
    what it would have picked next (the state carries T_j, U_b, S and n)."""
    from pipeline.ordering.greedy import Objective, greedy_after_prefix, greedy_order

    rng = np.random.default_rng(1)
    lengths = rng.integers(5, 200, 120)
    docs = pl.DataFrame({"doc_id": np.arange(120), "cluster": rng.integers(0, 5, 120), "n_tokens": lengths})
    seg = pack("concat", rng.permutation(120), lengths, 64).segments
    params = OrderParams(objective="f3", length_bins=6)
    from pipeline.ordering.engine import Inputs

    cluster, length = docs["cluster"].to_numpy(), lengths.astype(np.int64)
    f = Inputs(cluster, length, np.arange(120), None, seg, 64, params, 0, {}).features()
    obj = Objective.named("f3", 1.0)
    full = greedy_order(f, obj)
    for p in (1, 17, 60):
        np.testing.assert_array_equal(greedy_after_prefix(f, full[:p], obj, batch_size=10**6), full[p:])
    alone = greedy_order(f.take_rows(np.setdiff1d(np.arange(f.n_sequences), full[:17])), obj)
    assert not np.array_equal(np.setdiff1d(np.arange(f.n_sequences), full[:17])[alone], full[17:])  # the state matters


@pytest.mark.parametrize("strategy,exact_max", [("random", 10**5), ("greedy", 10**5), ("greedy", 10), ("greedy_block_shuffle", 10**5),
                                                 ("original", 10**5)])
def test_run_strategy_keeps_the_prefix_and_orders_the_rest(strategy, exact_max):
    rng = np.random.default_rng(2)
    lengths = rng.integers(5, 200, 150)
    docs = pl.DataFrame({"doc_id": np.arange(150), "cluster": rng.integers(0, 4, 150), "n_tokens": lengths})
    seg = pack("concat", rng.permutation(150), lengths, 64).segments
    params = OrderParams(length_bins=6, batch_size=4, greedy_exact_max=exact_max, greedy_block=16)
    m = int(seg["sequence_id"].max()) + 1
    prefix = rng.permutation(m)[:9]
    a = run_strategy(strategy, docs, seg, 64, params, 5, prefix=prefix).order["sequence_id"].to_numpy()
    assert np.array_equal(a[:9], prefix) and np.array_equal(np.sort(a), np.arange(m))
    b = run_strategy(strategy, docs, seg, 64, params, 5, prefix=prefix).order["sequence_id"].to_numpy()
    assert np.array_equal(a, b)  # seeded
    if strategy == "random":  # the suffix alone is shuffled: the strategy on the remaining rows
        rest = np.setdiff1d(np.arange(m), prefix)
        assert np.array_equal(a[9:], rest[np.random.default_rng(5).permutation(rest.size)])
    with pytest.raises(StrataInputError, match="repacks documents"):
        run_strategy("cluster_packed", docs, seg, 64, params, 5, prefix=prefix)



def test_blocked_greedy_after_a_skewed_prefix_recovers_faster():
    """Above ``greedy_exact_max`` the suffix's blocked greedy continues from the prefix's counts: the
    whole stream's cumulative cluster error after a prefix of one cluster drops faster than with the
    blocked greedy on the suffix alone; the order stays a permutation with the prefix kept."""
    from pipeline.ordering.greedy import Objective, greedy_blocked_order

    rng = np.random.default_rng(3)
    n = 1200
    lengths = rng.integers(5, 120, n)
    cluster = rng.integers(0, 4, n)
    docs = pl.DataFrame({"doc_id": np.arange(n), "cluster": cluster, "n_tokens": lengths})
    by_cluster = np.concatenate([np.flatnonzero(cluster == 0), rng.permutation(np.flatnonzero(cluster != 0))])
    seg = pack("concat", by_cluster, lengths, 64).segments  # cluster 0's documents fill the first sequences
    m = int(seg["sequence_id"].max()) + 1
    prefix = np.arange(m // 16)  # frozen: sequences of cluster 0 only
    params = OrderParams(objective="f1", batch_size=8, greedy_exact_max=50, greedy_block=64)
    order = run_strategy("greedy", docs, seg, 64, params, 7, prefix=prefix).order["sequence_id"].to_numpy()
    assert np.array_equal(order[: prefix.size], prefix) and np.array_equal(np.sort(order), np.arange(m))
    assert np.array_equal(order, run_strategy("greedy", docs, seg, 64, params, 7, prefix=prefix).order["sequence_id"].to_numpy())

    from pipeline.ordering.engine import Inputs

    f = Inputs(cluster, lengths.astype(np.int64), np.arange(n), None, seg, 64, params, 7, {}).features()
    rest = np.arange(prefix.size, m)
    alone = np.concatenate([prefix, rest[greedy_blocked_order(f.take_rows(rest), Objective.named("f1"), 64, 0.0, 7)]])
    t = np.arange(prefix.size + 1, m + 1)
    err_continued = _stream_error(order, seg, cluster, t)
    err_alone = _stream_error(alone, seg, cluster, t)
    half = (m - prefix.size) // 2
    assert err_continued[:half].mean() < 0.75 * err_alone[:half].mean()
    q = 3 * prefix.size  # enough suffix sequences to dilute a prefix of one of 4 clusters back to its share
    assert err_continued[q] < 0.6 * err_alone[q]


def _tree(d) -> dict:
    """Relative path -> (bytes, inode, mtime_ns) of every file under ``d`` but the digest records
    (``pipeline/storage/atomic.py``: sidecar), which hold modification times, not the export's bytes."""
    from pipeline.storage.atomic import is_sidecar

    return {p.relative_to(d).as_posix(): (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns)
            for p in sorted(d.rglob("*")) if p.is_file() and not is_sidecar(p)}


@pytest.mark.parametrize("fmt", ["numpy", "megatron", "hf", "mds"])
def test_export_with_a_frozen_prefix_extends_the_previous_export(tmp_path, monkeypatch, fmt):
    """Re-exporting after an append into the same directory keeps the frozen prefix's bytes (the
    whole shards inside it keep their inode and mtime), equals a fresh export byte for byte, and the
    trainers' readers read it; another prefix, or none, rewrites it whole."""
    from pipeline.export import export_stream, stream_from_arrays
    from pipeline.export import hf as hf_export
    from pipeline.export import mds as mds_export

    L, G = 16, 4
    monkeypatch.setattr(hf_export, "SHARD_TOKENS", 8 * L)  # 8 sequences per shard
    monkeypatch.setattr(mds_export, "SIZE_LIMIT", 8 * (2 * L + 4) + 400)
    rng = np.random.default_rng(4)
    lengths = rng.integers(5, 40, size=120)
    tokens = rng.integers(2, 900, size=int(lengths.sum())).astype(np.uint16)
    offsets = np.r_[0, np.cumsum(lengths)]
    tokens[offsets[1:] - 1] = 1  # EOS
    seg = pack("concat", rng.permutation(lengths.size), lengths, L).segments
    store = SequenceStore(tokens, offsets, seg, L, pad_id=0)
    m = store.n_sequences
    p = 20  # frozen positions
    prefix = rng.permutation(m)[:p]
    rest = np.setdiff1d(np.arange(m), prefix)
    before = np.concatenate([prefix, rng.permutation(rest)[: rest.size // 2]])  # the stream before the append
    after = np.concatenate([prefix, rng.permutation(rest)])  # the appended data, the suffix reordered
    rec = {"sequences": p, "tokens_sha256": frozen.prefix_digest(store, prefix, np.dtype(np.uint16)), "version_chain": []}

    def export(order, out, record=rec):
        stream = stream_from_arrays(tokens, offsets, seg, order, L, eos_id=1, pad_id=0)
        return export_stream(stream, fmt, out, global_batch=G, meta={"strategy": "greedy", "frozen": record})

    out = tmp_path / "export"
    assert export(before, out)["kept_sequences"] == 0
    old = _tree(out)
    summary = export(after, out)
    assert summary["kept_sequences"] == p
    new, fresh = _tree(out), _tree(export(after, tmp_path / "fresh")["dir"])
    assert {k: v[0] for k, v in new.items()} == {k: v[0] for k, v in fresh.items()}  # byte for byte
    width = 2 * L
    if fmt in ("numpy", "megatron"):
        assert new["tokens.bin"][0][: p * width] == old["tokens.bin"][0][: p * width]
    if fmt == "megatron":
        from megatron.core.datasets.indexed_dataset import IndexedDataset  # the trainer's own reader

        indexed = IndexedDataset(str(out / "tokens"))
        assert len(indexed) == after.size
        np.testing.assert_array_equal(np.stack([indexed[i][:L] for i in range(after.size)]), store.batch(after)[0])
    if fmt == "numpy":
        np.testing.assert_array_equal(open_numpy(out)[0], store.batch(after)[0])
    shards = sorted(k for k in old if k.startswith("data/") or k.endswith(".mds"))
    if shards:  # whole shards inside the prefix: the same files (inode, mtime); the next ones are rewritten
        pairs = zip(shards, sorted(k for k in new if k.startswith("data/") or k.endswith(".mds")))
        inside = [(a, b) for a, b in pairs if old[a][0] == new[b][0]]
        assert inside and len(inside) < len(shards)
        for a, b in inside:
            assert new[b][1:] == old[a][1:]
        assert all(new[k][1] != fresh[k][1] for k in new)
    if fmt == "hf":
        table = pq.read_table(sorted((out / "data").glob("*.parquet")))
        np.testing.assert_array_equal(np.array(table["input_ids"].to_pylist()), store.batch(after)[0])
    again = _tree(out)
    export(after, out, {**rec, "tokens_sha256": "0" * 64})  # another frozen prefix: rewritten whole
    assert all(_tree(out)[k][1] != again[k][1] for k in again)
