"""The tokenizer stage: train a byte-level BPE on the corpus offline, or load a given one.

BPE trains on a seeded sample of the training documents of about ``tokenizer_sample_chars``
characters (:func:`sample_chooser`; the whole corpus when it is smaller): merges learnt from tens of
millions of characters are those of the whole corpus up to rare words, while training time and
memory stay fixed as the corpus grows.

The result is always saved as a Hugging Face ``PreTrainedTokenizerFast`` directory, so the
training stage and lm-eval's ``HFLM`` load it the same way.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from pipeline.data.text_pieces import all_pieces
from pipeline.errors import StrataInputError
from pipeline.threads import concurrently

if TYPE_CHECKING:
    import numpy as np

EOS = "<|endoftext|>"
PAD = "<|pad|>"


def train_bpe(texts: Iterable[str], vocab_size: int):
    """Train a byte-level BPE (GPT-2 style pre-tokenization) with ``vocab_size`` ids. A text longer
    than ``PIECE_CHARS`` is fed in pieces cut before whitespace (:mod:`pipeline.data.text_pieces`):
    the pre-tokenizer finds the same words in them, so the counts and merges are those of the whole
    text, and the trainer's memory is that of a piece."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true"  # train on every core (the env var only quiets fork warnings otherwise)
    try:
        # transformers (imports on one core, for the wrapper below) loads while the texts are read
        _, transformers = concurrently(lambda: tok.train_from_iterator(all_pieces(texts), trainer=trainer),
                                       lambda: importlib.import_module("transformers"))
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, bos_token=EOS)


def load_tokenizer(spec: str | Path):
    """Load a tokenizer from a HF directory, a hub name (online), or a ``tokenizer.json`` file."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".json":
        tok = PreTrainedTokenizerFast(tokenizer_file=str(path))
    else:
        try:
            tok = AutoTokenizer.from_pretrained(str(spec))
        except (OSError, ValueError) as exc:
            raise StrataInputError(
                f"cannot load tokenizer {spec!r} ({exc.__class__.__name__})",
                fix="pass a tokenizer directory, a tokenizer.json file, or leave `tokenizer` empty to train one",
            ) from exc
    # Saved tokenizers may carry padding/truncation (sentence-transformers models pad to 128):
    # the token store needs every document's whole id sequence. HF calls set their own per call.
    tok.backend_tokenizer.no_padding()
    tok.backend_tokenizer.no_truncation()
    if tok.eos_token is None:
        tok.eos_token = EOS if EOS in tok.get_vocab() else tok.convert_ids_to_tokens(len(tok) - 1)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def sample_chooser(total_chars: int, budget_chars: int, seed: int) -> Callable[[int], np.ndarray | None]:
    """A seeded Bernoulli sample of the corpus's texts holding about ``budget_chars`` characters, for
    :func:`pipeline.data.shard_docs.chosen_texts`: called with the number of texts of each part of
    the corpus, in order, it returns the positions kept in that part (None: every text, when
    ``budget_chars`` is 0 or the corpus is no larger). Text ``i`` of the corpus is kept when the
    ``i``-th draw of ``default_rng(seed).random()`` is below ``budget_chars / total_chars``, whatever
    the parts' sizes: the draws need no text, so only the kept texts are read."""
    p = 1.0 if budget_chars <= 0 or total_chars <= budget_chars else budget_chars / total_chars
    rng = np.random.default_rng(seed)
    return lambda n: None if p >= 1.0 else np.flatnonzero(rng.random(n) < p)
