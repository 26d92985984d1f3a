"""Exports train what Strata measured: docs/export.md's recipes, run verbatim with each trainer's own
code, reproduce Strata's document masking (``pipeline.training.model``) on the same sequences —
Megatron's GPTDataset masks and position ids, OLMo-core's document lengths, and transformers'
flattening collator in a real model forward — and the export warns where they cannot."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_export import EOS, PAD, VOCAB, G, L, megatron_from_recipe, run_recipe

from pipeline.export import export_stream, stream_from_arrays
from pipeline.export.stream import sequence_pieces
from pipeline.packing.pack import SequenceStore, pack
from pipeline.training.model import batch_tensors, build_model, token_losses

pytestmark = pytest.mark.integration  # end to end through three trainers' code; small and fast

# several documents per sequence; best_fit pads the end of sequences; every document piece inside
# a sequence follows an EOS
VARIANTS = ["concat", "best_fit"]
LOSS_TOLERANCE = 1e-5  # |HF loss - Strata loss|, float32 on CPU


def _packed(variant: str, atom_multiple: float | None = None, seed: int = 3):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 40, size=120)
    tokens = rng.integers(2, VOCAB, size=int(lengths.sum())).astype(np.uint16)
    offsets = np.r_[0, np.cumsum(lengths)]
    tokens[offsets[1:] - 1] = EOS
    packing = pack(variant, rng.permutation(lengths.size), lengths, L, atom_multiple=atom_multiple, seed=seed)
    order = rng.permutation(packing.n_sequences)[: packing.n_sequences // G * G]
    store = SequenceStore(tokens, offsets, packing.segments, L, pad_id=PAD)
    stream = stream_from_arrays(tokens, offsets, packing.segments, order, L, eos_id=EOS, pad_id=PAD)
    return stream, store, order


def _strata(store, ids) -> dict:
    """Strata's own training inputs (CPU: dense block-diagonal mask) as numpy arrays."""
    b = batch_tensors(store, np.asarray(ids), False, "cpu", "dense")
    return {"tokens": b["input_ids"].numpy(), "allowed": b["attention_mask"][:, 0].numpy(), "pos": b["position_ids"].numpy(),
            "scored": (b["labels"] != -100).numpy(), "filled": b["filled"].numpy()}


@pytest.mark.parametrize("variant", VARIANTS)
def test_megatron_recipe_masks_like_strata(tmp_path, variant):
    pytest.importorskip("megatron.core")
    stream, store, order = _packed(variant)
    out = tmp_path / "meg"
    export_stream(stream, "megatron", out, global_batch=G)
    assert json.loads((out / "meta.json").read_text())["document_masking"]["eos_delimited"]
    n_steps = order.size // G
    recipe = megatron_from_recipe(out, tmp_path / "tok", tmp_path / "cache", n_steps)
    exact = megatron_from_recipe(out, tmp_path / "tok", tmp_path / "cache", n_steps, add_extra_token_to_sequence=False)
    want = _strata(store, order)
    extra_scored = 0
    for k in range(order.size):
        s, e = recipe[k], exact[k]
        filled = want["filled"][k]
        np.testing.assert_array_equal(s["tokens"].numpy(), want["tokens"][k])
        # attention (Megatron's mask is True where masked) and positions: equal for every real query
        np.testing.assert_array_equal(~s["attention_mask"][0].numpy()[filled], want["allowed"][k][filled])
        np.testing.assert_array_equal(s["position_ids"].numpy()[filled], want["pos"][k][filled])
        # loss: equal with add_extra_token_to_sequence=False; Megatron-LM's default also scores the
        # last position against the next sample's first token unless that position is an EOS
        np.testing.assert_array_equal(e["loss_mask"].numpy() > 0, want["scored"][k])
        last = np.zeros(L, bool)
        last[-1] = s["tokens"][-1] != EOS and s["labels"][-1] != PAD
        np.testing.assert_array_equal(s["loss_mask"].numpy() > 0, want["scored"][k] | last)
        extra_scored += int(last[-1])
    assert extra_scored < order.size  # sequences ending in EOS exist: the exception is exactly that position
    # Megatron's defaults (no reset) attend across documents: the recipe's flags are what make it equal
    plain = megatron_from_recipe(out, tmp_path / "tok", tmp_path / "cache", n_steps, reset_attention_mask=False,
                                 reset_position_ids=False)
    assert any(not np.array_equal(~plain[k]["attention_mask"][0].numpy()[want["filled"][k]], want["allowed"][k][want["filled"][k]])
               for k in range(order.size))


def test_megatron_flags_are_the_recipe_config():
    """The Megatron-LM flags the docs give set exactly the recipe config's masking fields."""
    from test_export import recipe

    flags = recipe("megatron-lm-flags")
    config_text = recipe("megatron")
    for field in ("reset_attention_mask", "reset_position_ids", "eod_mask_loss"):
        assert f"--{field.replace('_', '-')}" in flags and f"{field}=True" in config_text


@pytest.mark.parametrize("variant", ["padding", "concat"])
def test_export_warns_where_eos_trainers_join_documents(tmp_path, variant):
    """Atoms of half a sequence put a document after padding (padding) or after a cut mid-text
    (concat): the export counts those sequences, and they are exactly the ones where Megatron's
    EOS-based mask differs from Strata's."""
    pytest.importorskip("megatron.core")
    stream, store, order = _packed(variant, atom_multiple=0.5)
    out = tmp_path / "meg"
    export_stream(stream, "megatron", out, global_batch=G)
    masking = json.loads((out / "meta.json").read_text())["document_masking"]
    assert not masking["eos_delimited"] and "join" in masking["warning"] and "not an EOS" in masking["warning"]
    train = megatron_from_recipe(out, tmp_path / "tok", tmp_path / "cache", order.size // G)
    want = _strata(store, order)
    differs = sum(
        not np.array_equal(~train[k]["attention_mask"][0].numpy()[want["filled"][k]], want["allowed"][k][want["filled"][k]])
        for k in range(order.size)
    )
    assert differs == masking["not_eos_delimited_sequences"] > 0
    # the hf export carries every boundary in seq_lengths: no warning there
    export_stream(stream, "hf", tmp_path / "hf", global_batch=G)
    assert json.loads((tmp_path / "hf" / "meta.json").read_text())["document_masking"]["warning"] is None


@pytest.mark.parametrize("variant", VARIANTS)
def test_olmo_core_recipe_document_lengths(tmp_path, variant):
    pytest.importorskip("olmo_core")
    stream, store, order = _packed(variant)
    out = tmp_path / "np"
    export_stream(stream, "numpy", out, global_batch=G)
    ns = run_recipe("olmo-core", DIR=str(out), VOCAB=VOCAB, G=G, WORK_DIR=str(tmp_path / "work"), R=1, RANK=0, W=0)
    dataset = ns["dataset"]
    pieces = sequence_pieces(stream.segments, L)
    want = _strata(store, order)
    for k in range(order.size):
        doc_lens = dataset[k]["doc_lens"].numpy()
        np.testing.assert_array_equal(doc_lens, pieces.of(order[k : k + 1])[1])
        doc = np.repeat(np.arange(doc_lens.size), doc_lens)
        allowed = (doc[:, None] == doc[None, :]) & np.tri(L, dtype=bool)
        filled = want["filled"][k]
        np.testing.assert_array_equal(allowed[filled], want["allowed"][k][filled])
    # the recipe's loader carries doc_lens and the label mask into every batch: OLMo-core's labels
    # are scored exactly where Strata's are
    from olmo_core.data.utils import get_labels

    for s, batch in enumerate(ns["loader"]):
        assert batch["doc_lens"].shape[0] == G and int(batch["doc_lens"].sum()) == G * L
        np.testing.assert_array_equal(batch["index"].numpy(), np.arange(s * G, (s + 1) * G))
        np.testing.assert_array_equal((get_labels(batch) != -100).numpy(), want["scored"][s * G : (s + 1) * G])
        unmasked = get_labels({k: v for k, v in batch.items() if k != "label_mask"})
        assert ((unmasked != -100).numpy() & ~want["scored"][s * G : (s + 1) * G]).any()  # what label_mask.bin removes


@pytest.mark.parametrize("variant", VARIANTS)
def test_hf_recipe_flattening_gives_strata_positions_and_loss(tmp_path, variant):
    datasets = pytest.importorskip("datasets")
    stream, store, order = _packed(variant)
    out = tmp_path / "hf"
    export_stream(stream, "hf", out, global_batch=G)
    model = build_model("tiny", VOCAB, L, 0, EOS, PAD, "dense").eval()  # Strata's own Llama, SDPA on CPU
    meta = json.loads((out / "meta.json").read_text())
    ns = run_recipe("hf", np=np, meta=meta, model=model, DIR=str(out), OUT=str(tmp_path / "run"), G=G, R=1, GRAD_ACCUM=1)
    assert isinstance(ns["ds"], datasets.Dataset)
    batches = list(ns["trainer"].get_train_dataloader())
    assert len(batches) == order.size // G
    for s in (0, len(batches) - 1):
        batch = {k: v.cpu() for k, v in batches[s].items()}
        want = _strata(store, order[s * G : (s + 1) * G])
        filled = want["filled"]
        np.testing.assert_array_equal(batch["input_ids"][0].numpy(), want["tokens"][filled])
        np.testing.assert_array_equal(batch["position_ids"][0].numpy(), want["pos"][filled])
        with torch.no_grad():
            hf_loss = float(model(**batch).loss)
            tok_loss, scored = token_losses(model, batch_tensors(store, order[s * G : (s + 1) * G], False, "cpu", "dense"))
            strata_loss = float((tok_loss * scored).sum() / scored.sum())
            assert int((batch["labels"][0, 1:] != -100).sum()) == int(scored.sum())
            assert abs(hf_loss - strata_loss) < LOSS_TOLERANCE
            # with a cache (Llama's default use_cache) the packed position_ids are ignored: cross-document attention
            model.config.use_cache = True
            crossed = float(model(**batch).loss)
            assert abs(crossed - strata_loss) > 10 * LOSS_TOLERANCE
            model.config.use_cache = False
