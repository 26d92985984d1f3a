"""Which configuration a process runs with when it is given no config file: the one its data root
records (``<data root>/strata_config.yaml``, written by every ``strata run`` / ``strata demo``), so
the Dagster UI and ``strata status`` started without a config file show what the root was built with."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from pipeline.config import MOVED_KEYS, StrataConfig, config_from_dict, read_config_data, resolve_config
from pipeline.errors import StrataInputError
from pipeline.storage.atomic import write_text
from pipeline.storage.layout import check_data_root

RECORDED_CONFIG = "strata_config.yaml"


def record_config(cfg: StrataConfig) -> Path:
    """Write ``<data root>/strata_config.yaml`` atomically: every key of ``cfg``, defaults included,
    but ``data_root``, which is the folder the file lies in (so a root's bytes do not depend on where
    it lies); unchanged bytes are not rewritten. The root is checked (and marked) first: a folder of
    the user's is refused (:func:`check_data_root`). Returns its path."""
    data = cfg.model_dump(mode="json", exclude={"data_root"})
    text = yaml.safe_dump(data, sort_keys=True)
    path = check_data_root(cfg.root) / RECORDED_CONFIG
    if not (path.is_file() and path.read_text(encoding="utf-8") == text):
        write_text(text, path)
    return path


def default_data_root(environ: Mapping[str, str] | None = None) -> Path:
    """The data root of a process given no config file and no ``--data-root``: ``STRATA_HOME``, else
    the parent of ``DAGSTER_HOME`` when that parent holds a recorded config (the README's
    ``DAGSTER_HOME=<data root>/dagster``), else ``./.strata``."""
    environ = os.environ if environ is None else environ
    if environ.get("STRATA_HOME"):
        return Path(environ["STRATA_HOME"]).expanduser().resolve()
    if environ.get("DAGSTER_HOME"):
        parent = Path(environ["DAGSTER_HOME"]).expanduser().resolve().parent
        if (parent / RECORDED_CONFIG).is_file():
            return parent
    return Path(".strata").resolve()


def config_source(data_root: str | os.PathLike | None = None,
                  environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """(config file, data root) for a process given no ``--config``: ``STRATA_CONFIG`` when set; else
    the data root's recorded config (``data_root``, else :func:`default_data_root`) when it has one,
    with that data root; else no file (the defaults)."""
    environ = os.environ if environ is None else environ
    if environ.get("STRATA_CONFIG"):
        return environ["STRATA_CONFIG"], (str(data_root) if data_root else None)
    root = Path(data_root).expanduser().resolve() if data_root else default_data_root(environ)
    recorded = root / RECORDED_CONFIG
    if recorded.is_file():
        return str(recorded), str(root)
    return None, (str(data_root) if data_root else None)


def env_config() -> StrataConfig:
    """The configuration named by ``STRATA_CONFIG`` (a YAML/JSON file), else the data root's recorded
    config (:func:`config_source`), else the defaults; the data root by precedence (see
    :func:`pipeline.config.resolve_config`)."""
    return resolve_config(*config_source())


def config_or_demo(config_file: str | None, data_root: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The config file of a command that reads a data root's results (``strata claims``, ``strata
    ablate``): the one given, else ``STRATA_CONFIG``, else the data root's ``demo_config.yaml`` (a
    root made by ``strata demo``: its settings), else none."""
    environ = os.environ if environ is None else environ
    config = config_file or environ.get("STRATA_CONFIG") or None
    demo = Path(data_root or environ.get("STRATA_HOME") or ".strata").resolve() / "demo_config.yaml"
    return str(demo) if config is None and demo.is_file() else config


def run_config(config_file: str | None, data_root: str | None) -> StrataConfig:
    """The configuration a ``strata`` run uses (:func:`resolve_config`; without a file, the data
    root's recorded one, :func:`config_source`), ``STRATA_CONFIG`` pointed at its file, and the data
    root created, marked as one (never read as corpus) and writable, or a clean error."""
    if not config_file:
        config_file, data_root = config_source(data_root)
    if config_file:
        config_file = str(Path(config_file).resolve())
        os.environ["STRATA_CONFIG"] = config_file
    cfg = resolve_config(config_file, data_root)
    check_data_root(cfg.root)
    return cfg


def optional_enabled(name: str, group: str | None, cfg: StrataConfig, selected: bool = False) -> bool:
    """Whether ``strata run`` materializes this asset: the quality stage only with ``quality.enabled``,
    whatever the selection (it is upstream of ``sequences``, so every selection of what follows would
    name it); without ``--select``, the mixture stage only with ``mixture.enabled`` and the claims'
    own training runs only with ``claims_full``."""
    if group == "quality":
        return cfg.quality.enabled
    if selected:
        return True
    if group == "mixture":
        return cfg.mixture.enabled
    if name == "claim_runs":
        return cfg.claims.full
    return True


def freeze_prefix_config(config_file: str, data_root: str | None, freeze_prefix: str) -> Path:
    """``config_file`` with ``freeze_prefix`` set, written to ``<data root>/run_config.yaml`` (``strata
    run --freeze-prefix``); a missing or malformed file, or a bad value, stops here naming the fix."""
    data = read_config_data(config_file)
    data["freeze_prefix"] = int(freeze_prefix) if freeze_prefix.strip().isdigit() else freeze_prefix
    try:
        config_from_dict({**data, "data_root": "."})
    except StrataInputError as err:
        raise StrataInputError(err.problem, path=config_file, fix=err.fix) from None
    root = check_data_root(resolve_config(config_file, data_root).root)  # before run_config.yaml goes in
    path = root / "run_config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=True), encoding="utf-8")
    return path


# Three seeds of the seven default strategies (21 runs): 30 steps x 16 x 256 tokens per run (122,880),
# the held-out batch every 10 steps (4 points per curve), embeddings of each document's first 128
# tokens (all-MiniLM-L6-v2's training length). At these 30 steps the positive control (cluster_sorted)
# trains on 3-4 of the 32 clusters and is detected (docs/training.md, "Positive control and power").
# greedy and random probe 11 batches per checkpoint each, so the claims pair 3 x 11 = 33 (>= 32) probe
# batches per checkpoint for the stable rank (claims.probe_batches; the default 32 is per run).
# Why these settings: docs/training.md, "The demo". Everything else is StrataConfig's default.
DEMO_SETTINGS: dict[str, Any] = {"seeds": [0, 1, 2], "max_steps": 30, "warmup_steps": 3, "heldout_every": 10,
                                 "embed_max_tokens": 128, "claims": {"probe_batches": 11}}


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


def write_demo_config(root: Path, config_file: str | None, eval_keys: Mapping[str, str] | None = None,
                      more: Callable[[Path, StrataConfig], Mapping[str, Any]] | None = None) -> Path:
    """Write ``<root>/demo_config.yaml``: demo settings, then a given config file's keys, then the
    eval suites' path keys ``eval_keys`` (``evals.suites.eval_paths`` of ``strata demo --evals DIR``),
    then the keys ``more(root, config so far)`` returns, called once the root is checked (the built-in
    quality scorer, whose label files it writes there: ``pipeline.cli.demo.demo_quality``)."""
    data: dict[str, Any] = dict(DEMO_SETTINGS)
    if config_file:
        loaded = yaml.safe_load(Path(config_file).read_text(encoding="utf-8")) or {}
        if not isinstance(loaded, dict):
            raise StrataInputError("config must be a mapping of keys to values", path=config_file, fix="see README 'Configuration'")
        data = merged(data, loaded)
    data.update(eval_keys or {})
    check_data_root(root)  # a folder of the user's is refused before demo_config.yaml (or a label file) goes in
    data.update(more(root, config_from_dict(data)) if more else {})
    path = root / "demo_config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=True), encoding="utf-8")
    return path
