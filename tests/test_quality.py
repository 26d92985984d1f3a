"""Quality scores (pipeline/quality/): each scorer on a tiny model built here, the filter's
accounting, the quality family and the bad inputs (exit 2 naming the path or the document)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from helpers import DATA, demo_domains

from pipeline.config import QualityConfig
from pipeline.errors import StrataInputError
from pipeline.quality import scorers
from pipeline.quality.filter import removed_mask
from pipeline.quality.scorers.fasttext_trained import auc
from pipeline.quality.shards import finite


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """Positives (Python documentation) and negatives (fortunes) of the demo corpus, 60 each, as JSONL
    and plain text files, and 20 unseen documents of each class."""
    docs = demo_domains(("technical_docs", "quotes_humor"), 80)
    pos = [d["text"] for d in docs if d["domain"] == "technical_docs"]
    neg = [d["text"] for d in docs if d["domain"] == "quotes_humor"]
    root = tmp_path_factory.mktemp("labels")
    (root / "pos.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in pos[:60]) + "\n")
    (root / "neg.txt").write_text("\n".join(t.replace("\n", " ") for t in neg[:60]) + "\n")
    return root, pos[60:], neg[60:]


def test_auc_is_the_mann_whitney_statistic():
    assert auc(np.array([0.9, 0.8]), np.array([0.1, 0.2])) == 1.0
    assert auc(np.array([0.1]), np.array([0.9])) == 0.0
    assert auc(np.array([0.5, 0.9]), np.array([0.5, 0.1])) == pytest.approx((0.5 + 1 + 1 + 1) / 4)  # the tie counts half


def test_trained_fasttext_separates_the_classes_and_is_trained_once(labelled, tmp_path):
    root, pos, neg = labelled
    cfg = QualityConfig(scorer="fasttext_trained", positives=str(root / "pos.jsonl"), negatives=str(root / "neg.txt"), epochs=10,
                        lr=0.05)
    spec = scorers.spec("fasttext_trained")
    prepared = spec.prepare(cfg, tmp_path / "models")
    assert prepared.facts["trained_positives"] == 54 and prepared.facts["heldout_negatives"] == 6
    assert prepared.facts["heldout_auc"] >= 0.9, prepared.facts
    model = tmp_path / "models" / f"{prepared.key}.bin"
    stamp = model.stat().st_mtime_ns
    again = spec.prepare(cfg, tmp_path / "models")
    assert again.key == prepared.key and model.stat().st_mtime_ns == stamp  # not trained again
    s_pos = spec.score(prepared.model, prepared.options, pos)
    s_neg = spec.score(prepared.model, prepared.options, neg)
    assert auc(s_pos, s_neg) >= 0.9 and ((0 <= s_pos) & (s_pos <= 1.0001)).all()
    retrained = spec.prepare(cfg.model_copy(update={"seed": 0}), tmp_path / "other")  # same inputs, another folder
    assert (tmp_path / "other" / f"{retrained.key}.bin").read_bytes() == model.read_bytes()  # byte-identical training
    small = spec.prepare(cfg.model_copy(update={"bucket": 4096}), tmp_path / "models")  # fewer bigram buckets: another model
    assert small.key != prepared.key and Path(small.model).stat().st_size < model.stat().st_size / 50
    assert small.facts["heldout_auc"] >= 0.9, small.facts
    # trained inside this process after others, the wheel stopped with "Encountered NaN." on most runs of this config
    for again in range(3):
        same = spec.prepare(cfg.model_copy(update={"bucket": 4096}), tmp_path / f"again{again}")
        assert Path(same.model).read_bytes() == Path(small.model).read_bytes()


def test_fasttext_file_scores_the_positive_label(labelled, tmp_path):
    import fasttext

    root, pos, neg = labelled
    positives = [json.loads(line)["text"] for line in (root / "pos.jsonl").read_text().splitlines()]
    lines = [f"__label__good {t.replace(chr(10), ' ')}" for t in positives]
    lines += [f"__label__bad {t}" for t in (root / "neg.txt").read_text().splitlines()]
    np.random.default_rng(0).shuffle(lines)
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n")
    model = fasttext.train_supervised(str(tmp_path / "train.txt"), epoch=10, wordNgrams=2, thread=1, seed=0, verbose=0, dim=32)
    model.save_model(str(tmp_path / "m.bin"))
    spec = scorers.spec("fasttext")
    with pytest.raises(StrataInputError, match=r"no label '__label__hq' \(its labels"):
        spec.prepare(QualityConfig(path=str(tmp_path / "m.bin")), tmp_path)
    prepared = spec.prepare(QualityConfig(path=str(tmp_path / "m.bin"), label="__label__good"), tmp_path)
    got = spec.score(prepared.model, prepared.options, pos[:5] + neg[:5])
    labels, probs = model.predict([t.replace("\n", " ") for t in pos[:5] + neg[:5]], k=-1)
    want = [p[list(ls).index("__label__good")] for ls, p in zip(labels, probs)]
    np.testing.assert_allclose(got, want)
    assert got[:5].mean() > got[5:].mean()
    other = spec.prepare(QualityConfig(path=str(tmp_path / "m.bin"), label="__label__bad"), tmp_path)
    assert other.key != prepared.key  # the label is part of the fingerprint


def _tiny_classifier(path, num_labels: int, head: bool = True):
    """A 2-layer BERT with a GPT-NeoX tokenizer (shared data), random weights, saved with its tokenizer."""
    import torch
    import transformers

    tok_file = next(iter(sorted((DATA / "tokenizers").glob("*tokenizer.json"))), None)
    if tok_file is None:
        pytest.skip("no tokenizer.json under the shared data")
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok_file))
    tok.pad_token = tok.pad_token or tok.eos_token or "<|endoftext|>"
    config = transformers.BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=128, num_labels=num_labels,
                                     id2label={i: f"class{i}" for i in range(num_labels)},
                                     label2id={f"class{i}": i for i in range(num_labels)})
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config) if head else transformers.BertModel(config)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model.eval(), tok


def test_hf_classifier_regression_and_label_probability(labelled, tmp_path):
    import torch

    _, pos, neg = labelled
    texts = pos[:3] + neg[:4]
    spec = scorers.spec("hf_classifier")
    model, tok = _tiny_classifier(tmp_path / "reg", 1)
    prepared = spec.prepare(QualityConfig(scorer="hf_classifier", path=str(tmp_path / "reg"), max_tokens=48, batch_size=3), tmp_path)
    got = spec.score(prepared.model, prepared.options, texts)
    with torch.inference_mode():
        want = [float(model(**tok(t, truncation=True, max_length=48, return_tensors="pt")).logits[0, 0]) for t in texts]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)  # batched with padding = one at a time
    model3, tok3 = _tiny_classifier(tmp_path / "cls", 3)
    prepared = spec.prepare(QualityConfig(scorer="hf_classifier", path=str(tmp_path / "cls"), label="class1"), tmp_path)
    got = spec.score(prepared.model, prepared.options, texts[:2])
    with torch.inference_mode():
        want = [float(torch.softmax(model3(**tok3(t, return_tensors="pt", truncation=True, max_length=128)).logits, -1)[0, 1])
                for t in texts[:2]]
    np.testing.assert_allclose(got, want, rtol=1e-4)  # the model's 128 positions bound quality.max_tokens (512)


def test_bad_models_and_labels_files_exit_2_naming_the_path(labelled, tmp_path):
    root, _, _ = labelled
    (tmp_path / "notft.bin").write_bytes(b"this is not a fastText model\n" * 10)
    with pytest.raises(StrataInputError, match=r"notft\.bin: not a fastText model file"):
        scorers.spec("fasttext").prepare(QualityConfig(path=str(tmp_path / "notft.bin")), tmp_path)
    with pytest.raises(StrataInputError, match=r"quality\.path names no fasttext model"):
        scorers.spec("fasttext").prepare(QualityConfig(path=str(tmp_path / "missing.bin")), tmp_path)
    _tiny_classifier(tmp_path / "base", 1, head=False)
    with pytest.raises(StrataInputError, match=r"base: .*no trained classification head|base: cannot load"):
        scorers.spec("hf_classifier").prepare(QualityConfig(scorer="hf_classifier", path=str(tmp_path / "base")), tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(StrataInputError, match=r"empty: no config\.json"):
        scorers.spec("hf_classifier").prepare(QualityConfig(scorer="hf_classifier", path=str(tmp_path / "empty")), tmp_path)
    trained = scorers.spec("fasttext_trained")
    with pytest.raises(StrataInputError, match=r"nope\.jsonl: the negatives file is missing"):
        trained.prepare(QualityConfig(positives=str(root / "pos.jsonl"), negatives=str(tmp_path / "nope.jsonl")), tmp_path)
    (tmp_path / "blank.txt").write_text("\n \n")
    with pytest.raises(StrataInputError, match=r"blank\.txt: the positives file holds no document: a classifier needs both"):
        trained.prepare(QualityConfig(positives=str(tmp_path / "blank.txt"), negatives=str(root / "neg.txt")), tmp_path)


def test_a_nan_score_names_the_document(tmp_path):
    from pipeline.config import CorpusConfig
    from pipeline.data.corpus import build_corpus
    from pipeline.data.shard_docs import manifest_shards

    pl.DataFrame({"id": ["a", "b", "c"], "text": ["one doc", "two doc", "three doc"]}).write_parquet(tmp_path / "c.parquet")
    build = build_corpus(CorpusConfig(path=str(tmp_path / "c.parquet")), 0, 0.0, tmp_path / "shards", tmp_path / "corpus.parquet")
    (_, shard), = manifest_shards(build.manifest, tmp_path / "shards")
    assert finite(np.array([0.1, 0.2, 0.3]), shard, "x").size == 3
    with pytest.raises(StrataInputError, match=r"returned nan for the document 'b' \(training row 1; 1 documents"):
        finite(np.array([0.1, np.nan, 0.3]), shard, "x")


def test_the_filter_removes_by_threshold_and_by_kept_token_share():
    scores, tokens = np.array([0.9, 0.1, 0.5, 0.5, 0.7]), np.array([10, 10, 30, 10, 40])
    assert removed_mask(scores, tokens, None, 1.0).tolist() == [False] * 5
    assert removed_mask(scores, tokens, 0.5, 1.0).tolist() == [False, True, False, False, False]
    # best first: 0.9 (10), 0.7 (40) hold 50 of 100 tokens; the next (0.5, doc 2) crosses 50%: kept only below the share
    assert removed_mask(scores, tokens, None, 0.5).tolist() == [False, True, True, True, False]
    assert removed_mask(scores, tokens, None, 0.55).tolist() == [False, True, False, True, False]
    assert removed_mask(scores, tokens, 0.8, 0.55).tolist() == [False, True, True, True, True]  # either rule removes


def test_quality_bins_are_token_quartiles():
    from pipeline.ordering.families import spec_of
    from pipeline.ordering.families.quality_bin import token_quantile_bins

    assert token_quantile_bins(np.array([0.4, 0.1, 0.3, 0.2]), np.ones(4), 4).tolist() == [3, 0, 2, 1]
    # a document's bin is that of its middle token: 25, 55, 70 and 90 of the 100 tokens
    assert token_quantile_bins(np.array([0.1, 0.5, 0.6, 0.9]), np.array([50, 10, 20, 20]), 4).tolist() == [1, 2, 2, 3]
    fam = spec_of("quality_bin")
    docs = pl.DataFrame({"quality": [0.4, 0.1, 0.3, 0.2], "n_tokens": [1, 1, 1, 1]})
    assert fam.column == "quality" and fam.codes(docs).tolist() == [3, 0, 2, 1]


def _random_characters(n: int, length: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    alphabet = np.array(list("abcdefghijklmnopqrstuvwxyzQXZJK0123456789{}#%&  "))
    return ["".join(rng.choice(alphabet, length)) for _ in range(n)]


@pytest.fixture(scope="module")
def reference(labelled, tmp_path_factory):
    """A perplexity scorer's reference model trained on 60 Python documentation pages (seconds on a CPU)."""
    root, _, _ = labelled
    cfg = QualityConfig(scorer="perplexity", target=str(root / "pos.jsonl"), max_tokens=64, batch_size=4, ref_steps=150, ref_vocab=512)
    models = tmp_path_factory.mktemp("reference")
    return cfg, models, scorers.spec("perplexity").prepare(cfg, models)


def test_perplexity_prefers_text_like_the_target(labelled, reference):
    import math

    _, pos, neg = labelled
    cfg, _, prepared = reference
    spec = scorers.spec("perplexity")
    assert prepared.facts["target_documents"] == 60 and prepared.facts["reference_vocab"] <= 512
    s_pos = spec.score(prepared.model, prepared.options, pos)
    s_rand = spec.score(prepared.model, prepared.options, _random_characters(20, 400, 0))
    assert np.isfinite(s_pos).all() and (s_pos < 0).all()  # minus a mean loss in nats: never above 0
    # a few unseen pages are tables or markup the 60 target pages hardly show; most beat every random string
    assert auc(s_pos, s_rand) >= 0.9 and np.median(s_pos) > s_rand.max(), (s_pos, s_rand)
    assert math.exp(-np.median(s_pos)) < math.exp(-np.median(s_rand)) / 2  # perplexity = exp(-score): under half
    assert auc(s_pos, spec.score(prepared.model, prepared.options, neg)) > 0.65  # English fortunes: nearer, still below


def test_perplexity_is_the_model_loss_and_batching_does_not_change_it(labelled, reference):
    import torch
    import transformers

    from pipeline.data.tokenizer import load_tokenizer

    _, pos, neg = labelled
    _, _, prepared = reference
    spec = scorers.spec("perplexity")
    texts = [pos[0], "", neg[0][:30], pos[1]]
    got = spec.score(prepared.model, prepared.options, texts)
    assert np.isnan(got[1]) and np.isfinite(got[[0, 2, 3]]).all()  # an empty text has no perplexity
    model = transformers.AutoModelForCausalLM.from_pretrained(prepared.model, local_files_only=True).eval()
    tok = load_tokenizer(prepared.model)
    for text, score in zip([texts[0], texts[2], texts[3]], got[[0, 2, 3]]):
        ids = (tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])[:64]
        with torch.no_grad():
            loss = float(model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss)  # mean next-token nats
        assert score == pytest.approx(-loss, rel=1e-4, abs=1e-4)
    one_by_one = [spec.score(prepared.model, prepared.options, [t])[0] for t in (texts[0], texts[3])]
    np.testing.assert_allclose(one_by_one, got[[0, 3]], rtol=1e-4)
    by_name = scorers.score_unit("perplexity", prepared.model, json.dumps(prepared.options), texts)  # the stage's worker function
    np.testing.assert_array_equal(by_name, got)


def test_perplexity_trains_once_and_refuses_a_bad_target(labelled, reference, tmp_path):
    root, _, _ = labelled
    cfg, models, prepared = reference
    spec = scorers.spec("perplexity")
    weights = next(Path(prepared.model).glob("*.safetensors"))
    stamp = weights.stat().st_mtime_ns
    again = spec.prepare(cfg, models)
    assert again.key == prepared.key and weights.stat().st_mtime_ns == stamp  # not trained again
    assert spec.prepare(cfg.model_copy(update={"batch_size": 8}), models).key != prepared.key  # options in the fingerprint
    with pytest.raises(StrataInputError, match=r"nope\.txt: the target file is missing"):
        spec.prepare(cfg.model_copy(update={"target": str(tmp_path / "nope.txt")}), tmp_path)
    (tmp_path / "blank.txt").write_text("\n\n")
    with pytest.raises(StrataInputError, match=r"blank\.txt: the target file holds no document: the reference model needs text"):
        spec.prepare(cfg.model_copy(update={"target": str(tmp_path / "blank.txt")}), tmp_path)
    (tmp_path / "short.txt").write_text("a few words\n")
    with pytest.raises(StrataInputError, match=r"the target file \(quality\.target\) holds \d+ tokens, less than one sequence of 64"):
        spec.prepare(cfg.model_copy(update={"target": str(tmp_path / "short.txt")}), tmp_path / "m")


def test_builtin_labels_are_the_corpus_docs_against_documents_beyond_it(tmp_path):
    """The demo's (and the ablation's) labels: positives the ``docs`` documents of the corpus (the first
    ``builtin_max_docs`` built-in documents), negatives a seeded sample of documents beyond them."""
    from pipeline.config import StrataConfig
    from pipeline.data.builtin_corpus import builtin_documents
    from pipeline.quality.builtin_labels import CORPUS_DOCS, builtin_labels, jsonl, write_builtin_labels

    assert CORPUS_DOCS == StrataConfig().corpus.builtin_max_docs  # the demo's corpus is the ablation's
    n = 240
    labels, docs = builtin_labels(n, 50), builtin_documents(2 * n)
    corpus = {d[0] for d in docs[:n]}
    assert labels.positives == [d for d in docs[:n] if d[2] == "docs"] and labels.positives
    assert len(labels.negatives) == 50 and {d[0] for d in labels.negatives} <= {d[0] for d in docs[n:]}
    assert not {d[0] for d in labels.negatives} & corpus
    assert builtin_labels(n, 50) == labels  # seeded
    pos, neg, _ = write_builtin_labels(tmp_path, n, 50)
    assert pos.read_text(encoding="utf-8") == jsonl(labels.positives) and neg.read_text(encoding="utf-8") == jsonl(labels.negatives)
    stamps = [p.stat().st_mtime_ns for p in (pos, neg)]
    write_builtin_labels(tmp_path, n, 50)  # unchanged bytes are not rewritten: the trained model stays fresh
    assert [p.stat().st_mtime_ns for p in (pos, neg)] == stamps
    assert json.loads(pos.read_text(encoding="utf-8").splitlines()[0])["text"] == labels.positives[0][1]
