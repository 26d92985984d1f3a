"""Evaluation suite: DCLM aggregation vectors, llm-foundry scoring per task type, Paloma
aggregation and layout, WikiText splitting and real lm-eval runs against direct torch sums."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from evals import dclm
from evals.paloma import aggregate_bpb
from evals.run import evaluate
from pipeline.data import dclm_tasks
from pipeline.data.paloma import PalomaWriter, read_paloma_docs, write_paloma_layout
from pipeline.data.wikitext import read_articles, split_articles
from pipeline.errors import StrataInputError

SHARED = Path(os.environ.get("STRATA_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
DATA = SHARED / "data" / "eval"
DCLM = DATA / "dclm_core"
WIKI = DATA / "wikitext" / "wiki.test.raw"
LN2 = math.log(2)

needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared eval data not found at {DATA}")


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if WIKI.is_file():
        text = WIKI.read_text(encoding="utf-8")[:200_000]
    else:
        text = "the quick brown fox jumps over the lazy dog. " * 2000
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text[i:i + 2000] for i in range(0, len(text), 2000)], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def tiny_llama(vocab: int, max_pos: int = 128, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=max_pos)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_llama(len(tokenizer))


def seq_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1, one unpadded forward."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    return logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def cont_stats(model, ctx: list[int], cont: list[int]) -> tuple[float, bool]:
    """(mean continuation NLL, all-greedy) by a direct forward of ctx + cont."""
    ids = ctx + cont
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits[len(ctx) - 1:len(ids) - 1], dim=-1)
    target = torch.tensor(cont)
    nll = -logp.gather(1, target[:, None]).sum().item()
    return nll / len(cont), bool((logp.argmax(-1) == target).all())


# --------------------------------------------------------------------------- DCLM aggregation

@needs_data
@pytest.mark.parametrize("name", ["dolma_v1_1B_8.2Btok_heavy.json", "fineweb_edu_7B_138Btok_heavy.json"])
def test_core_reproduces_dclm_reference_exactly(name):
    ref = json.loads((DCLM / "reference_results" / name).read_text())
    acc = ref["eval_metrics"]["icl"]
    tasks = dclm_tasks.core_tasks(DCLM)
    assert len(tasks) == 22 and set(tasks) == set(dclm_tasks.CORE_TASKS)
    assert dclm.core_score(acc, dclm.read_meta(DCLM / "eval_meta_data.csv"), tasks) == ref["Core_v2"]
    assert dclm.core_score(acc, dclm.read_meta(DCLM / "eval_meta_data_v1.csv"), tasks) == ref["Core_v1"]


def test_centered_accuracy_and_missing_tasks():
    assert dclm.centered_accuracy(0.625, 25.0) == pytest.approx(0.5)
    assert dclm.centered_accuracy(0.25, 25.0) == 0.0
    assert dclm.centered_accuracy(0.3, 0.0) == pytest.approx(0.3)
    meta = [dclm.TaskMeta("a", "c", "mc", 0, 50.0), dclm.TaskMeta("b", "c", "lm", 0, 0.0)]
    assert dclm.core_score({"a": 0.75, "b": 0.1}, meta, ["a", "b"]) == pytest.approx((0.5 + 0.1) / 2)
    with pytest.raises(StrataInputError, match="missing"):
        dclm.core_score({"a": 0.75}, meta, ["a", "b"])


@needs_data
def test_task_table_matches_csv():
    meta = {m.name: m for m in dclm.read_meta(DCLM / "eval_meta_data.csv")}
    for task in dclm_tasks.CORE_TASKS:
        assert meta[task].task_type in ("mc", "schema", "lm"), task
        assert dclm_tasks.task_file(DCLM, task).is_file()
    assert (meta["jeopardy"].shots, meta["copa"].shots, meta["agi_eval_lsat_ar"].shots) == (10, 0, 3)
    assert meta["commonsense_qa"].random_baseline == 40.3


def test_fewshot_sampler():
    idx = dclm.fewshot_indices(50, 10)
    assert idx == dclm.fewshot_indices(50, 10)  # deterministic
    for i, shots in enumerate(idx):
        assert len(shots) == 10 and len(set(shots)) == 10 and i not in shots
    assert all(sorted(s) == [j for j in range(4) if j != i] for i, s in enumerate(dclm.fewshot_indices(4, 10)))
    assert dclm.fewshot_indices(5, 0) == [[]] * 5


# --------------------------------------------------------------------------- DCLM scoring per task type

def _fixture(name: str) -> list[dict]:
    return [dclm.strip_row(r) for r in dclm_tasks.read_jsonl(DCLM / "fixtures_small" / name)]


def _enc(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


@needs_data
@pytest.mark.parametrize("name,delim", [("hellaswag_small.jsonl", " "), ("piqa_small.jsonl", "\nAnswer: ")])
def test_multiple_choice_zero_shot(model, tokenizer, name, delim):
    rows = _fixture(name)
    res = dclm.evaluate_task(model, tokenizer, rows, task=name, task_type="mc", shots=0, delimiter=delim,
                             max_len=128, device="cpu")
    for i, row in enumerate(rows):
        ctx = _enc(tokenizer, (row["query"] + delim).rstrip())  # llm-foundry: context right-stripped
        means = []
        for choice in row["choices"]:
            text = choice if choice.startswith(" ") else " " + choice  # prefix space (" a" is one token)
            means.append(cont_stats(model, ctx, _enc(tokenizer, text))[0])
        expected = int(min(range(len(means)), key=lambda k: (means[k], k)))
        assert res.correct[i] == (expected == row["gold"]), (name, i, means)
    assert res.n == 4 and res.accuracy == sum(res.correct) / 4
    gold_nll = sum(cont_stats(model, _enc(tokenizer, (r["query"] + delim).rstrip()),
                              _enc(tokenizer, " " + r["choices"][r["gold"]].lstrip()))[0]
                   * len(_enc(tokenizer, " " + r["choices"][r["gold"]].lstrip())) for r in rows)
    gold_bytes = sum(len((" " + r["choices"][r["gold"]].lstrip()).encode()) for r in rows)
    assert res.gold_bpb == pytest.approx(gold_nll / LN2 / gold_bytes, rel=1e-4)


@needs_data
def test_multiple_choice_few_shot_prompt(tokenizer):
    rows = _fixture("piqa_small.jsonl")
    shots = dclm.fewshot_indices(len(rows), 2)
    builder = dclm.PromptBuilder(tokenizer, "mc", "\nAnswer: ", max_len=4096)
    reqs, gold = builder.requests(rows, 0, shots[0])
    a, b = (rows[j] for j in shots[0])
    fewshot = f"{a['query']}\nAnswer: {a['choices'][a['gold']]}\n{b['query']}\nAnswer: {b['choices'][b['gold']]}"
    ctx = _enc(tokenizer, fewshot) + _enc(tokenizer, f"\n{rows[0]['query']}\nAnswer:")
    assert gold == rows[0]["gold"] and len(reqs) == 2
    assert [r.context for r in reqs] == [ctx, ctx]
    assert [r.continuation for r in reqs] == [_enc(tokenizer, " " + c) for c in rows[0]["choices"]]
    short = dclm.PromptBuilder(tokenizer, "mc", "\nAnswer: ", max_len=20).requests(rows, 0, shots[0])[0]
    assert all(len(r.context) + len(r.continuation) == 20 and r.context == ctx[-len(r.context):] for r in short)


@needs_data
def test_schema_zero_shot(model, tokenizer):
    rows = _fixture("winograd_small.jsonl")
    res = dclm.evaluate_task(model, tokenizer, rows, task="winograd", task_type="schema", shots=0, delimiter=" ",
                             max_len=128, device="cpu")
    for i, row in enumerate(rows):
        cont = _enc(tokenizer, " " + row["continuation"])
        means = [cont_stats(model, _enc(tokenizer, opt), cont)[0] for opt in row["context_options"]]
        expected = 0 if means[0] <= means[1] else 1
        assert res.correct[i] == (expected == row["gold"])


@needs_data
def test_language_modeling_greedy_exact_match(tokenizer):
    """Memorize rows 0 and 2 of the lambada fixture: exactly those become greedy-correct.

    max_len=48 also exercises llm-foundry's left-truncation of the context."""
    rows = _fixture("lambada_small.jsonl")
    max_len = 48

    def pair(r):
        cont = _enc(tokenizer, " " + r["continuation"])
        return _enc(tokenizer, r["context"])[-(max_len - len(cont)):], cont

    m = tiny_llama(len(tokenizer), max_pos=max_len, seed=1)
    seqs = [sum(pair(rows[i]), []) for i in (0, 2)]
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    m.train()
    for _ in range(80):
        loss = m(input_ids=torch.tensor(seqs), labels=torch.tensor(seqs)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    expected = [cont_stats(m, *pair(r))[1] for r in rows]
    assert expected[0] and expected[2] and not expected[1]
    res = dclm.evaluate_task(m, tokenizer, rows, task="lambada", task_type="lm", shots=0, delimiter=" ",
                             max_len=max_len, device="cpu")
    assert list(res.correct) == expected
    assert res.accuracy == sum(expected) / 4


@needs_data
def test_run_core_limits_and_reports_core(model, tokenizer):
    rows = dclm.run_core(model, tokenizer, DCLM, device="cpu", max_len=128, limit=2,
                         tasks=["copa", "winograd", "lambada_openai"])
    accs = {r["task"]: r for r in rows if r["metric"] == "acc"}
    assert set(accs) == {"copa", "winograd", "lambada_openai"} and all(r["n"] == 2 for r in accs.values())
    assert all(math.isfinite(r["value"]) for r in rows)
    assert not any(r["task"] == "core" for r in rows)  # Core needs all 22 tasks
    with pytest.raises(StrataInputError, match="unknown DCLM task"):
        dclm.run_core(model, tokenizer, DCLM, device="cpu", max_len=128, limit=1, tasks=["mmlu"])


# --------------------------------------------------------------------------- Paloma

def test_paloma_aggregation_hand_computed():
    per_doc = pl.DataFrame({
        "source": ["A", "A", "A", "B"], "subdomain": ["a1", "a1", "a2", "b1"],
        "loglikelihood": [-10.0, -30.0, -5.0, -8.0], "n_bytes": [10, 20, 5, 4],
    })
    got = {(r["task"]): r["value"] for r in aggregate_bpb(per_doc, "heldout")}
    a1, a2, b1 = 40 / 30 / LN2, 1 / LN2, 2 / LN2
    assert got["A/a1"] == pytest.approx(a1) and got["A/a2"] == pytest.approx(a2) and got["B/b1"] == pytest.approx(b1)
    assert got["A"] == pytest.approx((a1 + a2) / 2) and got["B"] == pytest.approx(b1)
    assert got["mean"] == pytest.approx(((a1 + a2) / 2 + b1) / 2)


def test_write_paloma_layout_roundtrip(tmp_path):
    docs = pl.DataFrame({"text": ["alpha beta", "gamma", "delta epsilon", "zeta"], "id": [1, 2, 3, 4],
                         "source": ["web", "code/py", "web", "web"], "subdomain": ["x", "lib", "y", "x"]})
    files = write_paloma_layout(docs, tmp_path / "a")
    again = write_paloma_layout(docs, tmp_path / "b")
    assert [f.relative_to(tmp_path / "a") for f in files] == [f.relative_to(tmp_path / "b") for f in again]
    assert all(f.read_bytes() == g.read_bytes() for f, g in zip(files, again))
    assert {str(f.relative_to(tmp_path / "a").parent) for f in files} == {"code_py/val", "web/val"}
    back = read_paloma_docs(tmp_path / "a")
    assert back.sort("id").select("text", "subdomain").to_dicts() == docs.sort("id").select("text", "subdomain").to_dicts()
    assert read_paloma_docs(tmp_path / "a", docs_per_subdomain=1).height == 3
    with pytest.raises(StrataInputError, match="lack columns"):
        write_paloma_layout(docs.drop("source"), tmp_path / "c")
    with pytest.raises(StrataInputError, match="not found"):
        read_paloma_docs(tmp_path / "missing")


def test_paloma_writer_streams_the_same_bytes(tmp_path, monkeypatch):
    import pipeline.data.paloma

    monkeypatch.setattr(pipeline.data.paloma, "WRITE_ROWS", 50)  # JSON lines compressed in pieces of at most 50
    rng = np.random.default_rng(3)
    n = 700
    docs = pl.DataFrame({"text": [f"doc {i} " + "word " * int(rng.integers(0, 60)) + "\u00e9\n\"q\"" for i in range(n)],
                         "id": [f"d{i}" for i in range(n)], "source": rng.choice(["web", "code/py", "books"], n).tolist(),
                         "subdomain": rng.choice(["a", "b", None], n).tolist()})
    whole = write_paloma_layout(docs, tmp_path / "whole", docs_per_shard=90)
    with PalomaWriter(tmp_path / "stream", docs_per_shard=90) as writer:  # sources interleaved, batches of 1 to 120 rows
        at = 0
        while at < n:
            step = int(rng.integers(1, 121))
            writer.add(docs.slice(at, step))
            at += step
    assert writer.n_docs == n and len(whole) == len(writer.files) > 3
    assert [f.relative_to(tmp_path / "whole") for f in whole] == [f.relative_to(tmp_path / "stream") for f in writer.files]
    assert all(f.read_bytes() == g.read_bytes() for f, g in zip(whole, writer.files))
    assert not list((tmp_path / "stream").rglob("*.part"))
    back = read_paloma_docs(tmp_path / "stream")
    assert sorted(back["id"].to_list()) == sorted(docs["id"].to_list())
    with pytest.raises(StrataInputError, match="both map to the directory"):
        with PalomaWriter(tmp_path / "clash") as writer:
            writer.add(docs.slice(0, 3).with_columns(source=pl.Series(["a/b", "a b", "a/b"])))
    assert not [p for p in (tmp_path / "clash").rglob("*") if p.is_file()]  # an error leaves no file behind


@needs_data
def test_reads_real_paloma_fixture():
    df = read_paloma_docs(DATA / "paloma_fixture")
    assert df.height == 10 and df["source"].unique().to_list() == ["c4_100_domains"]
    assert df["subdomain"].n_unique() >= 1 and df["text"].str.len_chars().min() > 0


# --------------------------------------------------------------------------- WikiText

def test_split_articles_on_top_level_titles():
    text = " \n = Alpha = \n \n body one \n = = Sec = = \n more \n \n = Beta = \n body two \n"
    pages = split_articles(text)
    assert len(pages) == 2
    assert pages[0].startswith(" = Alpha = ") and " = = Sec = = " in pages[0]
    assert pages[1].startswith(" = Beta = ") and pages[1].endswith("body two \n")


@needs_data
def test_wikitext_raw_test_has_62_articles():
    pages = read_articles(WIKI)
    assert len(pages) == 62
    assert pages[0].startswith(" = Robert Boulter = ")
    assert "\n".join(pages) == WIKI.read_text(encoding="utf-8").split("\n", 1)[1]


def rolling_loglik(model, ids: list[int], prefix: int, max_len: int) -> float:
    """lm-eval's rolling windows (context_len=1): first window from [prefix], later windows
    predict the next max_len tokens; the last one keeps a full max_len-token context."""
    total, predicted, n = 0.0, 0, len(ids)
    first = min(max_len, n)
    total += seq_logprobs(model, [prefix] + ids[:first]).sum().item()
    predicted = first
    while predicted < n:
        k = min(n - predicted, max_len)
        end = predicted + k
        window = ids[end - max_len - 1:end]
        total += seq_logprobs(model, window)[-k:].sum().item()
        predicted = end
    return total


@needs_data
def test_evaluate_wikitext_and_heldout_match_direct_torch(model, tokenizer, tmp_path):
    from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer

    held = pl.DataFrame({"text": ["The cat sat on the mat.", "A dog ran in the park today.", "def f(x):\n    return x"],
                         "id": ["a", "b", "c"], "source": ["prose", "prose", "code"], "subdomain": ["s1", "s2", "py"]})
    write_paloma_layout(held, tmp_path / "heldout")
    short = sorted(read_articles(WIKI), key=len)[:3]  # three short real articles keep the run cheap
    raw = tmp_path / "wiki.raw"
    raw.write_text(" \n" + "\n".join(short), encoding="utf-8")
    rows = evaluate(model, tokenizer, {"heldout": tmp_path / "heldout", "wikitext": raw}, limit=2, device="cpu",
                    work_dir=tmp_path / "work")
    got = {(r["suite"], r["task"], r["metric"]): r for r in rows}
    assert all(set(r) == {"suite", "task", "metric", "value", "n"} and math.isfinite(r["value"]) for r in rows)

    eos = tokenizer.eos_token_id
    pages = read_articles(raw)[:2]
    assert pages == short[:2]
    ll = sum(rolling_loglik(model, _enc(tokenizer, wikitext_detokenizer({"page": p})), eos, 128) for p in pages)
    n_bytes = sum(len(p.encode("utf-8")) for p in pages)
    bpb = got[("wikitext", "wikitext", "bits_per_byte")]
    assert bpb["n"] == 2 and bpb["value"] == pytest.approx(-ll / LN2 / n_bytes, rel=1e-4)
    assert got[("wikitext", "wikitext", "byte_perplexity")]["value"] == pytest.approx(2 ** bpb["value"], rel=1e-6)

    def doc_bpb(text: str) -> float:
        return -rolling_loglik(model, _enc(tokenizer, text), eos, 128) / LN2 / len(text.encode())

    s1, s2, py = (doc_bpb(t) for t in held["text"])
    assert got[("heldout", "prose/s1", "bits_per_byte")]["value"] == pytest.approx(s1, rel=1e-4)
    assert got[("heldout", "prose", "bits_per_byte")]["value"] == pytest.approx((s1 + s2) / 2, rel=1e-4)
    assert got[("heldout", "mean", "bits_per_byte")]["value"] == pytest.approx(((s1 + s2) / 2 + py) / 2, rel=1e-4)


def test_evaluation_outside_a_git_checkout_runs_no_git(model, tokenizer, tmp_path, monkeypatch, capfd):
    """lm-eval's run record calls `git describe` in the working directory; Strata does not ask for it."""
    held = pl.DataFrame({"text": ["The cat sat on the mat.", "def f(x):\n    return x"], "id": ["a", "c"],
                         "source": ["prose", "code"]})
    write_paloma_layout(held, tmp_path / "heldout")
    monkeypatch.chdir(tmp_path)  # not inside any git repository
    rows = evaluate(model, tokenizer, {"heldout": tmp_path / "heldout"}, limit=2, device="cpu", work_dir=tmp_path / "work")
    assert rows and all(math.isfinite(r["value"]) for r in rows)
    out, err = capfd.readouterr()
    assert "not a git repository" not in out + err


@needs_data
def test_evaluation_never_reaches_past_the_trained_positions(tokenizer, tmp_path):
    """A Strata model trained at seq_len L: rolling windows (held-out, WikiText) and few-shot DCLM
    prompts never feed it more than L positions (RoPE is only scored where it trained)."""
    from pipeline.training.model import build_model

    L = 96
    model = build_model("tiny", len(tokenizer), L, 0, tokenizer.eos_token_id, tokenizer.eos_token_id).eval()
    assert model.config.max_position_embeddings == L
    widths: list[int] = []
    model.model.register_forward_pre_hook(lambda mod, args, kwargs: widths.append(
        (kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]).shape[-1]), with_kwargs=True)
    long_text = "the quick brown fox jumps over the lazy dog. " * 60
    held = pl.DataFrame({"text": [long_text, "a short one."], "id": ["a", "b"], "source": ["prose", "prose"], "subdomain": ["s", "s"]})
    write_paloma_layout(held, tmp_path / "heldout")
    raw = tmp_path / "wiki.raw"
    raw.write_text(" \n" + sorted(read_articles(WIKI), key=len)[5], encoding="utf-8")
    units: list[dict] = []
    rows = evaluate(model, tokenizer, {"heldout": tmp_path / "heldout", "wikitext": raw, "dclm": DCLM}, limit=2, device="cpu",
                    work_dir=tmp_path / "work", units=units, options={"dclm_limit": 1})
    assert {r["suite"] for r in rows} == {"heldout", "wikitext", "dclm"}
    assert widths and max(widths) <= L
    assert len(_enc(tokenizer, long_text)) > 2 * L and max(widths) == L  # long documents do fill the window
    assert sorted(u["unit"] for u in units) == ["prose/a", "prose/b"]
    assert all(u["metric"] == "heldout/all/doc_bits_per_byte" and u["value"] > 0 for u in units)
