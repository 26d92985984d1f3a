"""The ordering strategies' registry: one :class:`StrategySpec` per strategy, one module per strategy
(or small family) in this folder, plugins through ``STRATA_PLUGINS`` (``pipeline/registry.py``).

A spec says what the strategy is (name, description, level), how it depends on its seed, the
configuration keys it reads and how it runs:

- ``level="sequence"``: ``order(features, params, seed) -> rows`` permutes the base packing's
  sequences (``SequenceFeatures`` rows, schedule order);
- ``level="document"``: ``order(cluster, length, seq_len, params) -> permutation`` of the
  documents, which the engine repacks (``pipeline.packing.pack.pack_concat``);
- either level may give ``run(inputs) -> OrderingResult`` instead, for strategies that need the
  whole input (content hashes, their own repacking); ``documents`` names the corpus columns such a
  run reads (``content_hash``), which the orderings asset then reads for it alone;
- a sequence-level strategy that gives ``mixture(params, n_clusters) -> target shares`` realizes a
  mixture: its rows may repeat or be left out (a *schedule*; see ``greedy_mixture.py``);
- a sequence-level spec may give ``order_after(features, prefix_rows, params, seed)``: the rows
  after a frozen prefix in order, continuing from the prefix (the greedy starts from its running
  counts); without it the rows after the prefix are ordered by ``order`` alone;
- a sequence-level spec that reads ``order_part_bytes`` may give ``part_order(features, params,
  seed)``: the order of one part when the corpus is dealt into parts, each ordered in a worker of
  its own, the parts making the stream in its ``part_layout`` (``stretches``: one after another;
  ``batches``: batch by batch; ``pipeline/ordering/parts.py``); without it, a corpus that needs
  more than one part is refused;
- a ``run`` spec may give ``run_after(inputs, prefix_ids)``: its whole result with the frozen
  prefix first (``greedy_blend``: the blend's plan after the prefix, its uses counted); a ``run``
  spec without it refuses ``freeze_prefix``;
- ``level="training"``: chosen online by a sampler during training (ODM); the orderings asset
  writes the packing of ``packing_from`` for it, and it has no fixed order to export. Its spec
  gives ``sampler(segments, doc_cluster, n_steps, seed, params)`` (``params``: the training stage's
  ``TrainRunParams``, which hold the keys the spec ``reads``): the object training asks for each
  step's sequences (``next_batch``, ``update``), which afterwards gives the ids it served
  (``served_ids()``) and its mixture rows (``mixture_rows()``, written to the DuckDB table and
  run file named by its ``table``); the training stage asks the spec, never the strategy's name.

Everything else derives from the specs: the config's accepted names, the CLI choices, the
orderings asset's parameters (``assets/params.py``), ``SEED_FREE``, ``SEQUENCE_LEVEL`` /
``DOCUMENT_LEVEL``. The engine is ``pipeline/ordering/engine.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from pipeline import registry
from pipeline.registry import Registry

Level = Literal["sequence", "document", "training"]


@dataclass(frozen=True)
class StrategySpec:
    name: str
    level: Level
    description: str
    # training seeds share its materialized order when noise == 0 (else training seed s re-runs it with s): its
    # order ignores the seed, or (greedy's blocked mode, which deals sequences to blocks with a seeded draw)
    # the seed only picks one of equally good greedy orders, so it stays the configured seed's
    seed_free: bool
    reads: tuple[str, ...] = ()  # StrataConfig keys its result depends on (beyond seq_len and seed)
    greedy_based: bool = False  # built on the greedy: its result names the greedy's mode (exact | blocked)
    order: Callable[..., Any] | None = None  # the array API of its level (see the module docstring)
    run: Callable[..., Any] | None = None  # (Inputs) -> OrderingResult, when the array API does not suffice
    packing_from: str | None = None  # training-time: the ordering strategy whose packing it samples from
    reseed: Callable[..., Any] | None = None  # (order, params, from_seed, to_seed) -> its order for to_seed, or None: re-run it
    mixture: Callable[..., Any] | None = None  # (params, n_clusters) -> target token share per cluster: its order is a schedule
    # (features, prefix_rows, params, seed) -> the other rows in order, continuing a frozen prefix (default: ``order`` on them alone)
    order_after: Callable[..., Any] | None = None
    features: bool = True  # its order reads the sequences' features (False: only their ids, e.g. random)
    documents: tuple[str, ...] = ()  # corpus.parquet columns its run reads beyond doc_id, cluster and n_tokens (e.g. content_hash)
    # (base strategy, (base order's sequence ids, params, seed) -> its order): the same order as
    # ``order`` gives, computed from the base strategy's materialized order when that was made
    # from the same sequences, parameters and seed (greedy_block_shuffle from greedy's order)
    derived: tuple[str, Callable[..., Any]] | None = None
    # training-time: (segments, doc_cluster, n_steps, seed, params) -> the sampler training draws each step's
    # sequences from (see the module docstring); pipeline/training/stage.py asks for it
    sampler: Callable[..., Any] | None = None
    # (Inputs, prefix sequence ids) -> OrderingResult: a ``run`` strategy's order continuing a frozen prefix, the
    # prefix's positions first (greedy_blend: a schedule with the prefix's uses counted); without it, ``run`` refuses freeze_prefix
    run_after: Callable[..., Any] | None = None
    # a schedule's own accounting and checks, instead of the cluster mixture's (greedy_blend):
    # (layout, params, strategy, tolerance, seed) -> (outputs, checks, metadata); it writes
    # orderings/<strategy>.mixture.parquet (per cluster, as a mixture's) and its own files; metadata["tables"]:
    # DuckDB table -> rows (the stage writes them with a strategy column)
    accounting: Callable[..., Any] | None = None
    # (features, params, seed) -> rows: the order of one part of a partitioned ordering (``order_part_bytes``;
    # pipeline/ordering/partitioned.py), the parts in ``part_layout`` being its order (or, with ``derived``,
    # its base's); None: it refuses more than one part
    part_order: Callable[..., Any] | None = None
    # how its parts make the stream (pipeline.ordering.parts.LAYOUTS): "stretches", one part after another, or
    # "batches", batch b from part b mod P (a part that holds the whole stream's course, as a curriculum's does)
    part_layout: str = "stretches"
    # (params) -> Objective: what the deal balances across the parts (None: params.objective_weights(); greedy_blend:
    # its groups first). A part_order may return (rows, plan): a schedule's plan per part, arrays the accounting reads
    part_objective: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if self.level not in ("sequence", "document", "training"):
            raise ValueError(f"strategy {self.name!r}: level must be sequence, document or training")
        if self.level == "training" and self.packing_from is None:
            raise ValueError(f"training-time strategy {self.name!r} names the packing it samples from (packing_from)")
        if (self.level == "training") != (self.sampler is not None):
            raise ValueError(f"strategy {self.name!r}: a training-time strategy gives a sampler, and only it")
        if self.level != "training" and (self.order is None) == (self.run is None):
            raise ValueError(f"strategy {self.name!r} gives exactly one of order and run")

    @property
    def realizes_mixture(self) -> bool:
        """Realizes a mixture: its order may repeat sequences (up to ``max_sequence_copies`` copies) or leave
        some out, and its checks and diagnostics hold it to the mixture's shares."""
        return self.mixture is not None or self.accounting is not None

    @property
    def freezable(self) -> bool:
        """Can keep a frozen prefix of the base packing: a sequence-level ``order``, or a ``run_after``."""
        return self.level == "sequence" and (self.order is not None or self.run_after is not None)

    @property
    def ids_only(self) -> bool:
        """Its order reads only the base packing's sequence ids (``random``, ``original``): neither
        the documents nor the segments' other columns."""
        return self.level == "sequence" and self.run is None and not self.features

    @property
    def scheduled(self) -> bool:
        """Ordered before training (an ``orderings`` file to train on and export)."""
        return self.level != "training"


REGISTRY: Registry[StrategySpec] = registry.STRATEGIES  # declared in pipeline/registry.py, where the config reads it


def spec(name: str) -> StrategySpec:
    return REGISTRY.get(name)


def names(*levels: Level) -> tuple[str, ...]:
    """Strategy names of ``levels`` (all when none), in registry order."""
    return tuple(n for n, s in REGISTRY.entries().items() if not levels or s.level in levels)


def scheduled() -> dict[str, StrategySpec]:
    """The strategies ordered before training (``run_strategy`` runs them)."""
    return {n: s for n, s in REGISTRY.entries().items() if s.scheduled}


def training_time() -> tuple[str, ...]:
    """Strategies a sampler runs during training (ODM): no fixed order, nothing to export."""
    return names("training")


def reads(*levels: Level) -> tuple[str, ...]:
    """The configuration keys strategies of ``levels`` read, sorted."""
    return tuple(sorted({k for s in REGISTRY.entries().values() if not levels or s.level in levels for k in s.reads}))


def __getattr__(attr: str) -> Any:
    """Name lists derived from the registry: ``STRATEGIES`` (scheduled specs by name),
    ``SEQUENCE_LEVEL`` / ``DOCUMENT_LEVEL`` (the array APIs' names), ``SEED_FREE``."""
    entries = REGISTRY.entries()
    if attr == "STRATEGIES":
        return scheduled()
    if attr == "SEQUENCE_LEVEL":
        return tuple(n for n, s in entries.items() if s.level == "sequence" and s.order is not None)
    if attr == "DOCUMENT_LEVEL":
        return tuple(n for n, s in entries.items() if s.level == "document" and s.order is not None)
    if attr == "SEED_FREE":
        return tuple(n for n, s in entries.items() if s.seed_free)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
