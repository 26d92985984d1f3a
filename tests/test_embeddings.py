"""Embeddings: tiny real HF models built from config here (never downloaded), plus the shipped MiniLM."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import StrataInputError
from pipeline.represent import embeddings as E

TEXTS = [
    "The cat sat on the mat.",
    "Dogs chase cats around the garden all day long.",
    "import numpy as np\nprint(np.arange(3))",
    "In the beginning was the word, and the word was with the model.",
    "Quantum chromodynamics describes the strong interaction between quarks and gluons.",
    "a",
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer.",
    "def f(x):\n    return x * 2  # doubles",
]


def _tokenizer(kind: str):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = TEXTS * 5
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]))
        from tokenizers.processors import TemplateProcessing

        tok.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
        return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Three tiny models whose input embeddings are stored under three different names."""
    import torch
    from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    out = {}
    wp, bpe = _tokenizer("wordpiece"), _tokenizer("bpe")
    specs = {
        "bert": (wp, lambda v: BertModel(BertConfig(vocab_size=v, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                    intermediate_size=32, max_position_embeddings=64))),
        "llama": (bpe, lambda v: LlamaForCausalLM(LlamaConfig(vocab_size=v, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                              num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                                                              tie_word_embeddings=False))),
        "gpt2": (bpe, lambda v: GPT2LMHeadModel(GPT2Config(vocab_size=v, n_embd=16, n_layer=1, n_head=2, n_positions=128))),
    }
    for name, (tok, build) in specs.items():
        d = tmp_path_factory.mktemp(name)
        model = build(len(tok))
        model.save_pretrained(d)
        tok.save_pretrained(d)
        out[name] = (d, model.get_input_embeddings().weight.detach().numpy().copy(), tok)
    return out


@pytest.mark.parametrize(
    "name,key",
    [("bert", "embeddings.word_embeddings.weight"), ("llama", "model.embed_tokens.weight"), ("gpt2", "transformer.wte.weight")],
)
def test_embedding_key_is_discovered(models, name, key):
    path, table, _ = models[name]
    found = E.find_embedding_tensor(path)
    assert found.key == key  # for llama an untied lm_head of the same shape exists and must lose
    assert found.shape == table.shape
    np.testing.assert_array_equal(E.load_embedding_matrix(path), table)


def _reference_shallow(table, tok, text, max_tokens):
    ids = tok(text, add_special_tokens=False)["input_ids"][:max_tokens]
    v = table[ids].mean(0)
    return v / np.linalg.norm(v)


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_shallow_is_normalized_mean_of_token_rows(models, name):
    path, table, tok = models[name]
    long_text = " ".join(TEXTS) * 20  # far beyond the character cap: exercises the prefix cut
    texts = TEXTS + [long_text]
    for max_tokens in (7, 0):
        emb = E.embed(texts, "shallow", str(path), max_tokens=max_tokens, progress=False)
        ref = np.stack([_reference_shallow(table, tok, t, max_tokens or 10**9) for t in texts])
        np.testing.assert_allclose(emb, ref, rtol=1e-5, atol=1e-6)


def test_tokenize_prefix_cut_equals_full_truncation(models):
    path, _, tok = models["bert"]
    backend, _ = E._fast_tokenizer(path)
    texts = [" ".join(TEXTS) * 30, "x" * 5000 + " tail", "word " * 2000]
    ids, offsets = E.tokenize(backend, texts, 40, add_special_tokens=True)
    for i, t in enumerate(texts):
        full = tok(t, add_special_tokens=True, truncation=True, max_length=40)["input_ids"]
        assert ids[offsets[i] : offsets[i + 1]].tolist() == full


def _plain_ids(backend, text: str, max_tokens: int) -> list[int]:
    ids = backend.encode(text, add_special_tokens=False).ids
    return ids[:max_tokens] if max_tokens > 0 else ids


def _awkward_texts() -> list[str]:
    from helpers import demo_slice

    docs = [d["text"] for d in demo_slice(400, stride=331)]
    long_prose = " ".join(docs)[:20000]
    return docs + [
        long_prose,  # cut by every character cap
        "x" * 6000 + " tail",  # one piece longer than every guess: the whole text is tokenized
        "é" * 3000 + " ünïcödé ÇÀFÉ",
        "a[SEP]b <|endoftext|> c",  # the separators' own text inside a document
        "   leading and trailing   ",
        "\n\n\ttabs\n",
        "one\r\n two\r\n\r\n three  \u00a0 four " * 300,  # mixed whitespace runs at the cuts
        "word " * 1000,
    ]


@pytest.mark.parametrize("which", ["minilm", "neox"])
@pytest.mark.parametrize("max_tokens", [256, 7, 0])
def test_grouped_tokenize_equals_one_document_at_a_time(which, max_tokens):
    """Joined-group tokenization with a special-token separator, the character-cap cascade and
    the thread pool must give exactly each whole document's tokens, truncated."""
    from helpers import DATA
    from tokenizers import Tokenizer

    if which == "minilm":
        backend = E._shallow_tokenizer(E._model_dir(""))
    else:
        path = DATA / "tokenizers" / "gpt-neox-olmo-dolma-v1_5.tokenizer.json"
        if not path.exists():
            pytest.skip("shared tokenizer missing")
        backend = Tokenizer.from_file(str(path))
    assert E._separator(backend) is not None
    texts = _awkward_texts()
    ids, offsets = E.tokenize(backend, texts, max_tokens, add_special_tokens=False)
    backend.no_truncation()
    for i, t in enumerate(texts):
        assert ids[offsets[i] : offsets[i + 1]].tolist() == _plain_ids(backend, t, max_tokens), (i, t[:60])


def test_metaspace_first_gets_no_separator_and_stays_exact():
    """A SentencePiece-style pre-tokenizer that marks only the first piece cannot be grouped."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tok.train_from_iterator(TEXTS * 5, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "</s>"]))
    assert E._separator(tok) is None
    ids, offsets = E.tokenize(tok, TEXTS, 0, add_special_tokens=False)
    assert [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(len(TEXTS))] == [_plain_ids(tok, t, 0) for t in TEXTS]


def test_shallow_tokenizer_matches_autotokenizer():
    from transformers import AutoTokenizer

    path = E._model_dir("")
    texts = _awkward_texts()[:50]
    ids, offsets = E.tokenize(E._shallow_tokenizer(path), texts, 0, add_special_tokens=False)
    auto = AutoTokenizer.from_pretrained(str(path))
    for i, t in enumerate(texts):
        assert ids[offsets[i] : offsets[i + 1]].tolist() == auto(t, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("method,name", [("deep", "llama"), ("deep", "bert"), ("sentence", "bert")])
def test_forward_equals_unbatched_reference(models, method, name):
    import torch
    from transformers import AutoModel

    path, _, tok = models[name]
    emb = E.embed(TEXTS, method, str(path), max_tokens=12, batch_size=2, progress=False)
    assert emb.dtype == np.float32 and emb.shape == (len(TEXTS), 16)
    assert np.isfinite(emb).all()
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    model = AutoModel.from_pretrained(str(path)).eval()
    with torch.inference_mode():
        for i, text in enumerate(TEXTS):  # one document at a time: no padding at all
            ids = torch.tensor([tok(text, truncation=True, max_length=12)["input_ids"]])
            v = model(input_ids=ids).last_hidden_state[0].mean(0)
            np.testing.assert_allclose(emb[i], (v / v.norm()).numpy(), rtol=1e-4, atol=1e-5)
    again = E.embed(TEXTS, method, str(path), max_tokens=12, batch_size=2, progress=False)
    np.testing.assert_array_equal(emb, again)


def test_deep_resumes_from_checkpoint(models, tmp_path, monkeypatch):
    path, _, _ = models["llama"]
    texts = TEXTS * 3
    reference = E.embed(texts, "deep", str(path), max_tokens=12, batch_size=1, progress=False)

    class Crash(RuntimeError):
        pass

    real_save = E._save_checkpoint

    def save_then_crash(p, emb, done):  # fault injection: the process dies right after a checkpoint
        real_save(p, emb, done)
        if done.sum() >= 6:
            raise Crash

    monkeypatch.setattr(E, "_CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(E, "_save_checkpoint", save_then_crash)
    with pytest.raises(Crash):
        E.embed(texts, "deep", str(path), max_tokens=12, batch_size=1, work_dir=tmp_path, progress=False)
    monkeypatch.undo()
    (ckpt,) = tmp_path.glob("embed-deep-*.npz")
    with np.load(ckpt) as z:
        emb, done = z["emb"].copy(), z["done"].copy()
    assert 0 < done.sum() < len(texts)
    emb[done] = -emb[done]  # mark finished rows: a resumed run must keep them, not recompute
    E._save_checkpoint(ckpt, emb, done)
    resumed = E.embed(texts, "deep", str(path), max_tokens=12, batch_size=1, work_dir=tmp_path, progress=False)
    np.testing.assert_allclose(resumed[done], -reference[done], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(resumed[~done], reference[~done], rtol=1e-5, atol=1e-6)
    assert not list(tmp_path.glob("*.npz"))  # a completed run removes its checkpoint


def test_sentence_default_matches_sentence_transformers():
    st = pytest.importorskip("sentence_transformers")
    emb = E.embed_texts(TEXTS, progress=False)
    ref = st.SentenceTransformer(E.default_model_path(), device="cpu").encode(TEXTS, normalize_embeddings=True)
    assert emb.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(emb, ref, atol=1e-5)


def test_bad_inputs(models, tmp_path):
    path, _, _ = models["bert"]
    with pytest.raises(StrataInputError, match="unknown embedding method"):
        E.embed(TEXTS, "bogus", str(path))
    with pytest.raises(StrataInputError, match="config.json"):
        E.embed(TEXTS, "shallow", str(tmp_path))
    with pytest.raises(StrataInputError, match="no tokens"):
        E.embed(["fine text", ""], "shallow", str(path), progress=False)
    with pytest.raises(StrataInputError, match="outside the embedding matrix"):
        E.embed_shallow_ids(np.ones((4, 3), np.float32), np.array([1, 9]), np.array([0, 2]))
