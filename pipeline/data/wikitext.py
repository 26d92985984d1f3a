"""WikiText raw files split into articles, as lm-eval's ``wikitext`` task sees them.

``EleutherAI/wikitext_document_level`` (the dataset behind lm-eval's task) cuts the raw file at
top-level headings ``" = Title = "``; section headings (``" = = Section = = "``) stay inside the
article. The same cut is applied here to a local raw file, so the offline task scores the same
documents.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import StrataInputError


def _is_title(line: str) -> bool:
    rline = line.replace("= = =", "===").replace("= =", "==").strip()
    return rline.startswith("= ") and rline.endswith(" =")


def split_articles(text: str) -> list[str]:
    """Articles of a WikiText raw text: each starts at a top-level ``= Title =`` line."""
    pages: list[str] = []
    lines: list[str] = []
    for line in text.split("\n"):
        if _is_title(line):
            page = "\n".join(lines)
            if page.strip():
                pages.append(page)
            lines = []
        lines.append(line)
    page = "\n".join(lines)
    if page.strip():
        pages.append(page)
    return pages


def read_articles(path: str | Path) -> list[str]:
    """Articles of a WikiText raw file (UTF-8)."""
    path = Path(path)
    if not path.is_file():
        raise StrataInputError("WikiText raw file not found", fix="set wikitext_path to e.g. wiki.test.raw", path=path)
    pages = split_articles(path.read_text(encoding="utf-8"))
    if not pages:
        raise StrataInputError("no articles in the WikiText file", fix="use a wikitext-*-raw file", path=path)
    return pages
