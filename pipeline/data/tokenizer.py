"""The tokenizer stage: train a byte-level BPE on the corpus offline, or load a given one.

The result is always saved as a Hugging Face ``PreTrainedTokenizerFast`` directory, so the
training stage and lm-eval's ``HFLM`` load it the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from pipeline.errors import StrataInputError

EOS = "<|endoftext|>"
PAD = "<|pad|>"


def train_bpe(texts: Iterable[str], vocab_size: int):
    """Train a byte-level BPE (GPT-2 style pre-tokenization) with ``vocab_size`` ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, bos_token=EOS)


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
    if tok.eos_token is None:
        tok.eos_token = EOS if EOS in tok.get_vocab() else tok.convert_ids_to_tokens(len(tok) - 1)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok
