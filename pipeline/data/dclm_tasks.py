"""DCLM-core's task files: which tasks the core score averages and where each task's rows are
(``<dclm_dir>/local_data/<category>/<task>.jsonl[.gz]``). Read by decontamination
(``pipeline/clean/decontam.py``) and by the DCLM scorer (``evals/dclm.py``).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from pipeline.errors import StrataInputError

#: DCLM's ``low_variance_datasets`` (used when ``additional_aggregation.json`` is absent).
CORE_TASKS: tuple[str, ...] = (
    "hellaswag_zeroshot", "jeopardy", "bigbench_qa_wikidata", "arc_easy", "arc_challenge", "copa",
    "commonsense_qa", "piqa", "openbook_qa", "lambada_openai", "hellaswag", "winograd",
    "winogrande", "bigbench_dyck_languages", "agi_eval_lsat_ar", "bigbench_cs_algorithms",
    "bigbench_operators", "bigbench_repeat_copy_logic", "squad", "coqa", "boolq",
    "bigbench_language_identification",
)


#: label -> (data file stem under local_data/, continuation_delimiter) from DCLM's
#: ``eval/mmlu_and_lowvar.yaml`` (llm-foundry's default delimiter is a single space).
TASK_FILES: dict[str, tuple[str, str]] = {
    "hellaswag_zeroshot": ("language_understanding/hellaswag", " "),
    "jeopardy": ("world_knowledge/jeopardy_all", "\nAnswer: "),
    "bigbench_qa_wikidata": ("world_knowledge/bigbench_qa_wikidata", " "),
    "arc_easy": ("world_knowledge/arc_easy", "\nAnswer: "),
    "arc_challenge": ("world_knowledge/arc_challenge", "\nAnswer: "),
    "copa": ("commonsense_reasoning/copa", " "),
    "commonsense_qa": ("commonsense_reasoning/commonsense_qa", " "),
    "piqa": ("commonsense_reasoning/piqa", "\nAnswer: "),
    "openbook_qa": ("commonsense_reasoning/openbook_qa", " "),
    "lambada_openai": ("language_understanding/lambada_openai", " "),
    "hellaswag": ("language_understanding/hellaswag", " "),
    "winograd": ("language_understanding/winograd_wsc", " "),
    "winogrande": ("language_understanding/winogrande", " "),
    "bigbench_dyck_languages": ("symbolic_problem_solving/bigbench_dyck_languages", " "),
    "agi_eval_lsat_ar": ("symbolic_problem_solving/agi_eval_lsat_ar", " "),
    "bigbench_cs_algorithms": ("symbolic_problem_solving/bigbench_cs_algorithms", " "),
    "bigbench_operators": ("symbolic_problem_solving/bigbench_operators", " "),
    "bigbench_repeat_copy_logic": ("symbolic_problem_solving/bigbench_repeat_copy_logic", " "),
    "squad": ("reading_comprehension/squad", " "),
    "coqa": ("reading_comprehension/coqa", " "),
    "boolq": ("reading_comprehension/boolq", "\nAnswer: "),
    "bigbench_language_identification": ("language_understanding/bigbench_language_identification", " "),
}


def core_tasks(dclm_dir: Path) -> list[str]:
    """DCLM's ``low_variance_datasets`` from ``additional_aggregation.json`` (else the built-in list)."""
    path = Path(dclm_dir) / "additional_aggregation.json"
    if path.is_file():
        return list(json.loads(path.read_text(encoding="utf-8"))["low_variance_datasets"])
    return list(CORE_TASKS)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a .jsonl or .jsonl.gz file; splits on "\\n" only (strings may hold U+2028)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", newline="") as fh:
        text = fh.read()
    rows = []
    for i, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise StrataInputError(f"malformed JSON ({exc.msg})", fix="repair or re-download the file", path=path, line=i) from exc
    return rows


def task_file(dclm_dir: Path, task: str) -> Path:
    stem, _ = TASK_FILES[task]
    base = Path(dclm_dir) / "local_data" / stem
    for cand in (base.with_suffix(".jsonl"), Path(f"{base}.jsonl.gz")):
        if cand.is_file():
            return cand
    raise StrataInputError(f"data for DCLM task {task!r} not found at {base}.jsonl[.gz]",
                           fix="run DCLM's eval/download_eval_data.sh or copy llm-foundry's scripts/eval/local_data")
