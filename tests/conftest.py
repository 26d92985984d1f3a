"""Shared fixtures; plain helpers live in tests/helpers.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.offline import set_offline

set_offline()


@pytest.fixture
def write_jsonl(tmp_path):
    def _write(records: list, name: str = "corpus.jsonl") -> Path:
        path = tmp_path / name
        with open(path, "w", encoding="utf-8") as fh:
            for r in records:
                fh.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
        return path

    return _write
