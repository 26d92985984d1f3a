"""A long text in bounded pieces cut before whitespace, which a byte-level BPE tokenizes to the same ids.

Tokenizing or training on one enormous string makes the ``tokenizers`` library hold per-character
alignment and per-token records for the whole string at once (about a hundred bytes a character),
so a single very long document would need gigabytes. :func:`pieces` cuts a text longer than
``PIECE_CHARS`` into consecutive pieces of at most about that length, each cut placed just before
an ASCII whitespace character (space, tab, newline, carriage return) that follows a non-whitespace
character.

Why the ids do not change: the GPT-2 pre-tokenization regex of a ``ByteLevel`` pre-tokenizer
(``'s|'t|…| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``) never matches a span that
holds a non-whitespace character followed by a whitespace one (whitespace only ever leads a
match), so every such place is a boundary between two pre-tokens in the whole text, and the
pre-tokens of the pieces are exactly those of the whole; BPE merges within a pre-token. That holds
for a tokenizer with no normalizer, a ``ByteLevel`` pre-tokenizer using that regex without a
prefix space, a deterministic BPE model and added tokens that neither contain whitespace nor strip
it (:func:`splits_cleanly`: Strata's trained tokenizer, GPT-2's). Another tokenizer's documents are
tokenized whole. ``tests/test_long_documents.py`` checks the equality on real text.
"""

from __future__ import annotations

import json
import re
from typing import Iterable, Iterator

PIECE_CHARS = 1 << 18  # characters a piece holds at most (unless no cut point lies within it)

# a cut point: after a character that is not whitespace (str.isspace, a superset of the regex's \s)
# and before ASCII whitespace (whitespace for every regex flavour)
_CUT = re.compile(r"(?<=\S)(?=[ \t\n\r])")


def pieces(text: str, limit: int = PIECE_CHARS) -> Iterator[str]:
    """``text`` in consecutive pieces (joined, ``text`` again) of at most ``limit`` characters, each
    but the last ending just before a whitespace character that follows a non-whitespace one. A
    stretch longer than ``limit`` without such a place stays whole up to its next one. A text of at
    most ``limit`` characters is its own single piece."""
    start, n = 0, len(text)
    while n - start > limit:
        end = start + limit
        cut, width = None, 4096
        while cut is None:
            lo = max(start + 1, end - width)
            found = None
            for found in _CUT.finditer(text, lo, end + 1):  # noqa: B007 (the last match is the one wanted)
                pass
            if found is not None:
                cut = found.start()
            elif lo == start + 1:
                after = _CUT.search(text, end + 1)
                cut = after.start() if after is not None else n
            width *= 8
        yield text[start:cut]
        start = cut
    if start < n or n == 0:
        yield text[start:]


def all_pieces(texts: Iterable[str], limit: int = PIECE_CHARS) -> Iterator[str]:
    """Every text's :func:`pieces`, in order (what a BPE trainer may count words from instead of the texts)."""
    for text in texts:
        if len(text) > limit:
            yield from pieces(text, limit)
        else:
            yield text


def splits_cleanly(tokenizer_json: str) -> bool:
    """Whether the serialized ``tokenizers`` tokenizer gives a text's ids as the concatenation of its
    :func:`pieces`' ids (module docstring), when encoding without special tokens."""
    spec = json.loads(tokenizer_json)
    pre, model = spec.get("pre_tokenizer") or {}, spec.get("model") or {}
    post = (spec.get("post_processor") or {}).get("type")
    return (spec.get("normalizer") is None and pre.get("type") == "ByteLevel" and pre.get("use_regex", True)
            and not pre.get("add_prefix_space", False) and model.get("type") == "BPE" and model.get("dropout") is None
            and post in (None, "ByteLevel", "TemplateProcessing")
            and all(not (t.get("lstrip") or t.get("rstrip") or t.get("single_word")) and not any(c.isspace() for c in t["content"])
                    for t in spec.get("added_tokens") or []))
