"""The built-in offline corpus: real text that exists on any machine with Python.

Sources (each document labelled ``source`` = kind, ``subdomain`` = package / section):
- ``code``: the standard library's modules, split into chunks at top-level ``def``/``class``;
- ``docs``: ``pydoc_data`` topic texts and module docstrings;
- when present: ``/usr/share/doc`` (READMEs, changelogs), man pages (groff markup stripped),
  ``/usr/share/games/fortunes``, ``/usr/share/wordnet``.
Deterministic on a given machine: files are walked in sorted order and a per-source quota is
filled round-robin, so the same machine always yields the same documents in the same order.
"""

from __future__ import annotations

import ast
import gzip
import re
import sysconfig
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

MAX_CHARS = 3000  # long texts are split at paragraph boundaries into chunks of at most this size
MIN_CHARS = 80

_GROFF_ESC = re.compile(r"\\f[BIRPC0-9]|\\\(..|\\[-e&|^]|\\s[+-]?\d")


def _chunks(text: str, max_chars: int = MAX_CHARS) -> Iterator[str]:
    """Split at blank lines into chunks of at most ``max_chars`` (a longer paragraph is cut)."""
    buf: list[str] = []
    size = 0
    for para in re.split(r"\n\s*\n", text):
        while len(para) > max_chars:
            yield para[:max_chars]
            para = para[max_chars:]
        if size + len(para) > max_chars and buf:
            yield "\n\n".join(buf)
            buf, size = [], 0
        buf.append(para)
        size += len(para) + 2
    if buf:
        yield "\n\n".join(buf)


def _code_docs(stdlib: Path) -> Iterator[tuple[str, str, str, str]]:
    skip = ("test", "idlelib", "site-packages", "lib2to3", "turtledemo")
    files = [
        p for p in sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py"))
        if p.relative_to(stdlib).parts[0] not in skip and "test" not in p.name
    ]
    for path in _spread(files, 300):
        rel = path.relative_to(stdlib)
        try:
            src = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        package = rel.parts[0].removesuffix(".py")
        pieces = re.split(r"\n(?=(?:def|class|async def) )", src)
        for i, text in enumerate(islice((c for piece in pieces for c in _chunks(piece)), 8)):
            yield f"code/{rel}#{i}", text, "code", package
        try:
            doc = ast.get_docstring(ast.parse(src))
        except (SyntaxError, ValueError):
            doc = None
        if doc:
            yield f"docs/module/{rel}", doc, "docs", package


def _pydoc_topics() -> Iterator[tuple[str, str, str, str]]:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return
    for name in sorted(topics):
        for i, text in enumerate(_chunks(topics[name])):
            yield f"docs/topic/{name}#{i}", text, "docs", "topics"


def _spread(paths: list[Path], n: int = 600) -> list[Path]:
    """Evenly spaced picks from a sorted list, so one alphabetical run does not fill a quota."""
    step = max(1, len(paths) // n)
    return paths[::step]


def _read_maybe_gz(path: Path) -> str | None:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None


def _usr_share_doc(root: Path) -> Iterator[tuple[str, str, str, str]]:
    paths = [p for p in sorted(root.glob("*/*")) if p.is_file() and not p.name.startswith("copyright")]
    for path in _spread(paths):
        text = _read_maybe_gz(path)
        if text:
            for i, chunk in enumerate(islice(_chunks(text), 2)):
                yield f"usrdoc/{path.relative_to(root)}#{i}", chunk, "usr_share_doc", path.parent.name


def _man_pages(root: Path) -> Iterator[tuple[str, str, str, str]]:
    for path in _spread(sorted(root.glob("man[1-8]/*.gz"))):
        text = _read_maybe_gz(path)
        if not text:
            continue
        lines = [_GROFF_ESC.sub("", ln) for ln in text.splitlines() if not ln.startswith((".", "'"))]
        for i, chunk in enumerate(islice(_chunks("\n".join(lines).strip()), 2)):
            yield f"man/{path.name}#{i}", chunk, "man", path.parent.name


def _fortunes(root: Path) -> Iterator[tuple[str, str, str, str]]:
    for path in sorted(p for p in root.iterdir() if p.is_file() and not p.suffix):
        text = _read_maybe_gz(path)
        for i, quote in enumerate((text or "").split("\n%\n")):
            yield f"fortunes/{path.name}/{i}", quote, "fortunes", path.name


def _wordnet(root: Path) -> Iterator[tuple[str, str, str, str]]:
    for path in sorted(root.glob("data.*")):
        text = _read_maybe_gz(path) or ""
        for line in text.splitlines():
            if line.startswith("  ") or "|" not in line:
                continue
            head, gloss = line.split("|", 1)
            words = head.split()[4:5]
            yield f"wordnet/{path.name}/{head.split()[0]}", f"{' '.join(words)}: {gloss.strip()}", "wordnet", path.suffix[1:]


def builtin_sources() -> dict[str, Iterator[tuple[str, str, str, str]]]:
    """Generators of (id, text, source, subdomain) per source kind available on this machine."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    gens: dict[str, Iterator[tuple[str, str, str, str]]] = {
        "code": _code_docs(stdlib),
        "docs": _pydoc_topics(),
    }
    optional = {
        "usr_share_doc": (Path("/usr/share/doc"), _usr_share_doc),
        "man": (Path("/usr/share/man"), _man_pages),
        "fortunes": (Path("/usr/share/games/fortunes"), _fortunes),
        "wordnet": (Path("/usr/share/wordnet"), _wordnet),
    }
    for name, (path, fn) in optional.items():
        if path.is_dir():
            gens[name] = fn(path)
    return gens


def builtin_documents(max_docs: int) -> list[tuple[str, str, str, str]]:
    """Up to ``max_docs`` documents, filled round-robin across the available sources.

    The code and docs sources are always present (they come with Python itself); the others
    add breadth when the machine has them.
    """
    gens = {k: (d for d in g if len(d[1].strip()) >= MIN_CHARS) for k, g in builtin_sources().items()}
    out: list[tuple[str, str, str, str]] = []
    seen: set[str] = set()
    while gens and len(out) < max_docs:
        for name in list(gens):
            batch = list(islice(gens[name], 8))
            if not batch:
                del gens[name]
            for doc in batch:
                if doc[0] not in seen and len(out) < max_docs:
                    seen.add(doc[0])
                    out.append(doc)
    return out
