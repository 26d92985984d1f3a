"""The held-out split packed as training data (the frozen checkpoint of mixture fidelity trains on
it); apart from :mod:`pipeline.training.heldout`, which the trainer imports without the packing."""

from __future__ import annotations

import numpy as np

from pipeline.errors import StrataInputError
from pipeline.packing.pack import SequenceStore, pack_concat


def heldout_store(texts: list[str], tokenizer, seq_len: int, what: str = "the held-out split",
                  fix: str = "raise heldout_fraction (the frozen checkpoint of mixture fidelity trains on the held-out split)"):
    """The held-out documents as training data: each tokenized (text + EOS), all packed in order by
    ``concat`` into ``seq_len``-token sequences; returns a ``SequenceStore``.

    No ablation run trains on these documents, so a model trained on them is a checkpoint "trained
    on non-overlapping data" (TerRIFIC curricula, "The Merits of Our Scheduler") for the gradients
    of every schedule. ``what`` and ``fix``: the texts and the remedy an error names (too few tokens).
    """
    eos = tokenizer.eos_token_id
    docs = [ids + [eos] for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"] if ids]
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    if lengths.sum() < seq_len:
        raise StrataInputError(
            f"{what} holds {int(lengths.sum())} tokens, less than one sequence of {seq_len}", fix=fix,
        )
    flat = np.concatenate([np.asarray(d, dtype=np.int64) for d in docs])
    packed = pack_concat(np.arange(lengths.size), lengths, seq_len)
    pad = tokenizer.pad_token_id
    return SequenceStore(flat, np.concatenate([[0], np.cumsum(lengths)]), packed.segments, seq_len, pad_id=eos if pad is None else pad)
