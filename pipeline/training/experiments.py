"""The claims' own training runs (``strata claims --full``): what each run trains on, and how long.

- **Epoch boundary** (Diversity-ordered training): a seeded sample of the corpus's documents large
  enough for ``n_sequences`` sequences, in two orders — ``topical``, the sample grouped by topic
  (by source, in the corpus's order of sources and documents, as a corpus concatenated source by
  source comes; by cluster when the corpus has one source), the kind of original order the paper
  starts from, and ``stratified``, the paper's stratified greedy on the same documents — each
  packed by concat and trained for ``epochs`` passes over the same ``n_sequences`` sequences in
  the same order (``TrainSettings.epochs``). Grouping matters: a uniform sample of a corpus keeps
  its order's coarse drift but not its runs of neighbouring documents, and a topic must last a
  few steps for the model to settle on it before the stream restarts.
- **Packing** (Packing & shuffling): all training documents in a seeded order, packed by concat with
  each atom size (x seq_len, the atoms shuffled) and by padding with atom = seq_len, trained in
  packing order (the atom shuffle is the shuffle) with plain causal attention over the whole
  sequence, as the paper trains GPT-2. Concat runs take ``max_steps``; the padding run takes as
  many more steps as it needs to see the same number of non-padding tokens ("at equal tokens").
  This is ``claims: {packing_protocol: equal_tokens}``.
- **Packing in the paper's protocol** (``claims: {packing_protocol: paper}``, the default;
  :func:`paper_packing_arms`): Packing & shuffling compare *final perplexity at the end of 2
  epochs* (Appendix A.6: the last epoch cut into 100 slices of 1% each, the average perplexity of
  each slice; the final perplexity is the last slice's, the ranking the mean rank over the 100
  slices), with the mean document length above the MSL. Each seed draws a seeded sample of
  documents, in a seeded order, for ``n_sequences`` concat sequences of MSL tokens; every arm
  (concat with each atom, padding with atom = MSL) packs that sample and trains ``epochs``
  passes over its own packing (padding's epochs hold more steps, as in the paper). The MSL is
  ``claims.packing_seq_len`` or, at 0, the largest power of two at most half the corpus's mean
  document length (the paper's MSL 64 for WikiText's 143 tokens), so the condition holds;
  an MSL at or above the mean document length is refused. Every step's per-sequence training
  loss is kept (``train(on_losses=...)``), so slices are cut by sequence position within the epoch.

Each seed draws its own sample / order and initializes the model; both arms of a seed share them.
The documents' clusters are those at ``claims.k`` (:func:`pipeline.represent.clusters.diversity_clusters`),
which Diversity-ordered training's table in the claims reads too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.names import packing_name
from pipeline.ordering.documents import stratified_order
from pipeline.packing.pack import pack
from pipeline.training.loop import TrainSettings


@dataclass(frozen=True)
class Arm:
    """One run of a claim experiment: its sequences (``segments``), their order and its settings."""

    experiment: str  # epoch_boundary | packing | packing_epochs
    arm: str  # topical | stratified | concat-x<a> | padding-x1
    seed: int
    order: np.ndarray
    segments: pl.DataFrame
    settings: TrainSettings
    info: dict
    seq_len: int = 0  # the sequences' length when it is not the config's seq_len (packing_epochs: the MSL)

    @property
    def steps(self) -> int:
        return self.settings.steps(self.order.size)


def topic_groups(source: np.ndarray, cluster: np.ndarray) -> tuple[np.ndarray, str]:
    """Per-document topic label of the topical order: the source (codes in order of first appearance),
    or the cluster when there is a single source; and which of the two it is."""
    names = list(dict.fromkeys(np.asarray(source).tolist()))
    if len(names) > 1:
        code = {n: i for i, n in enumerate(names)}
        return np.array([code[v] for v in np.asarray(source).tolist()], dtype=np.int64), "source"
    return np.asarray(cluster, dtype=np.int64), "cluster"


def epoch_boundary_arms(lengths: np.ndarray, cluster: np.ndarray, topic: np.ndarray, seq_len: int, n_sequences: int, epochs: int,
                        seeds: list[int], base: TrainSettings, topic_kind: str = "source") -> list[Arm]:
    """The ``topical`` and ``stratified`` arms of every seed (module docstring).

    ``lengths``, ``cluster`` (what stratified balances) and ``topic`` (what the topical order groups
    by) are per training document, in doc_id order (the corpus's order).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    cluster = np.asarray(cluster, dtype=np.int64)
    topic = np.asarray(topic, dtype=np.int64)
    need = (n_sequences + 1) * seq_len
    out = []
    for seed in seeds:
        pick = np.random.default_rng(seed).permutation(lengths.size)
        take = int(np.searchsorted(np.cumsum(lengths[pick]), need)) + 1
        docs = np.sort(pick[:take])
        orders = {"topical": docs[np.lexsort((docs, topic[docs]))], "stratified": docs[stratified_order(cluster[docs], lengths[docs])]}
        packed = {arm: pack("concat", o, lengths, seq_len).segments for arm, o in orders.items()}
        n = min(n_sequences, *(int(p["sequence_id"].max()) + 1 for p in packed.values()))
        if n < base.batch_size:
            raise StrataInputError(f"the corpus fills {n} sequences of {seq_len} tokens, less than one batch",
                                   fix="lower batch_size or claims.epoch_sequences, or use a larger corpus")
        info = {"sequences": n, "documents": int(docs.size), "topic": topic_kind, "topic_groups": int(np.unique(topic[docs]).size)}
        for arm in orders:
            out.append(Arm("epoch_boundary", arm, seed, np.arange(n), packed[arm].filter(pl.col("sequence_id") < n),
                           replace(base, seed=seed, epochs=epochs, heldout_every=0), info))
    return out


def padding_steps(concat_steps: int, seq_len: int, segments: pl.DataFrame, n_sequences: int) -> int:
    """Steps a padded packing needs to see as many non-padding tokens as ``concat_steps`` steps of
    full sequences: the nearest whole number of steps (within half a step's tokens)."""
    filled = float(segments["n_tokens"].cast(pl.Int64).sum() + segments["eos_added"].sum()) / n_sequences
    return max(1, int(round(concat_steps * seq_len / filled)))


def packing_arms(lengths: np.ndarray, seq_len: int, atoms: list[float], seeds: list[int], base: TrainSettings) -> list[Arm]:
    """``concat-x<a>`` for every atom size and ``padding-x1`` for every seed (module docstring)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    out = []
    for seed in seeds:
        order = np.random.default_rng(seed).permutation(lengths.size)
        settings = replace(base, seed=seed, epochs=0, cross_document=True)
        specs = [("concat", float(a)) for a in atoms] + [("padding", 1.0)]
        for variant, atom in specs:
            p = pack(variant, order, lengths, seq_len, atom_multiple=atom, seed=seed)
            steps = base.max_steps if variant == "concat" else padding_steps(base.max_steps, seq_len, p.segments, p.n_sequences)
            info = {"sequences": p.n_sequences, "padding_fraction": p.tokens_padding / p.tokens_packed,
                    "mean_doc_tokens": float(lengths.mean()), "seq_len": seq_len}
            out.append(Arm("packing", packing_name(variant, atom), seed, np.arange(p.n_sequences), p.segments,
                           replace(settings, max_steps=steps), info))
    return out


PAPER_SLICES = 100  # Packing & shuffling, Appendix A.6: the last epoch in 100 slices of 1%


def protocol_seq_len(mean_doc_tokens: float, seq_len: int, requested: int = 0) -> int:
    """The MSL of the paper-protocol packing runs: ``requested``, or (0) the largest power of two at
    most half the mean document length, at most ``seq_len`` and at least 8. Refused when the
    paper's condition (mean document length > MSL) would not hold."""
    if requested:
        msl = int(requested)
    else:
        msl = int(2 ** math.floor(math.log2(max(mean_doc_tokens / 2, 1.0))))
        msl = max(8, min(msl, int(seq_len)))
    if not mean_doc_tokens > msl:
        raise StrataInputError(
            f"the paper's packing protocol needs the mean document length ({mean_doc_tokens:.0f} tokens) above the MSL ({msl})",
            fix="set claims.packing_seq_len below the mean document length (0 picks one), or claims.packing_protocol: equal_tokens")
    return msl


def paper_packing_arms(lengths: np.ndarray, seq_len: int, atoms: list[float], seeds: list[int], base: TrainSettings,
                       n_sequences: int = 512, epochs: int = 2, requested_seq_len: int = 0) -> list[Arm]:
    """``concat-x<a>`` for every atom size and ``padding-x1``, per seed, in Packing & shuffling's
    protocol (module docstring): ``epochs`` passes over a seeded sample of about ``n_sequences``
    sequences of the MSL, every arm on the same documents in the same order."""
    lengths = np.asarray(lengths, dtype=np.int64)
    msl = protocol_seq_len(float(lengths.mean()), seq_len, requested_seq_len)
    need = (n_sequences + 1) * msl
    out = []
    for seed in seeds:
        pick = np.random.default_rng(seed).permutation(lengths.size)
        take = int(np.searchsorted(np.cumsum(lengths[pick]), need)) + 1
        docs = pick[:take]
        settings = replace(base, seed=seed, epochs=epochs, cross_document=True, heldout_every=0)
        for variant, atom in [("concat", float(a)) for a in atoms] + [("padding", 1.0)]:
            p = pack(variant, docs, lengths, msl, atom_multiple=atom, seed=seed)
            per_epoch = (p.n_sequences // base.batch_size) * base.batch_size
            if per_epoch < PAPER_SLICES:
                raise StrataInputError(f"{packing_name(variant, atom)} packs {p.n_sequences} sequences of {msl} tokens, an epoch of "
                                       f"{per_epoch} trained sequences: fewer than the paper's {PAPER_SLICES} slices",
                                       fix="raise claims.packing_sequences (or lower batch_size)")
            info = {"sequences": p.n_sequences, "padding_fraction": p.tokens_padding / p.tokens_packed, "documents": int(docs.size),
                    "mean_doc_tokens": float(lengths[docs].mean()), "corpus_mean_doc_tokens": float(lengths.mean()), "seq_len": msl}
            out.append(Arm("packing_epochs", packing_name(variant, atom), seed, np.arange(p.n_sequences), p.segments, settings, info, msl))
    return out


def sequence_loss_rows(step: int, batch_size: int, steps_per_epoch: int, loss_sums: np.ndarray, tokens: np.ndarray) -> dict:
    """One step's per-sequence training losses as columns: ``epoch``, ``index`` (the sequence's
    position in its epoch), ``epoch_size`` (sequences an epoch trains), ``loss_sum``, ``tokens``."""
    n = len(loss_sums)
    return {"step": np.full(n, step, dtype=np.int64), "epoch": np.full(n, step // steps_per_epoch, dtype=np.int64),
            "index": (step % steps_per_epoch) * batch_size + np.arange(n, dtype=np.int64),
            "epoch_size": np.full(n, steps_per_epoch * batch_size, dtype=np.int64),
            "loss_sum": np.asarray(loss_sums, dtype=np.float64), "tokens": np.asarray(tokens, dtype=np.int64)}

