"""The quality scorers' registry: one :class:`Scorer` per module in this folder, plugins through
``STRATA_PLUGINS`` (``pipeline/registry.py``).

A scorer turns texts into one number each, higher = better (a classifier's probability of the
positive label, a regression head's score). What a scorer writes is one method, :meth:`Scorer.score`
(a unit's texts to their scores, on a worker: the model loaded once per process); :meth:`Scorer.prepare`
checks its inputs, trains what it trains (cached under ``quality/models/``) and returns the
:class:`Prepared` model its units read, with the fingerprint (every byte of the model and the
parameters) that names the score files, so a changed model rescored every shard and an unchanged
one none. Spec modules import nothing heavy (``pipeline/heavy.py``) at their top.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import registry
from pipeline.errors import StrataInputError
from pipeline.registry import Registry
from pipeline.storage.atomic import file_sha256, is_sidecar

VERSION = "1"  # of the scores' bytes: a change here rescored every shard


@dataclass(frozen=True)
class Prepared:
    """What a scorer's units read: the model's path, its options (JSON-able), the fingerprint that
    names the score files, and facts to show (e.g. a trained model's held-out AUC)."""

    scorer: str
    model: str
    options: dict[str, Any]
    key: str
    facts: dict[str, Any] = field(default_factory=dict)


class Scorer:
    """One way of scoring a document's quality; subclasses set ``name`` and ``description`` and
    write :meth:`score` (and :meth:`prepare` when the model is not a file the config names)."""

    name: str
    description: str

    def prepare(self, cfg, models: Path) -> Prepared:
        """The model ``cfg.path`` checked (:meth:`check`) and fingerprinted; ``models``: where a
        trained scorer keeps what it trains."""
        path = Path(cfg.path).expanduser()
        if not cfg.path or not path.exists():
            raise StrataInputError(f"quality.path names no {self.name} model ({cfg.path!r})", path=cfg.path or None,
                                   fix=f"set quality.path to {self.expects}")
        options = self.options(cfg)
        self.check(str(path), options)
        return Prepared(self.name, str(path.resolve()), options, fingerprint(self.name, path, options))

    expects = "a model file"  # what quality.path must name, for the error

    def options(self, cfg) -> dict[str, Any]:
        """The config values the scores depend on besides the model's bytes."""
        return {"label": cfg.label}

    def check(self, model: str, options: dict[str, Any]) -> None:
        """Load the model once in this process and refuse one that cannot score (exit 2 naming it)."""
        self.score(model, options, ["a check"])

    def score(self, model: str, options: dict[str, Any], texts: list[str]) -> np.ndarray:
        """(len(texts),) float64 scores of ``texts``, higher = better."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def model_bytes(path: Path) -> str:
    """SHA-256 over a model file, or over every file of a model directory (relative names and bytes)."""
    if path.is_file():
        return file_sha256(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file() and not is_sidecar(p)):
        h.update(f"{f.relative_to(path).as_posix()}\0{file_sha256(f)}\n".encode())
    return h.hexdigest()


def fingerprint(scorer: str, model: Path, options: dict[str, Any]) -> str:
    """What names a model's score files: the scorer, every byte of the model, its options."""
    blob = json.dumps([VERSION, scorer, model_bytes(model), options], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


REGISTRY: Registry[Scorer] = registry.SCORERS  # declared in pipeline/registry.py, where the config reads it


def spec(name: str) -> Scorer:
    return REGISTRY.get(name)


def score_unit(scorer: str, model: str, options_json: str, texts: list[str]) -> np.ndarray:
    """One work unit's scores (a worker's function: the scorer looked up by name, its model loaded
    once per process by the scorer)."""
    return np.asarray(spec(scorer).score(model, json.loads(options_json), texts), dtype=np.float64)
