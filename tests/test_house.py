"""House rules the code and docs keep: prose says what and why, measured figures come from results files."""

from __future__ import annotations

import ast
import io
import json
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TABLES = REPO / "benchmarks" / "tables.py"

_NUM = r"\d[\d,]*(?:\.\d+)?(?:\s?[–-]\s?\d[\d,]*(?:\.\d+)?)?"
# a number with a unit of time (case-sensitive: "2 S" in a formula is no timing; a bare "h" is too
# often a hidden size), a memory figure beside a word that makes it a measurement, a throughput,
# or a speed-up
TIMING = re.compile(
    rf"(?<![\w.]){_NUM}\s?(?:ms|µs|us|s|sec|secs|seconds?|min|mins|minutes?|hours?|hrs?)\b(?!\.\w)"
    rf"|\b(?:peak|took|takes|held|holds|measured|rss|heap)\W+(?:[\w.]+\W+){{0,4}}?{_NUM}\s?(?:[KMGT]i?B)\b"
    rf"|(?<![\w.]){_NUM}\s?(?:[KMGT]i?B)\W+(?:\w+\W+){{0,2}}?(?:peak|rss|heap)\b"
    rf"|(?<![\w.]){_NUM}\s?(?:[KMGT]i?B|tokens|docs|documents|rows)/s\b"
    rf"|(?<![\w.]){_NUM}\s?(?:[x×]|%|times)\s+(?:faster|slower)\b"
    r"|\b(?:ten|twice|two|three|four|five|[a-z]+fold)\s+(?:times\s+)?(?:as\s+fast|faster|slower)\b",
    re.IGNORECASE,
)
_CASED = re.compile(rf"(?<![\w.]){_NUM}\s?(?:ms|µs|us|s|sec|secs|min|mins)\b")
_CODE = re.compile(r"``[^`]*``|`[^`]*`")  # inline code: syntax and names, not prose


def prose(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every comment and docstring of a module's source."""
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.append((first.lineno, first.value.value))
    return out


def timings(text: str) -> list[str]:
    """The timing, memory and speed figures in one comment or docstring."""
    flat = " ".join(_CODE.sub(" ", text).split())
    found = []
    for m in TIMING.finditer(flat):
        short_unit = re.fullmatch(rf"{_NUM}\s?(?:ms|µs|us|s|sec|secs|min|mins)", m.group(0), re.IGNORECASE)
        if short_unit and not _CASED.fullmatch(m.group(0)):
            continue  # "2 S" in a formula, "3 MS" as a name
        found.append(m.group(0))
    return found


def offenders(roots: list[Path]) -> list[str]:
    out = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for line, text in prose(path.read_text()):
                for hit in timings(text):
                    out.append(f"{path.relative_to(REPO)}:{line}: {hit!r}")
    return out


def test_no_timings_in_docstrings():
    """Docstrings and comments say what and why; how long something took lives in benchmarks/results."""
    found = offenders([REPO / "pipeline", REPO / "assets", REPO / "evals"])
    assert not found, ("timings in docstrings or comments (say what and why; point to the benchmark or "
                       "docs/scale.md instead):\n" + "\n".join(found))


def test_timing_check_flags_what_it_should(tmp_path):
    flagged = [
        "the repair took 2.8 s at 10M documents",
        "0.04 s for 9.8M documents, against 0.80 s for numpy's sort",
        "one worker's start-up, about 1.5 s, is then paid back",
        "9.9–10.4 s with 1 request in flight",
        "15 minutes more", "~20 ms to open", "it took 297 seconds", "a 2 hours run",
        "the peak heap was 1.31 GB", "held 0.3-0.5 GB of freed frames", "1.2 GB peak",
        "read them at 2.7 GB/s", "about 15% slower on an H100", "3.5x faster", "ten times faster than a matrix",
    ]
    for text in flagged:
        assert timings(text), text
    clean = [
        "parses ``60m`` / ``90s`` / ``2h`` budgets", "f(s) = const + 2 Q_s - 2 S a_s",
        "the MLP holds ~8 h^2 weights, like a 4h GELU MLP", "checkpointed every ``_CHECKPOINT_SECONDS``",
        "one 8 MiB block buffer per object", "each 8-byte temporary over them is 87 MB",
        "slower than one thread for sample-sized problems", "exit code 2 s.t. the caller stops",
    ]
    for text in clean:
        assert not timings(text), (text, timings(text))
    # and through a module's source, as the test above reads it
    module = tmp_path / "pkg" / "mod.py"
    module.parent.mkdir()
    module.write_text('"""A stage.\n\nIt took 24 s at 1M documents."""\n\nX = 1  # 0.3 s on one core\n\n\n'
                      'def f():\n    """Fine: says what."""\n')
    hits = [hit for line, text in prose(module.read_text()) for hit in timings(text)]
    assert sorted(hits) == ["0.3 s", "24 s"]


def _tables(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TABLES), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_doc_tables_match_results():
    """Every ``<!-- table: NAME -->`` block of the docs is what benchmarks/tables.py renders from the results."""
    run = _tables("--check")
    assert run.returncode == 0, run.stdout + run.stderr


def _copy_docs(tmp_path: Path) -> tuple[Path, Path]:
    root, results = tmp_path / "repo", tmp_path / "results"
    shutil.copytree(REPO / "docs", root / "docs")
    shutil.copy(REPO / "README.md", root / "README.md")
    shutil.copytree(REPO / "benchmarks" / "results", results)
    return root, results


def test_changed_figure_fails_check_and_rewrite_fixes_it(tmp_path):
    root, results = _copy_docs(tmp_path)
    args = ("--root", str(root), "--results", str(results))
    assert _tables("--check", *args).returncode == 0
    doc = json.loads((results / "s3_vs_disk.json").read_text())
    doc["s3"]["wall_s"] = 61.25
    (results / "s3_vs_disk.json").write_text(json.dumps(doc))
    check = _tables("--check", *args)
    assert check.returncode == 1
    assert "object_storage.md" in check.stdout and "out of sync" in check.stdout
    assert "61.2" not in (root / "docs" / "object_storage.md").read_text()  # --check writes nothing
    assert _tables(*args).returncode == 0
    assert "| 61.2 |" in (root / "docs" / "object_storage.md").read_text()
    assert _tables("--check", *args).returncode == 0


def test_bad_table_block_names_file_and_line(tmp_path):
    root, results = _copy_docs(tmp_path)
    args = ("--root", str(root), "--results", str(results))
    doc = root / "docs" / "scale.md"
    base = doc.read_text()
    doc.write_text(base + "\n<!-- table: no_such_table -->\n<!-- /table -->\n")
    run = _tables("--check", *args)
    line = doc.read_text().split("\n").index("<!-- table: no_such_table -->") + 1
    assert run.returncode == 2 and f"scale.md:{line}: unknown table 'no_such_table'" in run.stderr, run.stderr
    doc.write_text(base + "\n<!-- table: s3_vs_disk -->\n")
    run = _tables("--check", *args)
    assert run.returncode == 2 and "no closing <!-- /table -->" in run.stderr, run.stderr
    doc.write_text(base)
    (results / "s3_vs_disk.json").unlink()
    run = _tables("--check", *args)
    assert run.returncode == 2 and "s3_vs_disk.json: no such results file" in run.stderr, run.stderr
