"""Per-shard work units: the unit functions give the whole-corpus values, reruns reuse shards,
and a run interrupted midway resumes from the units already written."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
from helpers import demo_slice

from pipeline.config import RayConfig
from pipeline.data.shard_docs import ShardDocs, read_shard_docs
from pipeline.data.token_shards import tokenize_unit
from pipeline.data.tokenizer import load_tokenizer, sample_chooser, train_bpe
from pipeline.data.tokens import tokenize_documents, tokenizer_fingerprint
from pipeline.distributed.units import map_corpus_shards
from pipeline.represent.embeddings import default_model_path, embed, same_tokenizer, shallow_from_ids


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [r["text"][:2000] for r in demo_slice(60)]


@pytest.fixture(scope="module")
def tokenizer(texts):
    return train_bpe(texts, 300)


def test_tokenize_unit_equals_whole_and_per_document(texts, tokenizer):
    flat, n_tokens, n_chars, n_bytes = tokenize_unit(tokenizer.backend_tokenizer.to_str(), tokenizer.eos_token_id, "<u2", texts)
    whole, off = tokenize_documents(tokenizer, texts, progress=False)
    np.testing.assert_array_equal(flat, whole)
    np.testing.assert_array_equal(n_tokens + 1, np.diff(off))
    assert n_chars.tolist() == [len(t) for t in texts] and n_bytes.tolist() == [len(t.encode()) for t in texts]
    eos = tokenizer.eos_token_id
    for i in (0, 17, 59):
        ids = tokenizer.backend_tokenizer.encode(texts[i], add_special_tokens=False).ids + [eos]
        np.testing.assert_array_equal(whole[off[i] : off[i + 1]], ids)


def test_shallow_from_token_ids_equals_tokenizing(texts):
    model = default_model_path()
    tok = load_tokenizer(model)
    assert same_tokenizer(model, tok.backend_tokenizer.to_str())
    assert not same_tokenizer(model, train_bpe(texts, 300).backend_tokenizer.to_str())
    flat, off = tokenize_documents(tok, texts, progress=False)
    n_tokens = np.diff(off) - 1
    ids = np.concatenate([flat[a : b - 1] for a, b in zip(off[:-1], off[1:])])  # EOS dropped
    np.testing.assert_array_equal(shallow_from_ids(model, 32, ids, n_tokens), embed(texts, "shallow", model, 32, progress=False))


def test_fingerprints_change_with_what_produced_them(texts, tokenizer):
    assert tokenizer_fingerprint(train_bpe(texts[:20], 300)) != tokenizer_fingerprint(tokenizer)
    assert tokenizer_fingerprint(train_bpe(texts, 300)) == tokenizer_fingerprint(tokenizer)


def _shards(tmp_path, texts) -> list[ShardDocs]:
    """Three validated shards (row groups of 16): 25 documents, none (all held out), then 35 with
    5 held-out rows between them (skipped by the per-shard stages)."""
    parts = [(texts[:25], [False] * 25), (texts[25:30], [True] * 5), (texts[25:60], [True] * 0)]
    held = ["held out " + t for t in texts[:5]]
    parts[2] = (texts[25:40] + held + texts[40:60], [False] * 15 + [True] * 5 + [False] * 20)
    out = []
    for i, (txt, ho) in enumerate(parts):
        path = tmp_path / f"v{i}.parquet"
        pl.DataFrame({"text": txt, "heldout": ho}).write_parquet(path, row_group_size=16)
        out.append(ShardDocs.of(f"s{i}", path))
    return out


def test_map_corpus_shards_reuses_shards_and_resumes_units(tmp_path, texts, tokenizer):
    shards = _shards(tmp_path, texts)
    assert [s.n_docs for s in shards] == [25, 0, 35]
    assert read_shard_docs(shards[2], 10, 21)["text"].to_list() == texts[35:46]  # the held-out rows between are skipped
    cfg = SimpleNamespace(shard_docs=7, engine="local", ray=RayConfig())
    args = (tokenizer.backend_tokenizer.to_str(), tokenizer.eos_token_id, "<u2")
    out, calls = tmp_path / "out", []

    def unit_args(shard, a, b):
        calls.append((shard.unit, a, b))
        return (*args, read_shard_docs(shard, a, b)["text"].to_list())

    def assemble(shard, results):
        np.save(out / f"{shard.name}.npy", np.concatenate([r[0] for r in results]))

    def run():
        return map_corpus_shards(shards, tokenize_unit, unit_args, assemble, lambda s: (out / f"{s.name}.npy").is_file(),
                                 stage="tokens", key="k", work_dir=tmp_path / "work", cfg=cfg)

    out.mkdir()
    assert run() == {"shards": 3, "shards_computed": 2, "shards_reused": 1, "units": 9, "units_resumed": 0}
    assert calls == [("s0", 0, 7), ("s0", 7, 14), ("s0", 14, 21), ("s0", 21, 25)] + [("s2", a, min(a + 7, 35)) for a in range(0, 35, 7)]
    whole, _ = tokenize_documents(tokenizer, texts, progress=False)
    got = np.concatenate([np.load(out / f"{s.name}.npy") for s in (shards[0], shards[2])])
    np.testing.assert_array_equal(got, whole)
    assert not list((tmp_path / "work").iterdir())  # unit files are removed once their shard is assembled

    calls.clear()
    assert run()["shards_computed"] == 0 and calls == []  # everything reused
    last = out / f"{shards[2].name}.npy"
    last.unlink()  # as if a run died after 2 units of shard 2
    for a, b in ((0, 7), (7, 14)):
        np.savez(tmp_path / "work" / f"tokens-{shards[2].name}-k-{a}.npz", *tokenize_unit(*unit_args(shards[2], a, b)))
    calls.clear()
    assert run() == {"shards": 3, "shards_computed": 1, "shards_reused": 2, "units": 5, "units_resumed": 2}
    assert calls == [("s2", 14, 21), ("s2", 21, 28), ("s2", 28, 35)]
    np.testing.assert_array_equal(np.load(last), whole[got.size - np.load(last).size :])


def test_a_unit_saved_after_its_shard_is_assembled_is_dropped(tmp_path, texts, tokenizer):
    """On Ray a worker writes its unit's file before the driver takes its result, so the driver can
    see a shard's every file, assemble it, and then be handed one of those units: its file is
    dropped, not a KeyError. Here the first unit's arguments write the shard's other units' files
    (their workers ahead of the driver), which run after it."""
    shards = _shards(tmp_path, texts)[:1]
    cfg = SimpleNamespace(shard_docs=7, engine="local", ray=RayConfig())
    args = (tokenizer.backend_tokenizer.to_str(), tokenizer.eos_token_id, "<u2")
    out, work = tmp_path / "out", tmp_path / "work"

    def unit_args(shard, a, b):
        unit = (*args, read_shard_docs(shard, a, b)["text"].to_list())
        if a == 0:
            for c in range(7, shard.n_docs, 7):
                np.savez(work / f"tokens-{shard.name}-k-{c}.npz", *tokenize_unit(*args, read_shard_docs(shard, c, c + 7)["text"].to_list()))
        return unit

    def assemble(shard, results):
        np.save(out / f"{shard.name}.npy", np.concatenate([r[0] for r in results]))

    out.mkdir()
    stats = map_corpus_shards(shards, tokenize_unit, unit_args, assemble, lambda s: (out / f"{s.name}.npy").is_file(),
                              stage="tokens", key="k", work_dir=work, cfg=cfg)
    assert stats["shards_computed"] == 1 and stats["units"] == 4
    whole, _ = tokenize_documents(tokenizer, texts[:25], progress=False)
    np.testing.assert_array_equal(np.load(out / f"{shards[0].name}.npy"), whole)
    assert not list(work.iterdir())


def test_unit_results_stream_into_assemble_without_unit_files(tmp_path, texts, tokenizer):
    """``checkpoint=False`` on the local engine: no unit file is written, the artifacts are those
    of the checkpointed path, and unit files an earlier run left are used instead of recomputing."""
    shards = _shards(tmp_path, texts)
    cfg = SimpleNamespace(shard_docs=7, engine="local", ray=RayConfig())
    args = (tokenizer.backend_tokenizer.to_str(), tokenizer.eos_token_id, "<u2")
    work, calls, seen = tmp_path / "work", [], []

    def unit_args(shard, a, b):
        calls.append((shard.unit, a, b))
        seen.append(sorted(p.name for p in work.iterdir()))
        return (*args, read_shard_docs(shard, a, b)["text"].to_list())

    def run(out, checkpoint):
        out.mkdir(exist_ok=True)
        return map_corpus_shards(shards, tokenize_unit, unit_args,
                                 lambda shard, results: np.save(out / f"{shard.name}.npy", np.concatenate([r[0] for r in results])),
                                 lambda s: (out / f"{s.name}.npy").is_file(), stage="tokens", key="k", work_dir=work, cfg=cfg,
                                 checkpoint=checkpoint)

    assert run(tmp_path / "files", True)["units"] == 9
    seen.clear()
    assert run(tmp_path / "stream", False) == {"shards": 3, "shards_computed": 2, "shards_reused": 1, "units": 9, "units_resumed": 0}
    assert seen and not any(seen) and not list(work.iterdir())  # no unit file, ever
    for s in (shards[0], shards[2]):
        assert (tmp_path / "stream" / f"{s.name}.npy").read_bytes() == (tmp_path / "files" / f"{s.name}.npy").read_bytes()

    last = tmp_path / "stream" / f"{shards[2].name}.npy"
    last.unlink()
    np.savez(work / f"tokens-{shards[2].name}-k-7.npz", *tokenize_unit(*unit_args(shards[2], 7, 14)))
    calls.clear()
    assert run(tmp_path / "stream", False)["units_resumed"] == 1
    assert calls == [("s2", a, min(a + 7, 35)) for a in (0, 14, 21, 28)]
    assert last.read_bytes() == (tmp_path / "files" / f"{shards[2].name}.npy").read_bytes()
    assert not list(work.iterdir())


def test_tokenizer_sample_is_seeded_bernoulli_over_the_corpus(texts):
    total = sum(len(t) for t in texts)

    def sample(parts: int, budget: int, seed: int) -> list[str]:
        choose, got, a = sample_chooser(total, budget, seed), [], 0
        for n in [len(texts) // parts] * (parts - 1) + [len(texts) - (parts - 1) * (len(texts) // parts)]:
            picked = choose(n)
            got += texts[a : a + n] if picked is None else [texts[a + int(i)] for i in picked]
            a += n
        return got

    assert sample(4, 0, 0) == texts  # no budget: every text, in order
    assert sample(4, total, 0) == texts
    got = sample(4, total // 4, 7)
    rng = np.random.default_rng(7)  # one draw a text, in order: each text kept with p = budget / total
    want = [t for t, u in zip(texts, rng.random(len(texts))) if u < (total // 4) / total]
    assert got == want and 0 < len(got) < len(texts)
    assert got == sample(11, total // 4, 7) == sample(1, total // 4, 7)  # same seed, same sample, whatever the parts

