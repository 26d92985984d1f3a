"""The TerRIFIC mixture stage: target set, static mixture iterations, curriculum, runs, ablation.

mixture_target -> mixture_iterations[i] -> mixture_weights ─┐
               -> mixture_curriculum ───────────────────────┴-> mixture_runs[strategy] -> mixture_ablation
Library code: ``pipeline/mixture/`` (terrific.py, loop.py, realize.py, target.py).
"""


import dagster as dg
import numpy as np
import polars as pl
import yaml
from dagster_duckdb import DuckDBResource

from assets.common import Recorder, StrataSettings, env_config
from pipeline.errors import StrataInputError
from pipeline.reports.markdown import frame_table
from pipeline.storage.atomic import write_bin, write_npy, write_parquet, write_text
from pipeline.storage.warehouse import replace_rows

ITERATION_PARTITIONS = dg.StaticPartitionsDefinition([str(i) for i in range(env_config().mixture.iterations)])
MIXTURE_STRATEGIES = ("greedy_mixture", "greedy_curriculum")
STRATEGY_PARTITIONS = dg.StaticPartitionsDefinition(list(MIXTURE_STRATEGIES))
BASELINES = ("random", "greedy")


def _dir(layout, *parts: str):
    return layout.inside("mixture", *parts)


@dg.asset(group_name="mixture", tags={"strata/order": "first"}, deps=["corpus", "tokenizer"], code_version="1", kinds={"numpy"})
def mixture_target(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """The target set V (``mixture.target_path``, else the held-out split of ``mixture.target_source``)
    split into a half that measures v and a half that scores models, plus the general held-out set.

    Writes ``mixture/target/documents.parquet`` (id, source, role, general, n_tokens, n_bytes) and
    its tokens (``tokens.bin``, ``doc_offsets.npy``, layout of the tokens asset)."""
    from evals.paloma import read_paloma_docs
    from pipeline.data.tokenizer import load_tokenizer
    from pipeline.data.tokens import tokenize_documents
    from pipeline.mixture.target import read_target_file, target_documents

    rec = Recorder(context, duckdb, {"corpus": None, "tokenizer": None})
    cfg, layout = settings.config(), settings.layout()
    has_held = layout.heldout.is_dir() and any(layout.heldout.rglob("*.jsonl.gz"))
    held = read_paloma_docs(layout.heldout) if has_held else pl.DataFrame(schema={"text": pl.String, "id": pl.String, "source": pl.String})
    target = read_target_file(cfg.mixture.target_path) if cfg.mixture.target_path else None
    docs = target_documents(held, target, cfg.mixture.target_source, cfg.seed)
    tok = load_tokenizer(layout.tokenizer)
    flat, offsets = tokenize_documents(tok, docs["text"].to_list(), progress=False)
    table = docs.drop("text").with_columns(
        n_tokens=pl.Series(np.diff(offsets) - 1), n_bytes=docs["text"].str.len_bytes().cast(pl.Int64))
    out = [write_parquet(table, _dir(layout, "target", "documents.parquet")),
           write_bin(flat, _dir(layout, "target", "tokens.bin")), write_npy(offsets, _dir(layout, "target", "doc_offsets.npy"))]
    summary = table.group_by("role", "general").agg(docs=pl.len(), tokens=pl.col("n_tokens").sum()).sort("role", "general")
    with duckdb.get_connection() as con:
        replace_rows(con, "mixture_target", summary, {})
    return rec.finish(out, {"documents": table.height, "fit": int((table["role"] == 0).sum()), "eval": int((table["role"] == 1).sum())},
                      {"target_path": cfg.mixture.target_path, "target_source": cfg.mixture.target_source, "seed": cfg.seed},
                      {"roles": dg.MetadataValue.md(frame_table(summary)),
                       "target_sources": ", ".join(sorted(table.filter(pl.col("role") < 2)["source"].unique().to_list()))})


def meta_context(cfg, layout, log=lambda msg: None):
    """The :class:`pipeline.mixture.loop.MetaContext` of the configured data root."""
    from pipeline.data.tokenizer import load_tokenizer
    from pipeline.data.tokens import open_tokens
    from pipeline.mixture.loop import make_context
    from pipeline.mixture.terrific import InfluenceSettings
    from pipeline.training.loop import TrainSettings

    m = cfg.mixture
    tok = load_tokenizer(layout.tokenizer)
    tokens, offsets = open_tokens(layout.tokens, layout.doc_offsets)
    cl = pl.read_parquet(layout.clusters).sort("doc_id")
    doc_cluster = np.full(offsets.size - 1, -1, dtype=np.int64)
    doc_cluster[cl["doc_id"].to_numpy()] = cl["cluster"].to_numpy()
    if (doc_cluster < 0).any():
        raise StrataInputError("a training document has no cluster", fix="rematerialize clusters after tokens")
    tdocs = pl.read_parquet(_dir(layout, "target", "documents.parquet"))
    ttok, toff = open_tokens(_dir(layout, "target", "tokens.bin"), _dir(layout, "target", "doc_offsets.npy"))
    ts = TrainSettings(preset=cfg.model_preset, batch_size=cfg.batch_size, max_steps=cfg.max_steps, lr=cfg.lr,
                       warmup_steps=cfg.warmup_steps, weight_decay=cfg.weight_decay, seed=cfg.seeds[0], cross_document=cfg.cross_document)
    inf = InfluenceSettings(dim=m.projection_dim, nnz=m.projection_nnz, clip=m.clip, ridge=m.ridge, score_clip=m.score_clip,
                            batch=min(8, cfg.batch_size), seed=cfg.seed)
    return make_context(tokens, offsets, doc_cluster, ttok, toff, tdocs["role"].to_numpy(), tdocs["general"].to_numpy(),
                        vocab_size=len(tok), eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, train_settings=ts, seq_len=cfg.seq_len,
                        influence=inf,
                        examples_per_cluster=m.examples_per_cluster, target_examples=m.target_examples, lam=cfg.lam,
                        length_bins=cfg.length_bins, noise=cfg.noise, max_cluster_epochs=m.max_cluster_epochs, step_size=m.step_size,
                        seed=cfg.seed,
                        log=log)


def corpus_shares(ctx) -> np.ndarray:
    """Token share of every cluster in the training documents."""
    t = np.bincount(ctx.doc_cluster, weights=ctx.doc_length, minlength=ctx.n_clusters)
    return t / t.sum()


def _iteration_file(layout, i: int):
    return _dir(layout, "iterations", f"{i}.parquet")


@dg.asset(group_name="mixture", tags={"strata/order": "first"}, deps=["tokens", "clusters", "mixture_target"],
          partitions_def=ITERATION_PARTITIONS, code_version="1", kinds={"pytorch"})
def mixture_iterations(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Static TerRIFIC iteration i: Train (fresh model on the realized mixture softmax(l_i), greedy
    order) -> Measure (Delta l at the final checkpoint; with ``mixture.static_method: terrific_avg``
    the mean Delta l over ``mixture.avg_checkpoints`` doubling checkpoints, TerRIFIC-AVG) ->
    Update (l_{i+1} = l_i + eta Delta l).
    l_0 = log corpus shares; iteration i > 0 reads iteration i-1's ``next_logit``.

    Writes ``mixture/iterations/<i>.parquet`` (iteration, cluster, logit, weight, score, delta,
    next_logit, corpus_share, selected, epochs). DuckDB ``mixture_iterations`` (same rows) and
    ``mixture_scores`` (iteration, metric, value: target_loss, heldout_loss, final_train_loss,
    measured_target_loss, clip_t, repeated_fraction)."""
    from pipeline.mixture.loop import initial_logits, static_iteration

    i = int(context.partition_key)
    rec = Recorder(context, duckdb, {"mixture_target": None, "clusters": None} | ({"mixture_iterations": str(i - 1)} if i else {}))
    cfg, layout = settings.config(), settings.layout()
    ctx = meta_context(cfg, layout, context.log.info)
    share = corpus_shares(ctx)
    if i == 0:
        logits = initial_logits(share)
    else:
        prev = _iteration_file(layout, i - 1)
        if not prev.exists():
            raise StrataInputError(f"iteration {i} needs iteration {i - 1}",
                                   fix=f"materialize mixture_iterations[{i - 1}] first (partitions run in order)")
        logits = pl.read_parquet(prev).sort("cluster")["next_logit"].to_numpy()
    it = static_iteration(ctx, logits, seed=cfg.seed, method=cfg.mixture.static_method, avg_checkpoints=cfg.mixture.avg_checkpoints)
    rows = pl.DataFrame({
        "iteration": np.full(ctx.n_clusters, i, dtype=np.int64), "cluster": np.arange(ctx.n_clusters, dtype=np.int64),
        "logit": it.logits, "weight": it.weights, "score": it.measurement.scores, "delta": it.measurement.delta,
        "next_logit": it.next_logits, "corpus_share": share,
        "selected": it.realization.table["selected"], "epochs": it.realization.table["epochs"],
    })
    metrics = {**it.scores, "final_train_loss": it.final_train_loss, "measured_target_loss": it.measurement.target_loss,
               "clip_t": it.measurement.clip_t, "repeated_fraction": it.realization.repeated_fraction}
    scores = pl.DataFrame({"iteration": [i] * len(metrics), "metric": list(metrics), "value": [float(v) for v in metrics.values()]})
    out = write_parquet(rows, _iteration_file(layout, i))
    with duckdb.get_connection() as con:
        replace_rows(con, "mixture_iterations", rows, {"iteration": i})
        replace_rows(con, "mixture_scores", scores, {"iteration": i})
    top = rows.sort("delta", descending=True).head(5).select("cluster", "weight", "score", "delta")
    return rec.finish([out], {"clusters": ctx.n_clusters}, {"iteration": i, **cfg.mixture.model_dump()},
                      {**{k: float(v) for k, v in metrics.items()}, "measured_at_steps": list(it.steps),
                       "top_clusters": dg.MetadataValue.md(frame_table(top))})


@dg.asset(group_name="mixture", tags={"strata/order": "first"}, deps=["mixture_iterations"], code_version="1", kinds={"parquet"})
def mixture_weights(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """The learned static mixture: ``mixture/weights.parquet`` (iteration, cluster, logit, weight) for
    every iteration's trained-on logits plus iteration = ``iterations`` (the final update, the
    mixture ``greedy_mixture`` uses), and ``mixture/weights.png``. DuckDB ``mixture_weights``."""
    from pipeline.mixture.loop import softmax
    from pipeline.reports.mixture_plots import plot_weights

    rec = Recorder(context, duckdb, {"mixture_iterations": "*"})
    cfg, layout = settings.config(), settings.layout()
    n = cfg.mixture.iterations
    missing = [i for i in range(n) if not _iteration_file(layout, i).exists()]
    if missing:
        raise StrataInputError(f"mixture iterations {missing} are not materialized",
                               fix="materialize every mixture_iterations partition, in order")
    its = pl.concat([pl.read_parquet(_iteration_file(layout, i)) for i in range(n)]).sort("iteration", "cluster")
    last = its.filter(pl.col("iteration") == n - 1)
    final = pl.DataFrame({"iteration": np.full(last.height, n, dtype=np.int64), "cluster": last["cluster"],
                          "logit": last["next_logit"], "weight": softmax(last["next_logit"].to_numpy())})
    weights = pl.concat([its.select("iteration", "cluster", "logit", "weight"), final])
    out = write_parquet(weights, _dir(layout, "weights.parquet"))
    with duckdb.get_connection() as con:
        replace_rows(con, "mixture_weights", weights, {})
        scores = con.sql("SELECT iteration, metric, value FROM mixture_scores ORDER BY iteration").pl()
    fig = plot_weights(weights, scores, _dir(layout, "weights.png"), corpus_share=last["corpus_share"].to_numpy())
    w = final["weight"].to_numpy()
    share = last["corpus_share"].to_numpy()
    return rec.finish([out, fig], {"rows": weights.height}, {"iterations": n},
                      {"max_weight_ratio_to_corpus": float((w / np.maximum(share, 1e-12)).max()),
                       "figure": dg.MetadataValue.md(f"![weights]({fig})")})


@dg.asset(group_name="mixture", tags={"strata/order": "first"}, deps=["tokens", "clusters", "mixture_target"], code_version="1",
          kinds={"pytorch"})
def mixture_curriculum(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """TerRIFIC curricula (Algorithm 1): ``mixture.curriculum_iterations`` meta-iterations from
    f_0 = log corpus shares, each training on the curriculum-greedy order of f_t with
    ``mixture.checkpoints`` log-uniform checkpoints. Writes ``mixture/curriculum.yaml`` (the knots
    format of ``greedy_curriculum``), ``mixture/curriculum.parquet`` (meta_iteration, knot, tokens,
    cluster, logit, weight), ``mixture/curriculum.png``. DuckDB ``mixture_curriculum`` and
    ``mixture_curriculum_steps`` (meta_iteration, checkpoint, tokens, step, cluster, score, delta)."""
    from pipeline.mixture.loop import constant_curriculum, curriculum_iteration, initial_logits, knots_document
    from pipeline.reports.mixture_plots import plot_curriculum

    rec = Recorder(context, duckdb, {"mixture_target": None, "clusters": None})
    cfg, layout = settings.config(), settings.layout()
    m = cfg.mixture
    ctx = meta_context(cfg, layout, context.log.info)
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
        it = curriculum_iteration(ctx, cur, t, m.checkpoints, m.min_fraction, cfg.seed)
        for b, (s, step) in enumerate(zip(it.s_b, it.steps)):
            step_rows.append(pl.DataFrame({"meta_iteration": t, "checkpoint": b, "tokens": float(np.exp(s)), "step": int(step),
                                           "cluster": np.arange(ctx.n_clusters, dtype=np.int64), "score": it.scores_at[b],
                                           "delta": it.deltas[b]}))
        score_rows += [{"meta_iteration": t, "metric": k, "value": float(v)} for k, v in it.scores.items()]
        score_rows.append({"meta_iteration": t, "metric": "repeated_fraction", "value": it.realization.repeated_fraction})
        cur = it.next_curriculum
        knots(t + 1, cur)
        context.log.info(f"meta-iteration {t}: {it.scores}")
    table = pl.concat(knot_rows)
    out = [write_text(yaml.safe_dump(knots_document(cur), sort_keys=False), _dir(layout, "curriculum.yaml")),
           write_parquet(table, _dir(layout, "curriculum.parquet"))]
    out.append(plot_curriculum(cur, n_min, n_max, _dir(layout, "curriculum.png")))
    with duckdb.get_connection() as con:
        replace_rows(con, "mixture_curriculum", table, {})
        if step_rows:
            replace_rows(con, "mixture_curriculum_steps", pl.concat(step_rows), {})
        if score_rows:
            replace_rows(con, "mixture_curriculum_scores", pl.DataFrame(score_rows), {})
    return rec.finish(out, {"knots": int(cur.log_tokens.size), "meta_iterations": m.curriculum_iterations},
                      {k: getattr(m, k) for k in ("curriculum_iterations", "checkpoints", "min_fraction", "step_size")}
                      | {"seed": cfg.seed},
                      {"figure": dg.MetadataValue.md(f"![curriculum]({out[-1]})")})


@dg.asset(group_name="mixture", tags={"strata/order": "last"}, deps=["mixture_weights", "mixture_curriculum"],
          partitions_def=STRATEGY_PARTITIONS, code_version="1", kinds={"pytorch"})
def mixture_runs(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Train on the learned mixture, for every training seed: ``greedy_mixture`` realizes the final
    static weights (greedy order), ``greedy_curriculum`` the learned curriculum (curriculum-greedy
    order of ``mixture/curriculum.yaml``). Same model, budget and optimizer as ``training_runs``.

    Writes ``mixture/orderings/<strategy>.parquet`` (position, sequence_id of the pool packing
    ``mixture/pool_segments.parquet``; ids repeat where the mixture repeats data),
    ``mixture/realization/<strategy>.parquet`` (cluster, weight, supply, selected, share, epochs,
    max_copies) and ``mixture/runs/<strategy>/seed<seed>/model``. DuckDB ``mixture_realization``."""
    from dataclasses import replace

    from pipeline.mixture.loop import curriculum_order, static_order
    from pipeline.ordering.curriculum import load_curriculum
    from pipeline.storage.atomic import atomic_dir
    from pipeline.training.loop import train

    strategy = context.partition_key
    rec = Recorder(context, duckdb, {"mixture_weights": None, "mixture_curriculum": None})
    cfg, layout = settings.config(), settings.layout()
    ctx = meta_context(cfg, layout, context.log.info)
    if strategy == "greedy_mixture":
        w = (pl.read_parquet(_dir(layout, "weights.parquet"))
             .filter(pl.col("iteration") == cfg.mixture.iterations).sort("cluster")["weight"].to_numpy())
        order, real = static_order(ctx, w, cfg.seed)
    else:
        cur = load_curriculum(_dir(layout, "curriculum.yaml"), ctx.n_clusters)
        order, real = curriculum_order(ctx, cur, cfg.seed)
    from pipeline.data.tokenizer import load_tokenizer

    tok = load_tokenizer(layout.tokenizer)
    out = [write_parquet(ctx.pool_segments, _dir(layout, "pool_segments.parquet")),
           write_parquet(pl.DataFrame({"position": np.arange(order.size, dtype=np.int64), "sequence_id": order}),
                         _dir(layout, "orderings", f"{strategy}.parquet")),
           write_parquet(real.table, _dir(layout, "realization", f"{strategy}.parquet"))]
    finals = {}
    for seed in cfg.seeds:
        model, log = train(ctx.pool, order, ctx.vocab_size, ctx.eos_id, ctx.pad_id, replace(ctx.train, seed=seed), progress=False)
        run = _dir(layout, "runs", strategy, f"seed{seed}")
        with atomic_dir(run / "model") as tmp:
            model.save_pretrained(str(tmp))
            tok.save_pretrained(str(tmp))
        log_df = pl.DataFrame(log).drop("tokens_per_s").with_columns(strategy=pl.lit(strategy), seed=pl.lit(seed))
        out.append(write_parquet(log_df, run / "log.parquet"))
        finals[seed] = float(log_df["loss"].tail(max(1, len(log) // 10)).mean())
    with duckdb.get_connection() as con:
        replace_rows(con, "mixture_realization", real.table.with_columns(strategy=pl.lit(strategy)), {"strategy": strategy})
    return rec.finish(out, {"sequences": int(order.size)}, {"strategy": strategy, "seeds": cfg.seeds},
                      {"repeated_fraction": real.repeated_fraction, "max_epochs": float(real.table["epochs"].max()),
                       "final_loss": dg.MetadataValue.json(finals),
                       "realization": dg.MetadataValue.md(frame_table(real.table))})


@dg.asset(group_name="mixture", tags={"strata/order": "last"}, deps=["mixture_runs", "training_runs"], code_version="1", kinds={"duckdb"})
def mixture_ablation(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Rows ``random``, ``greedy`` (the ``training_runs`` models, when materialized),
    ``greedy_mixture`` and ``greedy_curriculum`` scored the same way: mean token loss on the target
    set's scoring half (``target_loss``) and on the general held-out set (``heldout_loss``), mean ±
    std over seeds. DuckDB ``mixture_ablation`` (strategy, metric, mean, std, n_seeds) and
    ``mixture/report.md`` with the figures."""
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.devices import device
    from pipeline.mixture.loop import evaluate

    rec = Recorder(context, duckdb, {"mixture_runs": "*", "training_runs": "*"})
    cfg, layout = settings.config(), settings.layout()
    ctx = meta_context(cfg, layout)
    rows = []
    for strategy in (*BASELINES, *MIXTURE_STRATEGIES):
        for seed in cfg.seeds:
            base = layout.run_dir(strategy, seed) if strategy in BASELINES else _dir(layout, "runs", strategy, f"seed{seed}")
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
    with duckdb.get_connection() as con:
        replace_rows(con, "mixture_ablation", table, {})
    wide = table.with_columns(cell=pl.format("{} ± {}", pl.col("mean").round(4), pl.col("std").round(4))).pivot(
        on="metric", index="strategy", values="cell")
    md = ("# Learned mixture ablation (TerRIFIC curricula)\n\nMean token loss (nats) of each model on the target set's "
          "scoring half and on the general held-out set; mean ± std over seeds.\n\n" + frame_table(wide)
          + "\n\n![weights](weights.png)\n\n![curriculum](curriculum.png)\n")
    out = write_text(md, _dir(layout, "report.md"))
    return rec.finish([out], {"rows": table.height}, {"seeds": cfg.seeds}, {"report": dg.MetadataValue.md(md)})
