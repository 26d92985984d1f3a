"""Training loop, masks, presets, epoch-boundary flags and the training figures (tiny models, CPU)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch

from pipeline.errors import StrataInputError
from pipeline.ordering.odm import ODMSampler, sequence_clusters
from pipeline.packing.pack import SequenceStore, pack_concat
from pipeline.reports import training_plots as TP
from pipeline.training.loop import TrainSettings, checkpoint_steps, epoch_boundary_jumps, train
from pipeline.training.model import PRESETS, batch_tensors, build_model, preset_parameters, token_losses

VOCAB, EOS, PAD = 48, 1, 0


def make_store(docs: list[np.ndarray], seq_len: int) -> tuple[SequenceStore, np.ndarray, pl.DataFrame]:
    """A flat token store (every document + EOS) packed in document order: (store, tokens, segments)."""
    flat = np.concatenate([np.append(d, EOS) for d in docs]).astype(np.int64)
    lengths = np.array([d.size + 1 for d in docs])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    pk = pack_concat(np.arange(len(docs)), lengths, seq_len)
    return SequenceStore(flat, offsets, pk.segments, seq_len), flat, pk.segments


def repetitive_docs(n_docs: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Documents that each repeat one of 3 short token patterns (easy to learn)."""
    patterns = [np.arange(2, 9), np.arange(20, 25), np.array([30, 31, 30, 32, 33])]
    out = []
    for i in range(n_docs):
        p = patterns[i % 3]
        out.append(np.tile(p, int(rng.integers(3, 8)))[: int(rng.integers(10, 30))])
    return out


def _logits(model, store, cross_document):
    with torch.no_grad():
        b = batch_tensors(store, np.array([0]), cross_document, "cpu")
        return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits[0]


def test_block_diagonal_mask_isolates_documents():
    rng = np.random.default_rng(0)
    docs = [rng.integers(2, VOCAB, n) for n in (9, 11, 9)]  # streams 10 + 12 + 10 = one 32-token sequence
    model = build_model("tiny", VOCAB, 32, 0, EOS, PAD).eval()
    store, flat, seg = make_store(docs, 32)
    assert seg.height == 3
    perturbed = flat.copy()
    perturbed[11:20] = rng.integers(2, VOCAB, 9)  # the middle document's text tokens (stream 10..21)
    store2 = SequenceStore(perturbed, np.array([0, 10, 22, 32]), seg, 32)
    a, b = _logits(model, store, False), _logits(model, store2, False)
    assert torch.equal(a[:10], b[:10])  # the first document never sees the second
    assert torch.equal(a[22:], b[22:])  # nor does the third (no attention backwards across a boundary)
    assert not torch.allclose(a[10:22], b[10:22])
    a, b = _logits(model, store, True), _logits(model, store2, True)
    assert torch.equal(a[:10], b[:10])  # causal: the past is unaffected either way
    assert not torch.allclose(a[22:], b[22:], atol=1e-4)  # with cross-document attention the third document changes


def test_positions_restart_per_document_unless_cross_document():
    rng = np.random.default_rng(1)
    store, _, _ = make_store([rng.integers(2, VOCAB, n) for n in (9, 11, 9)], 32)
    pos = batch_tensors(store, np.array([0]), False, "cpu")["position_ids"][0].numpy()
    assert pos[0] == 0 and pos[10] == 0 and pos[22] == 0 and pos[21] == 11
    assert np.array_equal(batch_tensors(store, np.array([0]), True, "cpu")["position_ids"][0].numpy(), np.arange(32))
    labels = batch_tensors(store, np.array([0]), False, "cpu")["labels"][0].numpy()
    assert labels[9] == -100 and labels[21] == -100 and labels[31] == -100 and labels[0] == store.tokens[1]


def test_chunked_loss_equals_full_logits_loss_and_gradients(corpus):
    """The checkpointed, chunked output head gives the loss and gradients of full logits."""
    store, _, _ = corpus
    batch = batch_tensors(store, np.arange(4), False, "cpu")
    grads = []
    for chunk in (7, 10**6):  # 7 tokens: chunks end mid-sequence; 10**6: one pass
        model = build_model("tiny", VOCAB, 32, 0, EOS, PAD)
        tok, scored = token_losses(model, batch, max_logit_bytes=chunk * VOCAB * 4)
        (tok * scored).sum().backward()
        grads.append((tok.detach(), [p.grad.clone() for p in model.parameters()]))
    model = build_model("tiny", VOCAB, 32, 0, EOS, PAD)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]).logits
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"].reshape(-1), ignore_index=-100, reduction="none")
    (ref * (batch["labels"].reshape(-1) != -100)).sum().backward()
    for tok, g in grads:
        torch.testing.assert_close(tok, ref.view(tok.shape).detach(), rtol=1e-5, atol=1e-6)
        for a, b in zip(g, [p.grad for p in model.parameters()]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(2)
    docs = repetitive_docs(240, rng)
    store, _, seg = make_store(docs, 32)
    return store, seg, np.arange(len(docs)) % 3


SMALL = TrainSettings(preset="tiny", batch_size=8, max_steps=24, lr=5e-3, warmup_steps=3, seed=0)


def test_loss_decreases_and_same_seed_is_identical(corpus):
    store, _, _ = corpus
    order = np.random.default_rng(0).permutation(store.n_sequences)
    _, log = train(store, order, VOCAB, EOS, PAD, SMALL, progress=False)
    losses = np.array([r["loss"] for r in log])
    assert losses[0] > math.log(VOCAB) - 0.5
    assert losses[-5:].mean() < losses[:3].mean() - 1.5
    assert all(r["tokens_seen"] == (r["step"] + 1) * 8 * 32 for r in log) and all(r["tokens_per_s"] > 0 for r in log)
    short = TrainSettings(**{**SMALL.__dict__, "max_steps": 4})
    a = [r["loss"] for r in train(store, order, VOCAB, EOS, PAD, short, progress=False)[1]]
    b = [r["loss"] for r in train(store, order, VOCAB, EOS, PAD, short, progress=False)[1]]
    c = [r["loss"] for r in train(store, order, VOCAB, EOS, PAD, TrainSettings(**{**short.__dict__, "seed": 1}), progress=False)[1]]
    assert a == b and a[:3] == losses[:3].tolist()  # same seed, same curve (warm-up steps share the lr)
    assert a != c


def test_epochs_wrap_and_checkpoints_are_probed(corpus):
    store, _, _ = corpus
    order = np.arange(20)  # 20 sequences, batch 8: epoch 1 starts at step 3 (sequence 24)
    seen = []
    s = TrainSettings(**{**SMALL.__dict__, "max_steps": 10})
    _, log = train(store, order, VOCAB, EOS, PAD, s, progress=False, checkpoints=checkpoint_steps(10), on_checkpoint=lambda k,
                   m: seen.append((k, m.training)))
    assert [r["epoch"] for r in log] == [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]
    assert seen == [(2, True), (10, True)]
    assert checkpoint_steps(60) == [12, 60]
    with pytest.raises(StrataInputError):
        train(store, None, VOCAB, EOS, PAD, s, progress=False)


def test_train_with_odm_sampler(corpus):
    store, seg, doc_cluster = corpus
    sc = sequence_clusters(seg, doc_cluster)
    s = TrainSettings(**{**SMALL.__dict__, "max_steps": 14})
    sampler = ODMSampler(sc, s.max_steps, seed=0)
    _, log = train(store, None, VOCAB, EOS, PAD, s, progress=False, sampler=sampler)
    losses = np.array([r["loss"] for r in log])
    assert losses[-3:].mean() < losses[:3].mean() - 0.5
    mix = sampler.mixture_rows()
    assert mix.height == s.max_steps * sampler.k
    assert np.allclose(mix.group_by("step").agg(pl.col("prob").sum())["prob"].to_numpy(), 1.0)
    assert sampler.served_ids().size == s.max_steps * s.batch_size


def _synthetic_log(n_epochs: int, steps_per_epoch: int, spike: float, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(n_epochs * steps_per_epoch):
        e, k = divmod(step, steps_per_epoch)
        loss = 4.0 * math.exp(-step / 200) + 2.0 + rng.normal(0, 0.02)
        gn = 1.0 + rng.normal(0, 0.05)
        if e > 0 and k < 3:
            loss += spike
            gn *= 1 + 3 * (spike > 0)  # Diversity-ordered training: ~4x grad norm at the boundary
        rows.append({"step": step, "epoch": e, "loss": loss, "grad_norm": gn})
    return rows


def test_epoch_boundary_jumps_on_synthetic_logs():
    flagged = epoch_boundary_jumps(_synthetic_log(3, 100, spike=0.5))
    assert [(r["boundary_step"], r["metric"]) for r in flagged] == [(100, "loss"), (100, "grad_norm"), (200, "loss"), (200, "grad_norm")]
    assert all(r["flagged"] and r["z"] > 5 for r in flagged)
    assert all(3.5 < r["ratio"] < 5.5 for r in flagged if r["metric"] == "grad_norm")
    calm = epoch_boundary_jumps(_synthetic_log(3, 100, spike=0.0))
    assert len(calm) == 4 and not any(r["flagged"] for r in calm)
    assert epoch_boundary_jumps(_synthetic_log(1, 100, spike=0.5)) == []


def test_presets_have_the_documented_sizes():
    assert list(PRESETS) == ["tiny", "small", "base", "100m"]
    tiny = preset_parameters("tiny", 8192)
    built = build_model("tiny", 8192, 64, 0, EOS, PAD)
    assert tiny["total"] == sum(p.numel() for p in built.parameters())
    h, i = 128, 384
    assert tiny["non_embedding"] == 2 * (4 * h * h + 3 * h * i + 2 * h) + h
    sizes = {p: (preset_parameters(p, 8192)["total"], preset_parameters(p, 50257)["total"]) for p in PRESETS}
    assert 1.4e6 < sizes["tiny"][0] < 1.6e6 and 5e6 < sizes["small"][0] < 6e6 and 29e6 < sizes["base"][0] < 31e6
    assert 90e6 < sizes["100m"][0] < 92e6 and 123e6 < sizes["100m"][1] < 125e6
    with pytest.raises(StrataInputError):
        preset_parameters("huge", 8192)


def test_training_figures(tmp_path, corpus):
    rng = np.random.default_rng(3)
    log = pl.DataFrame([
        {"strategy": s, "seed": seed, "step": t, "loss": 5 * math.exp(-t / 30) + 2 + 0.1 * rng.normal() + 0.2 * (s == "random")}
        for s in ("random", "greedy") for seed in (0, 1) for t in range(100)
    ])
    sampler = ODMSampler(np.arange(60) % 4, 50, seed=0)
    for _ in range(50):
        ids = sampler.next_batch(8)
        sampler.update(ids, 1.0 + (ids % 4 == 2))
    sr = pl.DataFrame([
        {"strategy": s, "checkpoint": ck, "layer_name": f"layers.{layer}.{b}.{m}", "layer": layer, "block": b, "matrix": m,
         "min_stable_rank": 1.5 + layer + (s == "greedy"), "mean_stable_rank": 2.5 + layer}
        for s in ("random", "greedy") for ck in (20, 100) for layer in range(2) for b, m in (("attention", "q"), ("mlp", "up"))
    ])
    fid = {"random": 0.95 + 0.01 * np.eye(10) * 5, "greedy": np.clip(0.9 + 0.1 * np.eye(10), 0, 1)}
    paths = [
        TP.plot_loss_curves(log, tmp_path / "loss.png"),
        TP.plot_mixture(sampler.mixture_rows(), tmp_path / "mix.png"),
        TP.plot_stable_ranks(sr, tmp_path / "sr.png"),
        TP.plot_fidelity(fid, tmp_path / "fid.png"),
    ]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(StrataInputError):
        TP.plot_loss_curves(log.head(0), tmp_path / "x.png")


@pytest.mark.parametrize("cross_document", [False, True])
def test_flex_block_mask_gives_the_dense_mask_loss(corpus, cross_document):
    """The fused path (FlexAttention BlockMask) gives the dense 4D mask + SDPA loss (same weights).
    Forward only: FlexAttention has no backward on CPU (training there uses the dense mask)."""
    store, _, _ = corpus
    ids = np.arange(6)
    out = {}
    for mode in ("dense", "flex"):
        model = build_model("tiny", VOCAB, 32, 3, EOS, PAD, mask_mode=mode)
        with torch.no_grad():
            tok, scored = token_losses(model, batch_tensors(store, ids, cross_document, "cpu", mode))
        out[mode] = tok[scored]
    assert torch.allclose(out["dense"], out["flex"], atol=1e-5)
    assert not torch.allclose(out["dense"], token_losses_other_mask(store, ids, cross_document), atol=1e-3)


def token_losses_other_mask(store, ids, cross_document):
    """The dense loss with the other cross-document setting (the comparison above is not vacuous)."""
    model = build_model("tiny", VOCAB, 32, 3, EOS, PAD)
    with torch.no_grad():
        tok, scored = token_losses(model, batch_tensors(store, ids, not cross_document, "cpu"))
    return tok[batch_tensors(store, ids, cross_document, "cpu")["labels"] != -100]


def test_heldout_batch_is_scored_on_schedule_and_positions_stay_in_context(corpus):
    from pipeline.training.heldout import heldout_batch, score_heldout, score_steps

    class Tok:  # whitespace "tokenizer" over the test vocabulary
        eos_token_id, pad_token_id = EOS, PAD

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [int(t) for t in text.split()]}

    texts = [" ".join(str(t) for t in np.tile(np.arange(2, 9), 8)), "5", " ".join(["30", "31"] * 3)]
    hb = heldout_batch(texts, ["a", "b", "c"], Tok(), 32, n_docs=5)
    assert hb.units == ["a", "b", "c"] and hb.filled[0].all() and hb.filled.sum(1)[1:].tolist() == [2, 7]
    store, _, _ = corpus
    seen = []
    s = TrainSettings(**{**SMALL.__dict__, "max_steps": 7, "heldout_every": 3})
    model, _ = train(store, np.arange(store.n_sequences), VOCAB, EOS, PAD, s, progress=False, heldout=hb,
                     on_heldout=lambda step, tokens, losses: seen.append((step, tokens, losses)))
    assert [x[0] for x in seen] == score_steps(7, 3) == [0, 3, 6, 7]
    assert seen[0][1] == 0 and seen[-1][1] == 7 * 8 * 32
    assert seen[-1][2].shape == (3,) and seen[-1][2][0] < seen[0][2][0] - 1.0  # the pattern was learned
    assert np.allclose(score_heldout(model, hb, "cpu"), seen[-1][2], atol=1e-6)
    assert model.config.max_position_embeddings == 32
