"""The README's configuration example is a valid configuration (keeps the README true)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from pipeline.config import config_from_dict

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_config_example_is_valid():
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    example = next(b for b in blocks if b.startswith("# my.yaml"))
    cfg = config_from_dict(yaml.safe_load(example))
    assert cfg.corpus.path == "/data/corpus.jsonl.gz" and cfg.strategies[0] == "random"
