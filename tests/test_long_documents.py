"""A very long document (issue 49): tokenized and trained on in pieces cut before whitespace, with
the ids and merges of the whole text, in memory that does not grow with the document
(pipeline/data/text_pieces.py, docs/reliability.md "Hostile input")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import demo_slice

from pipeline.data import token_shards
from pipeline.data.text_pieces import pieces, splits_cleanly
from pipeline.data.token_shards import tokenize_unit
from pipeline.data.tokenizer import train_bpe

REPO = Path(__file__).resolve().parents[1]
# whitespace of every kind the pre-tokenizer's regex or str.isspace knows (and two that neither counts)
ODD_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000\x1c\x1f\u180e\u200b"


@pytest.fixture(scope="module")
def real_text() -> tuple[list[str], str]:
    """Demo documents, and one text made of them with runs of odd whitespace sprinkled through."""
    docs = [r["text"] for r in demo_slice(300)]
    rng = np.random.default_rng(0)
    chars = list("\n\n".join(docs))
    for i in rng.choice(len(chars), 2000, replace=False):
        chars[i] = "".join(rng.choice(list(ODD_SPACE), int(rng.integers(1, 4)))) + " " * int(rng.integers(0, 3))
    return docs, "".join(chars) + "  \n"


@pytest.fixture(scope="module")
def bpe(real_text):
    return train_bpe(real_text[0][:150], 1024)


def test_pieces_cut_only_before_whitespace_and_join_to_the_text(real_text):
    text = real_text[1]
    for limit in (1, 7, 300, len(text)):
        parts = list(pieces(text, limit))
        assert "".join(parts) == text
        for a, b in zip(parts, parts[1:]):
            assert not a[-1].isspace() and b[0] in " \t\n\r"
    assert list(pieces("x" * 50 + " y", 10)) == ["x" * 50, " y"]  # no cut point within the limit: the next one
    assert list(pieces("", 10)) == [""] and list(pieces("   ", 1)) == ["   "]


@pytest.mark.parametrize("limit", [7, 64, 4096])
def test_pieces_give_the_ids_of_the_whole_text(real_text, bpe, limit, monkeypatch):
    docs, text = real_text
    js = bpe.backend_tokenizer.to_str()
    assert splits_cleanly(js)
    texts = [docs[0], text, docs[1], "", text[:limit + 3]]
    whole = tokenize_unit(js, bpe.eos_token_id, "<u2", texts)
    monkeypatch.setattr(token_shards, "PIECE_CHARS", limit)
    cut = tokenize_unit(js, bpe.eos_token_id, "<u2", texts)
    assert whole[1][1] > 10_000
    for a, b in zip(whole, cut):
        np.testing.assert_array_equal(a, b)


def test_a_tokenizer_that_pieces_would_change_is_not_cut(real_text, bpe, monkeypatch):
    """add_prefix_space puts a space before every piece: such a tokenizer encodes the text whole."""
    spec = json.loads(bpe.backend_tokenizer.to_str())
    spec["pre_tokenizer"]["add_prefix_space"] = True
    js = json.dumps(spec)
    assert not splits_cleanly(js)
    text = real_text[1][:5000]
    whole = tokenize_unit(js, bpe.eos_token_id, "<u2", [text])
    monkeypatch.setattr(token_shards, "PIECE_CHARS", 50)
    np.testing.assert_array_equal(tokenize_unit(js, bpe.eos_token_id, "<u2", [text])[0], whole[0])
    from tokenizers import Tokenizer

    cut = [i for p in pieces(text, 50) for i in Tokenizer.from_str(js).encode(p, add_special_tokens=False).ids]
    assert cut != whole[0][:-1].tolist()  # it would have changed the ids


def test_the_tokenizer_trained_on_pieces_is_the_one_trained_on_the_whole_text(real_text):
    text = real_text[1]
    whole = train_bpe([text], 700).backend_tokenizer.to_str()
    assert train_bpe(list(pieces(text, 500)), 700).backend_tokenizer.to_str() == whole


PROBE = r"""
import json, resource, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from helpers import demo_slice
from pipeline.data.token_shards import tokenize_unit
from pipeline.data.tokenizer import train_bpe

docs = [r["text"] for r in demo_slice(200)]
body = "\n\n".join(docs)
text = (body * (int(sys.argv[2]) // len(body) + 1))[: int(sys.argv[2])]
train_bpe(docs[:50], 1024)  # the libraries' own first-use memory, before the baseline
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tok = train_bpe(docs + [text], 1024)
js = tok.backend_tokenizer.to_str()
flat, n_tokens, n_chars, _ = tokenize_unit(js, tok.eos_token_id, "<u2", docs[:3] + [text])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
whole = tok.backend_tokenizer.encode(text, add_special_tokens=False).ids  # after the measure: the reference
start = int(n_tokens[:3].sum()) + 3
print(json.dumps({"grew_mb": (peak - base) / 1024, "n_tokens": int(n_tokens[3]), "n_chars": int(n_chars[3]), "chars": len(text),
                  "same": flat[start : start + len(whole)].tolist() == whole and len(whole) == int(n_tokens[3])
                  and int(flat[-1]) == tok.eos_token_id and flat.size == int(n_tokens.sum()) + 4}))
"""


def test_a_long_document_takes_bounded_memory_and_loses_no_token(tmp_path):
    """4 MB of text in one document: training and tokenizing it whole would take ~90 and ~140 bytes
    a character (360 + 560 MB); in pieces, the process grows by far less, and every character and
    token of the document is counted."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    proc = subprocess.run([sys.executable, str(probe), str(REPO / "tests"), str(4_000_000)], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["same"] and got["n_chars"] == got["chars"] and got["n_tokens"] > 500_000
    assert got["grew_mb"] < 200, got
