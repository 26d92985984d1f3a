"""``strata demo``'s configuration: the defaults, three training seeds, and optional real evals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.config import MOVED_KEYS
from pipeline.errors import StrataInputError

# Three seeds of the seven default strategies (21 runs): 30 steps x 16 x 256 tokens per run (122,880),
# the held-out batch every 10 steps (4 points per curve), embeddings of each document's first 128
# tokens (all-MiniLM-L6-v2's training length). At these 30 steps the positive control (cluster_sorted)
# trains on 3-4 of the 32 clusters and is detected (docs/training.md, "Positive control and power").
# greedy and random probe 11 batches per checkpoint each, so the claims pair 3 x 11 = 33 (>= 32) probe
# batches per checkpoint for the stable rank (claims.probe_batches; the default 32 is per run).
# Why these settings: docs/training.md, "The demo". Everything else is StrataConfig's default.
DEMO_SETTINGS: dict[str, Any] = {"seeds": [0, 1, 2], "max_steps": 30, "warmup_steps": 3, "heldout_every": 10,
                                 "embed_max_tokens": 128, "claims": {"probe_batches": 11}}


def eval_paths(evals_dir: str | Path) -> dict[str, str]:
    """Config keys for a folder laid out as ``shared/data/eval``, each eval suite's ``find_in``
    (``evals/suites/``): ``wikitext/wiki.test.raw``, ``paloma/`` or ``paloma_fixture/`` (Paloma's
    ``<source>/<split>/*.jsonl.gz``) and ``dclm_core/`` (llm-foundry's ``local_data/`` +
    ``eval_meta_data.csv``); the ones present."""
    from evals.suites import ordered

    root = Path(evals_dir).expanduser().resolve()
    if not root.is_dir():
        raise StrataInputError("evals folder not found", path=root, fix="pass a folder laid out like shared/data/eval")
    out: dict[str, str] = {}
    for suite in ordered():
        if suite.find_in is not None:
            out.update(suite.find_in(root))
    if not out:
        raise StrataInputError("no wikitext/wiki.test.raw, paloma[_fixture]/ or dclm_core/ in the evals folder", path=root,
                               fix="pass a folder laid out like shared/data/eval")
    return out


def merged(base: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``base`` with the keys of ``given``: a group's mapping (``claims: {k: 10}``) merged key by key,
    a former flat key (``claims_k``) kept as given (read with its warning) in place of its group's key."""
    out = dict(base)
    for key, value in given.items():
        if key in MOVED_KEYS:
            group, name = MOVED_KEYS[key].split(".")
            if isinstance(out.get(group), dict):
                out[group] = {k: v for k, v in out[group].items() if k != name}
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def write_demo_config(root: Path, config_file: str | None, evals_dir: str | None) -> Path:
    """Write ``<root>/demo_config.yaml``: demo settings, then a given config file's keys, then evals."""
    import yaml

    data: dict[str, Any] = dict(DEMO_SETTINGS)
    if config_file:
        loaded = yaml.safe_load(Path(config_file).read_text(encoding="utf-8")) or {}
        if not isinstance(loaded, dict):
            raise StrataInputError("config must be a mapping of keys to values", path=config_file, fix="see README 'Configuration'")
        data = merged(data, loaded)
    if evals_dir:
        data.update(eval_paths(evals_dir))
    root.mkdir(parents=True, exist_ok=True)
    path = root / "demo_config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=True), encoding="utf-8")
    return path
