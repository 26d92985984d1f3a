"""The mixture stage: the target set (``mixture_target``), static TerRIFIC iterations
(``mixture_iterations``) and the learned weights (``mixture_weights``), TerRIFIC curricula
(``mixture_curriculum``), the runs on the learned mixture (``mixture_runs``) and their ablation
against the baselines (``mixture_ablation``).

Every function reads its inputs under ``<root>/mixture/`` and those of the upstream stages,
writes its files under ``<root>/mixture/`` and its DuckDB rows through ``connect``, and returns a
:class:`pipeline.stage.StageResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import polars as pl
import yaml

from pipeline.data.paloma import read_paloma_docs
from pipeline.data.tokenizer import load_tokenizer
from pipeline.data.tokens import open_tokens, tokenize_documents
from pipeline.devices import device
from pipeline.errors import StrataInputError
from pipeline.mixture import loop
from pipeline.mixture.loop import (
    constant_curriculum,
    curriculum_iteration,
    curriculum_order,
    evaluate,
    initial_logits,
    knots_document,
    make_context,
    softmax,
    static_order,
)
from pipeline.mixture.plots import plot_curriculum, plot_weights
from pipeline.mixture.target import read_target_file, target_documents
from pipeline.mixture.terrific import InfluenceSettings
from pipeline.ordering.curriculum import load_curriculum
from pipeline.render.markdown import frame_table
from pipeline.stage import Connect, Markdown, StageParams, StageResult, setting
from pipeline.storage.atomic import atomic_dir, write_bin, write_npy, write_parquet, write_text
from pipeline.storage.warehouse import replace_rows
from pipeline.training.loop import TrainConfig, TrainSettings, train

MIXTURE_STRATEGIES = ("greedy_mixture", "greedy_curriculum")  # the partitions of mixture_runs
BASELINES = ("random", "greedy")  # the training_runs models mixture_ablation scores too


@dataclass(frozen=True)
class MixtureParams(StageParams):
    """The mixture stage's settings (every mixture asset): the ``mixture:`` group, and the training
    and greedy settings its models and orders use. (The mixture assets' code versions do not cover
    parameters: they are not in ``assets/params.py``'s table.)"""

    mixture: Any = setting()  # pipeline.config.MixtureConfig
    seed: int = setting()
    seeds: list[int] = setting()
    train: TrainConfig = setting(convert=TrainConfig)  # the proxy models train as training_runs' do
    seq_len: int = setting()
    lam: float = setting()
    length_bins: int = setting()
    noise: float = setting()


def mixture_dir(layout, *parts: str) -> Path:
    """A path under ``<root>/mixture/``."""
    return layout.inside("mixture", *parts)


def iteration_file(layout, i: int) -> Path:
    """``mixture/iterations/<i>.parquet``, the rows of static iteration ``i``."""
    return mixture_dir(layout, "iterations", f"{i}.parquet")


def target_set(layout, params: MixtureParams, connect: Connect) -> StageResult:
    """The target set V (``mixture.target_path``, else the held-out split of ``mixture.target_source``)
    split into a half that measures v and a half that scores models, plus the general held-out set.
    Writes ``mixture/target/documents.parquet`` (id, source, role, general, n_tokens, n_bytes), its
    tokens (``tokens.bin``, ``doc_offsets.npy``, layout of the tokens asset) and the DuckDB table
    ``mixture_target`` (docs and tokens per role)."""
    has_held = layout.heldout.is_dir() and any(layout.heldout.rglob("*.jsonl.gz"))
    held = read_paloma_docs(layout.heldout) if has_held else pl.DataFrame(schema={"text": pl.String, "id": pl.String, "source": pl.String})
    target = read_target_file(params.mixture.target_path) if params.mixture.target_path else None
    docs = target_documents(held, target, params.mixture.target_source, params.seed)
    tok = load_tokenizer(layout.tokenizer)
    flat, offsets = tokenize_documents(tok, docs["text"].to_list(), progress=False)
    table = docs.drop("text").with_columns(
        n_tokens=pl.Series(np.diff(offsets) - 1), n_bytes=docs["text"].str.len_bytes().cast(pl.Int64))
    out = [write_parquet(table, mixture_dir(layout, "target", "documents.parquet")),
           write_bin(flat, mixture_dir(layout, "target", "tokens.bin")),
           write_npy(offsets, mixture_dir(layout, "target", "doc_offsets.npy"))]
    summary = table.group_by("role", "general").agg(docs=pl.len(), tokens=pl.col("n_tokens").sum()).sort("role", "general")
    with connect() as con:
        replace_rows(con, "mixture_target", summary, {})
    return StageResult(
        outputs=out, rows={"documents": table.height, "fit": int((table["role"] == 0).sum()), "eval": int((table["role"] == 1).sum())},
        parameters={"target_path": params.mixture.target_path, "target_source": params.mixture.target_source, "seed": params.seed},
        facts={"roles": Markdown(frame_table(summary)),
               "target_sources": ", ".join(sorted(table.filter(pl.col("role") < 2)["source"].unique().to_list()))})


def learned_weights(layout, params: MixtureParams, connect: Connect) -> StageResult:
    """The learned static mixture: ``mixture/weights.parquet`` (iteration, cluster, logit, weight) for
    every iteration's trained-on logits plus iteration = ``mixture.iterations`` (the final update, the
    mixture ``greedy_mixture`` uses), ``mixture/weights.png`` and the DuckDB table ``mixture_weights``."""
    n = params.mixture.iterations
    missing = [i for i in range(n) if not iteration_file(layout, i).exists()]
    if missing:
        raise StrataInputError(f"mixture iterations {missing} are not materialized",
                               fix="materialize every mixture_iterations partition, in order")
    its = pl.concat([pl.read_parquet(iteration_file(layout, i)) for i in range(n)]).sort("iteration", "cluster")
    last = its.filter(pl.col("iteration") == n - 1)
    final = pl.DataFrame({"iteration": np.full(last.height, n, dtype=np.int64), "cluster": last["cluster"],
                          "logit": last["next_logit"], "weight": softmax(last["next_logit"].to_numpy())})
    weights = pl.concat([its.select("iteration", "cluster", "logit", "weight"), final])
    out = write_parquet(weights, mixture_dir(layout, "weights.parquet"))
    with connect() as con:
        replace_rows(con, "mixture_weights", weights, {})
        scores = con.sql("SELECT iteration, metric, value FROM mixture_scores ORDER BY iteration").pl()
    fig = plot_weights(weights, scores, mixture_dir(layout, "weights.png"), corpus_share=last["corpus_share"].to_numpy())
    w = final["weight"].to_numpy()
    share = last["corpus_share"].to_numpy()
    return StageResult(outputs=[out, fig], rows={"rows": weights.height}, parameters={"iterations": n},
                       facts={"max_weight_ratio_to_corpus": float((w / np.maximum(share, 1e-12)).max()),
                              "figure": Markdown(f"![weights]({fig})")})


def meta_context(params: MixtureParams, layout, log: Callable[[str], None] = lambda msg: None):
    """The :class:`pipeline.mixture.loop.MetaContext` of the configured data root."""
    m = params.mixture
    tok = load_tokenizer(layout.tokenizer)
    tokens, offsets = open_tokens(layout.tokens, layout.doc_offsets)
    cl = pl.read_parquet(layout.clusters).sort("doc_id")
    doc_cluster = np.full(offsets.size - 1, -1, dtype=np.int64)
    doc_cluster[cl["doc_id"].to_numpy()] = cl["cluster"].to_numpy()
    if (doc_cluster < 0).any():
        raise StrataInputError("a training document has no cluster", fix="rematerialize clusters after tokens")
    tdocs = pl.read_parquet(mixture_dir(layout, "target", "documents.parquet"))
    ttok, toff = open_tokens(mixture_dir(layout, "target", "tokens.bin"), mixture_dir(layout, "target", "doc_offsets.npy"))
    # epochs 0: each proxy run is max_steps long, over the stream the mixture's loop builds for it
    ts = replace(TrainSettings.from_config(params.train, params.seeds[0]), epochs=0)
    inf = InfluenceSettings(dim=m.projection_dim, nnz=m.projection_nnz, clip=m.clip, ridge=m.ridge, score_clip=m.score_clip,
                            batch=min(8, params.train.batch_size), seed=params.seed)
    return make_context(tokens, offsets, doc_cluster, ttok, toff, tdocs["role"].to_numpy(), tdocs["general"].to_numpy(),
                        vocab_size=len(tok), eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, train_settings=ts, seq_len=params.seq_len,
                        influence=inf,
                        examples_per_cluster=m.examples_per_cluster, target_examples=m.target_examples, lam=params.lam,
                        length_bins=params.length_bins, noise=params.noise, max_cluster_epochs=m.max_cluster_epochs, step_size=m.step_size,
                        seed=params.seed,
                        log=log)


def corpus_shares(ctx) -> np.ndarray:
    """Token share of every cluster in the training documents."""
    t = np.bincount(ctx.doc_cluster, weights=ctx.doc_length, minlength=ctx.n_clusters)
    return t / t.sum()


def static_iteration(layout, params: MixtureParams, i: int, connect: Connect, log: Callable[[str], None] = print) -> StageResult:
    """Static TerRIFIC iteration ``i``: Train (fresh model on the realized mixture softmax(l_i),
    greedy order) -> Measure (Delta l at the final checkpoint, or with ``mixture.static_method:
    terrific_avg`` the mean over ``mixture.avg_checkpoints`` doubling checkpoints) -> Update
    (l_{i+1} = l_i + eta Delta l). l_0 = log corpus shares; i > 0 reads iteration i-1's
    ``next_logit`` (its ``deps``: the previous iteration's partition, read beside the declared
    inputs). Writes ``mixture/iterations/<i>.parquet`` and the DuckDB tables
    ``mixture_iterations`` (same rows) and ``mixture_scores`` (iteration, metric, value)."""
    ctx = meta_context(params, layout, log)
    share = corpus_shares(ctx)
    if i == 0:
        logits = loop.initial_logits(share)
    else:
        prev = iteration_file(layout, i - 1)
        if not prev.exists():
            raise StrataInputError(f"iteration {i} needs iteration {i - 1}",
                                   fix=f"materialize mixture_iterations[{i - 1}] first (partitions run in order)")
        logits = pl.read_parquet(prev).sort("cluster")["next_logit"].to_numpy()
    it = loop.static_iteration(ctx, logits, seed=params.seed, method=params.mixture.static_method,
                               avg_checkpoints=params.mixture.avg_checkpoints)
    rows = pl.DataFrame({
        "iteration": np.full(ctx.n_clusters, i, dtype=np.int64), "cluster": np.arange(ctx.n_clusters, dtype=np.int64),
        "logit": it.logits, "weight": it.weights, "score": it.measurement.scores, "delta": it.measurement.delta,
        "next_logit": it.next_logits, "corpus_share": share,
        "selected": it.realization.table["selected"], "epochs": it.realization.table["epochs"],
    })
    metrics = {**it.scores, "final_train_loss": it.final_train_loss, "measured_target_loss": it.measurement.target_loss,
               "clip_t": it.measurement.clip_t, "repeated_fraction": it.realization.repeated_fraction}
    scores = pl.DataFrame({"iteration": [i] * len(metrics), "metric": list(metrics), "value": [float(v) for v in metrics.values()]})
    out = write_parquet(rows, iteration_file(layout, i))
    with connect() as con:
        replace_rows(con, "mixture_iterations", rows, {"iteration": i})
        replace_rows(con, "mixture_scores", scores, {"iteration": i})
    top = rows.sort("delta", descending=True).head(5).select("cluster", "weight", "score", "delta")
    return StageResult(outputs=[out], rows={"clusters": ctx.n_clusters}, parameters={"iteration": i, **params.mixture.model_dump()},
                       facts={**{k: float(v) for k, v in metrics.items()}, "measured_at_steps": list(it.steps),
                              "top_clusters": Markdown(frame_table(top))},
                       deps={"mixture_iterations": str(i - 1)} if i else {})


def curriculum(layout, params: MixtureParams, connect: Connect, log: Callable[[str], None] = print) -> StageResult:
    """TerRIFIC curricula (Algorithm 1): ``mixture.curriculum_iterations`` meta-iterations from
    f_0 = log corpus shares, each training on the curriculum-greedy order of f_t with
    ``mixture.checkpoints`` log-uniform checkpoints. Writes ``mixture/curriculum.yaml`` (the knots
    format of ``greedy_curriculum``), ``mixture/curriculum.parquet`` (meta_iteration, knot, tokens,
    cluster, logit, weight), ``mixture/curriculum.png`` and the DuckDB tables ``mixture_curriculum``,
    ``mixture_curriculum_steps`` (meta_iteration, checkpoint, tokens, step, cluster, score, delta)
    and ``mixture_curriculum_scores``."""
    m = params.mixture
    ctx = meta_context(params, layout, log)
    n_max = ctx.budget_tokens
    n_min = m.min_fraction * n_max
    cur = constant_curriculum(initial_logits(corpus_shares(ctx)), n_min, n_max)
    knot_rows, step_rows, score_rows = [], [], []

    def knots(t: int, c) -> None:
        for q, (s, row) in enumerate(zip(c.log_tokens, c.logits)):
            p = np.exp(row - row.max())
            knot_rows.append(pl.DataFrame({"meta_iteration": t, "knot": q, "tokens": float(np.exp(s)),
                                           "cluster": np.arange(row.size, dtype=np.int64),
                                           "logit": row, "weight": p / p.sum()}))

    knots(0, cur)
    for t in range(m.curriculum_iterations):
        it = curriculum_iteration(ctx, cur, t, m.checkpoints, m.min_fraction, params.seed)
        for b, (s, step) in enumerate(zip(it.s_b, it.steps)):
            step_rows.append(pl.DataFrame({"meta_iteration": t, "checkpoint": b, "tokens": float(np.exp(s)), "step": int(step),
                                           "cluster": np.arange(ctx.n_clusters, dtype=np.int64), "score": it.scores_at[b],
                                           "delta": it.deltas[b]}))
        score_rows += [{"meta_iteration": t, "metric": k, "value": float(v)} for k, v in it.scores.items()]
        score_rows.append({"meta_iteration": t, "metric": "repeated_fraction", "value": it.realization.repeated_fraction})
        cur = it.next_curriculum
        knots(t + 1, cur)
        log(f"meta-iteration {t}: {it.scores}")
    table = pl.concat(knot_rows)
    out = [write_text(yaml.safe_dump(knots_document(cur), sort_keys=False), mixture_dir(layout, "curriculum.yaml")),
           write_parquet(table, mixture_dir(layout, "curriculum.parquet"))]
    out.append(plot_curriculum(cur, n_min, n_max, mixture_dir(layout, "curriculum.png")))
    with connect() as con:
        replace_rows(con, "mixture_curriculum", table, {})
        if step_rows:
            replace_rows(con, "mixture_curriculum_steps", pl.concat(step_rows), {})
        if score_rows:
            replace_rows(con, "mixture_curriculum_scores", pl.DataFrame(score_rows), {})
    return StageResult(outputs=out, rows={"knots": int(cur.log_tokens.size), "meta_iterations": m.curriculum_iterations},
                       parameters={k: getattr(m, k) for k in ("curriculum_iterations", "checkpoints", "min_fraction", "step_size")}
                       | {"seed": params.seed},
                       facts={"figure": Markdown(f"![curriculum]({out[-1]})")})


def mixture_run(layout, params: MixtureParams, strategy: str, connect: Connect, log: Callable[[str], None] = print) -> StageResult:
    """Train on the learned mixture, for every training seed: ``greedy_mixture`` realizes the final
    static weights (greedy order), ``greedy_curriculum`` the learned curriculum (curriculum-greedy
    order of ``mixture/curriculum.yaml``). Same model, budget and optimizer as ``training_runs``.
    Writes ``mixture/pool_segments.parquet``, ``mixture/orderings/<strategy>.parquet``,
    ``mixture/realization/<strategy>.parquet``, ``mixture/runs/<strategy>/seed<seed>/`` (model,
    ``log.parquet``) and the DuckDB table ``mixture_realization``."""
    ctx = meta_context(params, layout, log)
    if strategy == "greedy_mixture":
        w = (pl.read_parquet(mixture_dir(layout, "weights.parquet"))
             .filter(pl.col("iteration") == params.mixture.iterations).sort("cluster")["weight"].to_numpy())
        order, real = static_order(ctx, w, params.seed)
    else:
        cur = load_curriculum(mixture_dir(layout, "curriculum.yaml"), ctx.n_clusters)
        order, real = curriculum_order(ctx, cur, params.seed)
    tok = load_tokenizer(layout.tokenizer)
    out = [write_parquet(ctx.pool_segments, mixture_dir(layout, "pool_segments.parquet")),
           write_parquet(pl.DataFrame({"position": np.arange(order.size, dtype=np.int64), "sequence_id": order}),
                         mixture_dir(layout, "orderings", f"{strategy}.parquet")),
           write_parquet(real.table, mixture_dir(layout, "realization", f"{strategy}.parquet"))]
    finals = {}
    for seed in params.seeds:
        model, steps = train(ctx.pool, order, ctx.vocab_size, ctx.eos_id, ctx.pad_id, replace(ctx.train, seed=seed), progress=False)
        run = mixture_dir(layout, "runs", strategy, f"seed{seed}")
        with atomic_dir(run / "model") as tmp:
            model.save_pretrained(str(tmp))
            tok.save_pretrained(str(tmp))
        log_df = pl.DataFrame(steps).drop("tokens_per_s").with_columns(strategy=pl.lit(strategy), seed=pl.lit(seed))
        out.append(write_parquet(log_df, run / "log.parquet"))
        finals[seed] = float(log_df["loss"].tail(max(1, len(steps) // 10)).mean())
    with connect() as con:
        replace_rows(con, "mixture_realization", real.table.with_columns(strategy=pl.lit(strategy)), {"strategy": strategy})
    return StageResult(outputs=out, rows={"sequences": int(order.size)}, parameters={"strategy": strategy, "seeds": params.seeds},
                       facts={"repeated_fraction": real.repeated_fraction, "max_epochs": float(real.table["epochs"].max()),
                              "final_loss": finals, "realization": Markdown(frame_table(real.table))})


def mixture_ablation(layout, params: MixtureParams, connect: Connect) -> StageResult:
    """Score ``random``, ``greedy`` (the ``training_runs`` models, when materialized),
    ``greedy_mixture`` and ``greedy_curriculum`` the same way: mean token loss on the target set's
    scoring half (``target_loss``) and on the general held-out set (``heldout_loss``), mean ± std
    over seeds. Writes the DuckDB table ``mixture_ablation`` (strategy, metric, mean, std, n_seeds)
    and ``mixture/report.md`` with the figures."""
    import torch
    from transformers import AutoModelForCausalLM


    ctx = meta_context(params, layout)
    rows: list[dict[str, Any]] = []
    for strategy in (*BASELINES, *MIXTURE_STRATEGIES):
        for seed in params.seeds:
            base = layout.run_dir(strategy, seed) if strategy in BASELINES else mixture_dir(layout, "runs", strategy, f"seed{seed}")
            if not (base / "model").exists():
                continue
            model = AutoModelForCausalLM.from_pretrained(str(base / "model")).to(device()).eval()
            with torch.no_grad():
                scores = evaluate(ctx, model)
            rows += [{"strategy": strategy, "seed": seed, "metric": k, "value": v} for k, v in scores.items()]
    if not rows:
        raise StrataInputError("no trained models to score", fix="materialize mixture_runs (and training_runs for random/greedy)")
    long = pl.DataFrame(rows)
    table = long.group_by("strategy", "metric", maintain_order=True).agg(
        mean=pl.col("value").mean(), std=pl.col("value").std().fill_null(0.0), n_seeds=pl.len())
    with connect() as con:
        replace_rows(con, "mixture_ablation", table, {})
    wide = table.with_columns(cell=pl.format("{} ± {}", pl.col("mean").round(4), pl.col("std").round(4))).pivot(
        on="metric", index="strategy", values="cell")
    md = ("# Learned mixture ablation (TerRIFIC curricula)\n\nMean token loss (nats) of each model on the target set's "
          "scoring half and on the general held-out set; mean ± std over seeds.\n\n" + frame_table(wide)
          + "\n\n![weights](weights.png)\n\n![curriculum](curriculum.png)\n")
    out = write_text(md, mixture_dir(layout, "report.md"))
    return StageResult(outputs=[out], rows={"rows": table.height}, parameters={"seeds": params.seeds}, facts={"report": Markdown(md)})
