"""The training stage: one model trained on a strategy's stream for one seed (``training_runs``),
mixture fidelity at a frozen checkpoint (``gradient_analyses``), the evaluations of a trained
model (``evaluations``) and the training runs only the claims need (``claim_runs``).

A training-time strategy (ODM) declares its sampler in its spec (``StrategySpec.sampler``): the
run trains on what the sampler serves instead of an order, and nothing here names a strategy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import polars as pl

from pipeline.data.paloma import read_paloma_docs
from pipeline.data.tokenizer import load_tokenizer
from pipeline.data.tokens import open_tokens
from pipeline.errors import StrataInputError
from pipeline.ordering import strategies
from pipeline.ordering.stage import OrderStageParams, seeded_ordering
from pipeline.packing.pack import SequenceStore
from pipeline.render.markdown import frame_table
from pipeline.represent.clusters import diversity_clusters
from pipeline.stage import Connect, Markdown, StageParams, StageResult, setting
from pipeline.storage.atomic import atomic_dir, write_parquet
from pipeline.storage.documents import document_features
from pipeline.storage.layout import Store
from pipeline.storage.warehouse import latest_data_version, replace_rows
from pipeline.training.checkpoint import Checkpointing
from pipeline.training.consumed import consumed_diversity
from pipeline.training.experiments import (
    epoch_boundary_arms,
    packing_arms,
    paper_packing_arms,
    sequence_loss_rows,
    topic_groups,
)
from pipeline.training.gradients import fidelity_rows, gradient_stable_ranks, mixture_fidelity
from pipeline.training.heldout import heldout_batch
from pipeline.training.heldout_store import heldout_store
from pipeline.training.loop import TrainConfig, TrainSettings, checkpoint_steps, epoch_boundary_jumps, stream_ids, train

FROZEN_FRACTION = 0.2  # the frozen checkpoint of mixture fidelity: a model at 20% of a run's steps
CLAIM_STRATEGIES = ("greedy", "random")  # their stable ranks are compared by the claims (claims_probe_batches each)
RUN_INPUTS = (("corpus", None), ("tokens", None), ("clusters", None), ("sequences", None))  # + the run's orderings partition


@dataclass(frozen=True)
class TrainRunParams(StageParams):
    """One training run's settings (``training_runs``). A training-time strategy's sampler takes
    them (``StrategySpec.sampler``): ODM reads its group ``odm`` (the odm spec's ``reads``)."""

    train: TrainConfig = setting(convert=TrainConfig)
    seq_len: int = setting()
    probe_fractions: list[float] = setting()
    probe_batches: int = setting()
    stable_rank_matrix: str = setting()
    heldout_docs: int = setting()
    claims_probe_batches: int = setting("claims.probe_batches")  # the runs the claims pair probe this many batches
    checkpoint_every: int = setting(versioned=False)  # a resumed run's outputs are byte-identical
    odm: Any = setting(versioned=False)  # pipeline.config.OdmConfig: the odm sampler's (its spec's reads)
    ordering: OrderStageParams = setting(versioned=False, convert=OrderStageParams)  # a seed's re-run order (orderings')


@dataclass(frozen=True)
class GradientParams(StageParams):
    """Mixture fidelity's settings (``gradient_analyses``); the frozen model trains with the runs' settings."""

    fidelity_chunks: int = setting()
    fidelity_sequences_per_chunk: int = setting()
    batch_size: int = setting()
    cross_document: bool = setting()
    train: TrainConfig = setting(versioned=False, convert=TrainConfig)  # training_runs' parameters
    seed: int = setting(versioned=False)
    seeds: list[int] = setting(versioned=False)
    strategies: list[str] = setting(versioned=False)


@dataclass(frozen=True)
class ClaimRunsParams(StageParams):
    """The claims' own training runs (``claim_runs``); they train with training_runs' settings and
    cluster at ``claims.k`` with the configured k-means (:func:`pipeline.represent.clusters.diversity_clusters`)."""

    claims_k: int = setting("claims.k")
    claims_seeds: list[int] = setting("claims.seeds")
    claims_epochs: int = setting("claims.epochs")
    claims_epoch_sequences: int = setting("claims.epoch_sequences")
    claims_atoms: list[float] = setting("claims.atoms")
    claims_packing_protocol: str = setting("claims.packing_protocol")
    claims_packing_epochs: int = setting("claims.packing_epochs")
    claims_packing_sequences: int = setting("claims.packing_sequences")
    claims_packing_seq_len: int = setting("claims.packing_seq_len")
    train: TrainConfig = setting(versioned=False, convert=TrainConfig)  # training_runs' parameters
    seq_len: int = setting(versioned=False)
    heldout_docs: int = setting(versioned=False)
    seed: int = setting(versioned=False)
    k: int = setting(versioned=False)  # the pipeline's clusters (claims.k 0 = k), and their k-means settings
    kmeans_iters: int = setting(versioned=False)
    pca_components: int = setting(versioned=False)
    kmeans_spherical: bool = setting(versioned=False)
    kmeans_max_points_per_centroid: int = setting(versioned=False)


def probe_count(params: TrainRunParams, strategy: str) -> int:
    """Stable-rank probe batches per checkpoint: ``claims_probe_batches`` for the runs the claims
    pair (greedy, random), ``probe_batches`` for the others."""
    return max(params.probe_batches, params.claims_probe_batches) if strategy in CLAIM_STRATEGIES else params.probe_batches


def sequence_store(layout, segments: pl.DataFrame, tok):
    """The sequences of ``segments`` read from the token store, padded with the tokenizer's pad id."""
    tokens, offsets = open_tokens(layout.tokens, layout.doc_offsets)
    return SequenceStore(tokens, offsets, segments, Store(layout).sequences.seq_len, pad_id=tok.pad_token_id)


def load_heldout_batch(layout, heldout_docs: int, tok):
    """The fixed held-out batch (same documents for every run): its first ``heldout_docs`` documents, or None without held-out documents."""
    if not layout.heldout.exists() or not any(layout.heldout.rglob("*.jsonl.gz")):
        return None
    docs = read_paloma_docs(layout.heldout)  # sources in turn, so a small batch covers every source
    docs = docs.with_columns(r=pl.int_range(pl.len()).over("source")).sort("r", "source", maintain_order=True)
    units = [f"{s}/{i}" for s, i in zip(docs["source"].to_list(), docs["id"].to_list())]
    return heldout_batch(docs["text"].to_list(), units, tok, Store(layout).sequences.seq_len, heldout_docs)


def doc_clusters(layout) -> np.ndarray:
    """Each document's cluster, indexed by doc_id (``clusters.parquet``)."""
    return pl.read_parquet(layout.clusters).sort("doc_id")["cluster"].to_numpy()


def train_run(layout, params: TrainRunParams, strategy: str, seed: int, connect: Connect, checkpoint_params: dict[str, Any],
              log: Callable[[str], None] = print) -> StageResult:
    """Train the same model (same budget, optimizer, batch and sequence length for every strategy)
    on ``strategy``'s stream for ``seed``: its ordering (re-run with ``seed`` when the order depends
    on it), or what its spec's sampler picks online. Writes ``runs/<strategy>/seed<seed>/`` (model,
    ``log.parquet``, ``stream.parquet``, ``heldout_curve.parquet``, a sampler's mixture) and the
    DuckDB tables ``train_log``, ``consumed_metrics``, ``heldout_curve``, ``stable_rank``,
    ``epoch_jumps`` and a sampler's mixture table, if it names one (ODM's ``odm_mixture``).
    ``checkpoint_params`` (with the inputs' data versions) keys the resumable checkpoint
    ``ckpt.pt``, removed once the outputs are written."""

    spec = strategies.spec(strategy)
    order, segments = seeded_ordering(layout, params.ordering, strategy, seed)
    tok = load_tokenizer(layout.tokenizer)
    held = load_heldout_batch(layout, params.heldout_docs, tok)
    curve: list[dict] = []

    def on_heldout(steps_done: int, tokens: int, losses: np.ndarray) -> None:
        curve.extend({"step": steps_done, "tokens_seen": tokens, "unit": u, "loss": float(v)} for u, v in zip(held.units, losses))

    store = sequence_store(layout, segments, tok)
    ts = TrainSettings.from_config(params.train, seed)
    run_dir = layout.run_dir(strategy, seed)
    n_steps = ts.steps(store.n_sequences if spec.sampler is not None else order.size)
    sampler = spec.sampler(segments, doc_clusters(layout), n_steps, seed, params) if spec.sampler is not None else None
    probes: list[pl.DataFrame] = []
    ckpt = _run_checkpointing(run_dir, params, connect, strategy, checkpoint_params, curve, probes, log)
    fractions, probe = _stable_rank_probes(params, strategy, store, order, sampler, n_steps, probes)
    model, log_rows = train(store, None if sampler else order, len(tok), tok.eos_token_id, tok.pad_token_id, ts,
                            sampler=sampler, checkpoints=sorted(fractions), on_checkpoint=probe, heldout=held,
                            on_heldout=on_heldout, checkpointing=ckpt)
    with atomic_dir(run_dir / "model") as tmp:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
    outputs, log_df, curve_df, jumps = _write_run(layout, connect, params, strategy, seed, log_rows, curve, order, segments, n_steps,
                                                  sampler, probes)
    ckpt.remove()
    last = curve_df.filter(pl.col("step") == pl.col("step").max()) if curve_df.height else None
    return StageResult(
        outputs=[run_dir / "model" / "model.safetensors", *outputs],
        rows={"steps": len(log_rows), "tokens": int(log_df["tokens_seen"].max())},
        parameters={**ts.__dict__, "strategy": strategy},
        facts={"heldout_batch_loss": float(last["loss"].mean()) if last is not None else float("nan"),
               "tokens_per_s": float(log_df["tokens_per_s"].median()), "params": sum(p.numel() for p in model.parameters()),
               "epoch_jumps_flagged": int(jumps["flagged"].sum()) if jumps.height else 0,
               "resumed_from_step": ckpt.resumed_from if ckpt.resumed_from is not None else 0},
    )


def _run_checkpointing(run_dir, params: TrainRunParams, connect: Connect, strategy: str, checkpoint_params: dict[str, Any],
                       curve: list[dict], probes: list[pl.DataFrame], log: Callable[[str], None]):
    """The run's resumable checkpoint (``ckpt.pt``), keyed by its inputs' data versions and
    ``checkpoint_params``; it saves and restores the held-out ``curve`` and the stable-rank
    ``probes`` gathered so far beside the model."""

    def restore(state: dict) -> None:
        curve[:], probes[:] = state["curve"], state["probes"]

    with connect() as con:
        inputs = {f"{a}[{p}]" if p else a: latest_data_version(con, a, p) for a, p in (*RUN_INPUTS, ("orderings", strategy))}
    return Checkpointing(run_dir / "ckpt.pt", params.checkpoint_every, key={"inputs": inputs, "params": checkpoint_params},
                         state=lambda: {"curve": curve, "probes": probes}, restore=restore, log=log)


def _stable_rank_probes(params: TrainRunParams, strategy: str, store, order: np.ndarray, sampler, n_steps: int,
                        probes: list[pl.DataFrame]):
    """``({step: fraction of the run}, probe)``: at the steps of ``probe_fractions`` the training
    loop calls ``probe(steps_done, model)``, which appends the stable ranks of the gradients of
    :func:`probe_count` batches to ``probes``."""

    fractions = {checkpoint_steps(n_steps, [f])[0]: f for f in params.probe_fractions}
    n_probe = probe_count(params, strategy)

    def probe(steps_done: int, model) -> None:
        if sampler is not None:  # a sampler's next batches do not exist yet: its last served batches
            stream, start, epochs = sampler.served_ids(), max(0, steps_done - n_probe), 0
        else:  # the batches the schedule serves next (past the end of the run: the ones it would)
            stream, start, epochs = order, steps_done, params.train.epochs
        rows = gradient_stable_ranks(model, store, stream, range(start, start + n_probe), params.train.batch_size,
                                     params.train.cross_document, epochs, matrix=params.stable_rank_matrix)
        probes.append(rows.with_columns(checkpoint=pl.lit(f"{round(fractions[steps_done] * 100)}%")))

    return fractions, probe


def _write_run(layout, connect: Connect, params: TrainRunParams, strategy: str, seed: int, log_rows: list[dict], curve: list[dict],
               order: np.ndarray, segments: pl.DataFrame, n_steps: int, sampler, probes: list[pl.DataFrame]):
    """A trained run's files (``log.parquet``, ``stream.parquet``, ``heldout_curve.parquet``) and
    DuckDB rows (:func:`_write_tables`): ``(outputs, log frame, held-out curve, epoch jumps)``."""

    run_dir = layout.run_dir(strategy, seed)
    key = {"strategy": strategy, "seed": seed}
    log_df = pl.DataFrame(log_rows).with_columns(strategy=pl.lit(strategy), seed=pl.lit(seed))
    served = sampler.served_ids() if sampler is not None else stream_ids(order, n_steps, params.train.batch_size, params.train.epochs)
    # tokens_per_s is wall-clock throughput: kept in DuckDB, left out of the (deterministic) artifact
    outputs = [write_parquet(log_df.drop("tokens_per_s"), run_dir / "log.parquet"),
               write_parquet(pl.DataFrame({"position": np.arange(served.size), "sequence_id": served}), run_dir / "stream.parquet")]
    jumps = pl.DataFrame(epoch_boundary_jumps(log_rows), infer_schema_length=None)
    curve_df = pl.DataFrame(curve, schema={"step": pl.Int64, "tokens_seen": pl.Int64, "unit": pl.String, "loss": pl.Float64})
    curve_df = curve_df.with_columns(strategy=pl.lit(strategy), seed=pl.lit(seed))
    outputs.append(write_parquet(curve_df, run_dir / "heldout_curve.parquet"))
    outputs += _write_tables(layout, connect, key, log_df, served, segments, params.train.batch_size, curve_df, probes, jumps, sampler,
                             run_dir)
    return outputs, log_df, curve_df, jumps


def _write_tables(layout, connect: Connect, key: dict, log_df: pl.DataFrame, served: np.ndarray, segments: pl.DataFrame,
                  batch_size: int, curve_df: pl.DataFrame, probes: list[pl.DataFrame], jumps: pl.DataFrame, sampler,
                  run_dir: Path) -> list[Path]:
    """A run's DuckDB rows (replacing the rows of its strategy and seed) and, for a sampler that
    names a ``table``, its ``mixture_rows()`` there and in ``<table>.parquet``; returns the files written."""
    def keyed(df: pl.DataFrame) -> pl.DataFrame:
        return df.with_columns(strategy=pl.lit(key["strategy"]), seed=pl.lit(key["seed"]))

    diversity = consumed_diversity(served, segments, doc_clusters(layout), batch_size)
    consumed = pl.DataFrame([{"metric": k, "value": v} for k, v in diversity.items()])
    outputs = []
    with connect() as con:
        replace_rows(con, "train_log", log_df, key)
        replace_rows(con, "consumed_metrics", keyed(consumed), key)
        if curve_df.height:
            replace_rows(con, "heldout_curve", curve_df, key)
        if probes:
            replace_rows(con, "stable_rank", keyed(pl.concat(probes)), key)
        if jumps.height:
            replace_rows(con, "epoch_jumps", keyed(jumps), key)
        if getattr(sampler, "table", None):  # a sampler that logs a mixture per step (ODM's odm_mixture)
            mixture = keyed(sampler.mixture_rows())
            outputs.append(write_parquet(mixture, run_dir / f"{sampler.table}.parquet"))
            replace_rows(con, sampler.table, mixture, key)
    return outputs


def gradient_analyses(layout, params: GradientParams, connect: Connect) -> StageResult:
    """Mixture fidelity (TerRIFIC curricula) at one frozen checkpoint trained on non-overlapping
    data: a model trained on the held-out split (same settings and init as the runs) for 20% of the
    runs' steps, saved under ``gradients/frozen``; the cosine similarity of the gradients of
    ``fidelity_chunks`` consecutive chunks of each strategy's stream (``gradients/fidelity.parquet``,
    DuckDB ``fidelity``). A strategy trained by a sampler has no schedule beyond the stream it served."""
    tok = load_tokenizer(layout.tokenizer)
    if not layout.heldout.exists() or not any(layout.heldout.rglob("*.jsonl.gz")):
        raise StrataInputError("no held-out documents to train the frozen checkpoint on", path=layout.heldout,
                               fix="set heldout_fraction > 0 (mixture fidelity needs a model trained on documents no schedule holds)")
    held = heldout_store(read_paloma_docs(layout.heldout)["text"].to_list(), tok, Store(layout).sequences.seq_len)
    frozen_steps = checkpoint_steps(params.train.max_steps, [FROZEN_FRACTION])[0]
    model, _ = train(held, np.random.default_rng(params.seed).permutation(held.n_sequences), len(tok), tok.eos_token_id,
                     tok.pad_token_id, replace(TrainSettings.from_config(params.train, params.seeds[0]), epochs=0), stop_after=frozen_steps)
    frozen = layout.inside("gradients", "frozen")
    with atomic_dir(frozen) as tmp:
        model.save_pretrained(str(tmp))
    frames, matrices = [], {}
    for strategy in params.strategies:
        stream_path = layout.run_dir(strategy, params.seeds[0]) / "stream.parquet"
        if not stream_path.exists():
            continue
        ordering = Store(layout).ordering(strategy)
        sampled = strategies.spec(strategy).sampler is not None
        stream = pl.read_parquet(stream_path).sort("position")["sequence_id"].to_numpy() if sampled else ordering.order
        n_chunks = min(params.fidelity_chunks, stream.size)
        if n_chunks < 2:
            continue
        m = mixture_fidelity(model, sequence_store(layout, ordering.segments, tok), stream, n_chunks=n_chunks,
                             sequences_per_chunk=min(params.fidelity_sequences_per_chunk, max(1, stream.size // n_chunks)),
                             batch_size=params.batch_size, cross_document=params.cross_document)
        matrices[strategy] = m
        frames.append(fidelity_rows(m).with_columns(strategy=pl.lit(strategy)))
    empty = {"chunk_i": pl.Int64, "chunk_j": pl.Int64, "cosine": pl.Float64, "strategy": pl.String}
    table = pl.concat(frames) if frames else pl.DataFrame(schema=empty)
    out = write_parquet(table, layout.inside("gradients", "fidelity.parquet"))
    with connect() as con:
        replace_rows(con, "fidelity", table, {})
    off = {s: float(m[~np.eye(m.shape[0], dtype=bool)].mean()) for s, m in matrices.items()}
    return StageResult(outputs=[out, frozen / "model.safetensors"], rows={"strategies": len(matrices)},
                       parameters={"chunks": params.fidelity_chunks, "frozen_steps": frozen_steps, "frozen_sequences": held.n_sequences},
                       facts={"mean_offdiagonal_cosine": off})


def train_claim_runs(layout, params: ClaimRunsParams, connect: Connect, log: Callable[[str], None] = print) -> StageResult:
    """The training runs only the claims need (``pipeline/training/experiments.py``): multi-epoch
    runs of a corpus sample in a topical and in the stratified order (the epoch-boundary anomaly)
    and runs per packing (each atom size of ``claims_atoms`` and padding, in the paper's protocol
    or at equal tokens), for every seed of ``claims_seeds``. Writes ``claim_runs/log.parquet``,
    ``arms.parquet`` and, where measured, ``heldout.parquet`` and ``sequences.parquet``, and the
    DuckDB tables ``claim_runs_log``, ``claim_runs_arms``, ``claim_runs_heldout`` and ``claim_runs_sequences``."""

    arms, k = _claim_arms(layout, params)
    tok = load_tokenizer(layout.tokenizer)
    held = load_heldout_batch(layout, params.heldout_docs, tok)
    tokens, offsets = open_tokens(layout.tokens, layout.doc_offsets)
    total = sum(a.steps for a in arms)
    logs, units, info, seq_losses = [], [], [], []
    done, t0 = 0, time.perf_counter()
    for i, arm in enumerate(arms):
        eta = f", about {(time.perf_counter() - t0) / done * (total - done) / 60:.1f} min left" if done else ""
        log(f"claim run {i + 1}/{len(arms)}: {arm.experiment} {arm.arm} seed {arm.seed}, {arm.steps} steps "
            f"({done}/{total} steps done{eta})")
        run_log, final, per_seq = _train_claim_arm(arm, tokens, offsets, tok, held, params.seq_len)
        done += len(run_log)
        key = {"experiment": arm.experiment, "arm": arm.arm, "seed": arm.seed}
        if per_seq:
            seq_losses.append(pl.concat([pl.DataFrame(r) for r in per_seq]).with_columns(**{c: pl.lit(v) for c, v in key.items()}))
        logs.append(pl.DataFrame(run_log).drop("tokens_per_s").with_columns(**{c: pl.lit(v) for c, v in key.items()}))
        if final:
            last = max(final)
            units.append(pl.DataFrame({"unit": held.units, "loss": final[last]}).with_columns(
                step=pl.lit(last), **{c: pl.lit(v) for c, v in key.items()}))
        info.append({**key, "steps": len(run_log), "tokens": int(run_log[-1]["tokens_seen"]), "k": k, **arm.info})
    log_df, arms_df = pl.concat(logs), pl.DataFrame(info, infer_schema_length=None)
    outputs = _write_claim_runs(layout, connect, log_df, arms_df, units, seq_losses)
    return StageResult(outputs=outputs, rows={"runs": len(arms), "steps": total},
                       parameters={"claims_seeds": params.claims_seeds, "claims_epochs": params.claims_epochs,
                                   "claims_atoms": params.claims_atoms, "claims_packing_protocol": params.claims_packing_protocol},
                       facts={"runs": Markdown(frame_table(arms_df)), "minutes": round((time.perf_counter() - t0) / 60, 2)})


def _claim_arms(layout, params: ClaimRunsParams) -> tuple[list, int]:
    """The claims' runs (``pipeline/training/experiments.py``) and the k of the clusters their
    documents are grouped by: the epoch-boundary arms, then the packing arms (in the paper's
    protocol or at equal tokens)."""

    docs = document_features(layout)
    lengths = docs["stream_length"].to_numpy()
    cluster, k = diversity_clusters(layout, params, docs)
    base = TrainSettings.from_config(params.train, params.seed)
    topic, kind = topic_groups(docs["source"].to_numpy(), cluster)
    if params.claims_packing_protocol == "paper":
        packing = paper_packing_arms(lengths, params.seq_len, params.claims_atoms, params.claims_seeds, base,
                                     params.claims_packing_sequences, params.claims_packing_epochs, params.claims_packing_seq_len)
    else:
        packing = packing_arms(lengths, params.seq_len, params.claims_atoms, params.claims_seeds, base)
    arms = epoch_boundary_arms(lengths, cluster, topic, params.seq_len, params.claims_epoch_sequences, params.claims_epochs,
                               params.claims_seeds, base, kind) + packing
    return arms, k


def _train_claim_arm(arm, tokens, offsets, tok, held, seq_len: int) -> tuple[list[dict], dict[int, np.ndarray], list[dict]]:
    """One arm trained: its log, the held-out batch's losses by step (packing arms), its
    per-sequence losses (the paper's packing protocol)."""

    store = SequenceStore(tokens, offsets, arm.segments, arm.seq_len or seq_len, pad_id=tok.pad_token_id)
    final: dict[int, np.ndarray] = {}
    scored = held if arm.experiment == "packing" else None
    per_seq: list[dict] = []
    per_epoch = arm.order.size // arm.settings.batch_size
    keep = (lambda step, _ids, sums, n: per_seq.append(sequence_loss_rows(step, arm.settings.batch_size, per_epoch, sums, n))
            ) if arm.experiment == "packing_epochs" else None
    _, run_log = train(store, arm.order, len(tok), tok.eos_token_id, tok.pad_token_id, arm.settings, heldout=scored,
                       on_heldout=lambda step, _tokens, losses: final.update({step: losses}), on_losses=keep)
    return run_log, final, per_seq


def _write_claim_runs(layout, connect: Connect, log_df: pl.DataFrame, arms_df: pl.DataFrame, units: list[pl.DataFrame],
                      seq_losses: list[pl.DataFrame]) -> list:
    """``claim_runs/`` and its DuckDB tables: every run's log and arm, and the held-out and
    per-sequence losses where some arm measured them (else their table is dropped, not left stale)."""

    out_dir = layout.inside("claim_runs")
    outputs = [write_parquet(log_df, out_dir / "log.parquet"), write_parquet(arms_df, out_dir / "arms.parquet")]
    with connect() as con:
        replace_rows(con, "claim_runs_log", log_df, {})
        replace_rows(con, "claim_runs_arms", arms_df, {})
        for name, frames in (("heldout", units), ("sequences", seq_losses)):  # measured by some arms only: else no stale table
            if frames:
                table = pl.concat(frames)
                replace_rows(con, f"claim_runs_{name}", table, {})
                outputs.append(write_parquet(table, out_dir / f"{name}.parquet"))
            else:
                con.execute(f"DROP TABLE IF EXISTS claim_runs_{name}")
    return outputs
