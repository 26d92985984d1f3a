"""The base packing's sequences as stored under a data root: the token store its segments point
into (refused when it changed since ``sequences`` packed it) and the rows read from it.

``pipeline/storage/layout.py: Store`` gives the packing's metadata (``Store(layout).sequences``);
reading its tokens belongs here, where the packing's reader (``SequenceStore``) lives.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pipeline.data.tokenizer import load_tokenizer
from pipeline.data.tokens import open_tokens
from pipeline.errors import StrataInputError
from pipeline.packing.pack import SequenceStore
from pipeline.storage.layout import Layout, Store, tokens_fingerprint


def packed_tokens(layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """``open_tokens`` of the token store the sequences' segments point into; refuses a token
    store that changed since ``sequences`` packed it (the segments would read other ids)."""
    recorded = Store(layout).sequences.tokens
    if recorded is not None and recorded != tokens_fingerprint(layout):
        raise StrataInputError("the token store changed since the sequences were packed: their segments point at other ids",
                               path=layout.tokens, fix="rematerialize sequences and orderings for the current tokens")
    return open_tokens(layout.tokens, layout.doc_offsets)


def sequence_store(layout: Layout, pad_id: int | None = None) -> SequenceStore:
    """The base packing's sequences read from the token store (``SequenceStore``: rows by sequence
    id); ``pad_id`` is the tokenizer's when not given."""
    seq = Store(layout).sequences
    if pad_id is None:
        pad_id = load_tokenizer(layout.tokenizer).pad_token_id
    tokens, offsets = packed_tokens(layout)
    return SequenceStore(tokens, offsets, pl.read_parquet(seq.segments_path), seq.seq_len, pad_id=pad_id)
