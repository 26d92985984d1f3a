"""The library's functions stay short enough to read in one screen: at most ``MAX_LONG`` functions
of ``pipeline/`` and ``evals/`` run over ``LIMIT`` lines. The few allowed are the ones splitting
would hurt, such as a numba kernel whose loop must stay in one compiled function."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIBRARY = ("pipeline", "evals")
LIMIT = 60  # lines from the ``def`` to the last line of the body (decorators not counted)
MAX_LONG = 5


def long_functions(*roots: Path, limit: int = LIMIT) -> list[tuple[int, str]]:
    """(lines, "path:name") of every function (methods and nested functions too) under ``roots``
    longer than ``limit`` lines, longest first."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > limit:
                        found.append((n, f"{path.relative_to(root.parent)}:{node.name}"))
    return sorted(found, reverse=True)


def test_at_most_five_long_library_functions():
    long = long_functions(*(REPO / p for p in LIBRARY))
    assert len(long) <= MAX_LONG, (f"{len(long)} library functions over {LIMIT} lines (at most {MAX_LONG}); split these into "
                                   "helpers that each do one thing: " + ", ".join(f"{name} ({n})" for n, name in long))


def test_the_length_test_sees_a_long_function(tmp_path):
    """A planted module: a 61-line function and a 61-line nested one are found, a 60-line one is not."""
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    nested = "\n".join(f"        y{i} = {i}" for i in range(59))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(textwrap.dedent(f"""\
def short():
{body}


def long():
{body}
    return x0


def outer():
    def inner():
{nested}
        return y0
    return inner
"""))
    found = long_functions(tmp_path / "pkg")
    assert found == [(63, "pkg/mod.py:outer"), (61, "pkg/mod.py:long"), (61, "pkg/mod.py:inner")]
    assert long_functions(tmp_path / "pkg", limit=62) == [(63, "pkg/mod.py:outer")]
