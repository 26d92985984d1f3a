"""evaluations and ablation_report: lm-eval suites per trained model, then the strategy x metric table."""


from pathlib import Path

import dagster as dg
import numpy as np
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.params import PARAM_CLASSES, asset_config
from assets.common import RUN_PARTITIONS, TRAIN_POOL, Recorder, StrataSettings, run_key
from assets.on_ray import run_on_ray
from pipeline.devices import device
from pipeline.reports.markdown import frame_table
from pipeline.storage.atomic import write_parquet, write_text
from pipeline.reports.claims import CLAIM_TABLES, claims_report_section
from pipeline.reports.tables import ablation_table, render_report
from pipeline.reports.visual import image_markdown
from pipeline.storage.warehouse import replace_rows


EvaluationsParams = PARAM_CLASSES["evaluations"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="ablation", deps=["training_runs"], partitions_def=RUN_PARTITIONS, code_version="3", kinds={"parquet"},
          pool=TRAIN_POOL)
def evaluations(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
                config: EvaluationsParams) -> dg.MaterializeResult:
    """Evaluate the partition's model on every eval suite whose input is there (``evals/suites/``):
    lm-eval rolling log-likelihood (word/byte perplexity, bits per byte) on the held-out split (per
    source, Paloma-style), and when configured WikiText-2, a real Paloma directory and DCLM-core
    (llm-foundry scoring, centered accuracy, Core, gold bits-per-byte). Rows go to
    ``evals/<strategy>.parquet`` and DuckDB table ``eval_results``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evals.run import evaluate
    from evals.suites import ordered

    if (on_ray := run_on_ray(context, settings)) is not None:
        return on_ray
    strategy, seed = run_key(context)
    rec = Recorder(context, duckdb, {"training_runs": context.partition_key})
    cfg, layout = asset_config(context, settings, config), settings.layout()
    model_dir = layout.run_dir(strategy, seed) / "model"
    dev = device()
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).to(dev).eval()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    units: list[dict] = []
    suites = ordered()
    rows = evaluate(
        model, tok, {s.name: s.input(cfg, layout) for s in suites}, limit=cfg.eval_limit, device=dev,
        work_dir=layout.root / "lm_eval", seed=cfg.seed, units=units,
        options=cfg.subset(sorted({k for s in suites for k in s.reads})),
    )
    df = pl.DataFrame(rows).with_columns(strategy=pl.lit(strategy), seed=pl.lit(seed))
    out = write_parquet(df, layout.eval_file(strategy, seed))
    per_doc = pl.DataFrame(units, schema={"metric": pl.String, "unit": pl.String, "value": pl.Float64})
    per_doc = per_doc.with_columns(strategy=pl.lit(strategy), seed=pl.lit(seed))
    out_units = write_parquet(per_doc, layout.eval_file(strategy, seed).with_suffix(".units.parquet"))
    with duckdb.get_connection() as con:
        replace_rows(con, "eval_results", df, {"strategy": strategy, "seed": seed})
        if per_doc.height:
            replace_rows(con, "eval_units", per_doc, {"strategy": strategy, "seed": seed})
    table = frame_table(df.select("suite", "task", "metric", "value"))
    return rec.finish([out, out_units], {"results": df.height, "units": per_doc.height}, {"strategy": strategy, "seed": seed, "limit": cfg.eval_limit},
                      {"results": dg.MetadataValue.md(table)})


AblationReportParams = PARAM_CLASSES["ablation_report"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="ablation", deps=["evaluations", "training_runs", "gradient_analyses", "claims"], code_version="5", kinds={"duckdb"})
def ablation_report(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
                    config: AblationReportParams) -> dg.MaterializeResult:
    """Strategy x metric table (the fixed held-out batch's final loss and every evaluation
    metric, mean ± std over seeds) in DuckDB ``ablation``; the difference of every strategy to
    ``random`` with a paired-bootstrap 95% interval over held-out documents and seeds, its
    significance and the minimum detectable effect in ``ablation_delta``; the power of the run and
    the run a 0.5% difference needs in ``ablation_power``; the consumed-stream diversity table;
    ``report.md``, opening with the positive control (``cluster_sorted``) and the power statement,
    with the power figure, held-out loss-vs-tokens curves (seed bands), training curves, stable
    ranks, the mixture fidelity heatmaps and the ODM mixture under ``report/``."""
    from evals.paloma import read_paloma_docs
    from pipeline.names import POSITIVE_CONTROL
    from pipeline.reports.stats import control_verdict, delta_table, mde_by_checkpoint, power_table
    from pipeline.reports.tables import higher_is_better, run_units

    cfg = asset_config(context, settings, config)
    rec = Recorder(context, duckdb, {"evaluations": "*", "training_runs": "*", "gradient_analyses": None, "claims": None})
    layout = settings.layout()
    names = ("train_log", "eval_results", "eval_units", "heldout_curve", "consumed_metrics", "stable_rank", "fidelity", "odm_mixture", "epoch_jumps")
    with duckdb.get_connection() as con:
        tables = {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        read = {t: con.sql(f"SELECT * FROM {t}").pl() for t in names if t in tables}
        claim_tables = {t: con.sql(f"SELECT * FROM {t}").pl() for t in CLAIM_TABLES if t in tables}
    train_log = read["train_log"]
    strategies = [s for s in cfg.strategies if s in set(train_log["strategy"])]
    seeds = set(cfg.seeds)
    mine = {t: df.filter(pl.col("strategy").is_in(strategies) & pl.col("seed").is_in(seeds)) if "seed" in df.columns
            else df.filter(pl.col("strategy").is_in(strategies)) for t, df in read.items()}
    units = run_units(mine.get("heldout_curve"), mine.get("eval_results"), mine.get("eval_units"))
    table = ablation_table(units)
    deltas = delta_table(units, "random", cfg.bootstrap_samples, cfg.seed, higher_is_better)
    verdict = control_verdict(deltas, POSITIVE_CONTROL)
    heldout_available = read_paloma_docs(layout.heldout).height if any(layout.heldout.rglob("*.jsonl.gz")) else None
    power = power_table(units, "random", POSITIVE_CONTROL, max_units=heldout_available,
                        tokens_per_run=cfg.max_steps * cfg.batch_size * cfg.seq_len)
    diversity = mine.get("consumed_metrics")
    with duckdb.get_connection() as con:
        replace_rows(con, "ablation", table, {})
        replace_rows(con, "ablation_delta", deltas, {})
        con.execute("DROP TABLE IF EXISTS ablation_power")  # wholly derived: its columns follow this code's POWER_SCHEMA
        replace_rows(con, "ablation_power", power, {})
    figures = {}
    if power.filter(pl.col("strategy") == "pooled").height:
        from pipeline.reports.power_plots import plot_power

        checkpoints = mde_by_checkpoint(mine["heldout_curve"]) if "heldout_curve" in mine else pl.DataFrame()
        figures["power"] = plot_power(power, checkpoints, layout.inside("report", "power.png"))
    figures |= training_figures(mine, layout.inside("report"), cfg.seeds[0])
    jumps = mine.get("epoch_jumps")
    flagged = jumps.filter(pl.col("flagged")) if jumps is not None and jumps.height else None
    extra = "\n## Figures\n\n" + "\n".join(f"![{n}](report/{p.name})" for n, p in figures.items()) + "\n"
    if flagged is not None and flagged.height:
        extra += "\n## Epoch-boundary jumps (Diversity-ordered training)\n\n" + frame_table(flagged) + "\n"
    claims_md, claim_figures = claims_report_section(claim_tables.get, base=layout.root)
    if "ablation_campaign" in tables:  # the latest `strata ablate` campaign: verdicts and its intervals round by round
        from pipeline.reports.ablate_report import campaign_markdown, plot_campaign

        with duckdb.get_connection() as con:
            campaign = con.sql("SELECT * FROM ablation_campaign WHERE campaign = (SELECT arg_max(campaign, created_at) "
                               "FROM ablation_campaign) ORDER BY round, strategy").pl()
        figures["ablation_campaign"] = plot_campaign(campaign, layout.inside("report", "ablation_campaign.png"))
        extra += "\n" + campaign_markdown(campaign, "ablation_campaign.png")
    md = render_report(table, strategies=strategies, extra=extra, deltas=deltas, diversity=diversity, power=power, claims=claims_md)
    outputs = [write_text(md, layout.report), write_parquet(deltas, layout.inside("report", "ablation_delta.parquet")),
               write_parquet(power, layout.inside("report", "ablation_power.parquet"))]
    ui = (render_report(table, strategies=strategies, deltas=deltas, diversity=diversity, power=power,
                        claims=claims_md.split("\n![")[0])
          + "\n\n".join(image_markdown(p, n) for n, p in figures.items())
          + "\n\n" + "\n\n".join(image_markdown(p, n) for n, p in claim_figures.items()))
    significant = deltas.filter(pl.col("significant")).height if deltas.height else 0
    plan = power.filter(pl.col("strategy") == "pooled").to_dicts()
    return rec.finish([*outputs, *figures.values()],
                      {"strategies": len(strategies), "rows": table.height, "deltas": deltas.height, "power": power.height},
                      {"strategies": strategies, "seeds": cfg.seeds, "bootstrap_samples": cfg.bootstrap_samples},
                      {"report": dg.MetadataValue.md(ui), "significant_differences": significant,
                       "positive_control": verdict.status,
                       "power_seeds_needed": plan[0]["seeds_needed"] if plan else None,
                       "power_heldout_docs_needed": plan[0]["units_needed"] if plan else None})


def training_figures(tables: dict[str, pl.DataFrame], out_dir: Path, seed: int) -> dict[str, Path]:
    """Loss curves, stable ranks, fidelity heatmaps and the ODM mixture (whatever data exists)."""
    from pipeline.reports import training_plots as T
    from pipeline.training.gradients import summarize_stable_ranks

    figs = {}
    curve = tables.get("heldout_curve")
    if curve is not None and curve.height:
        figs["heldout_curves"] = T.plot_heldout_curves(curve, out_dir / "heldout_curves.png")
    figs["loss_curves"] = T.plot_loss_curves(tables["train_log"], out_dir / "loss_curves.png")
    if tables.get("stable_rank") is not None and tables["stable_rank"].height:
        figs["stable_ranks"] = T.plot_stable_ranks(summarize_stable_ranks(tables["stable_rank"]), out_dir / "stable_ranks.png")
    fid = tables.get("fidelity")
    if fid is not None and fid.height:
        mats = {}
        for strategy in fid["strategy"].unique(maintain_order=True):
            f = fid.filter(pl.col("strategy") == strategy)
            n = int(f["chunk_i"].max()) + 1
            m = np.zeros((n, n))
            m[f["chunk_i"].to_numpy(), f["chunk_j"].to_numpy()] = f["cosine"].to_numpy()
            mats[strategy] = m
        figs["mixture_fidelity"] = T.plot_fidelity(mats, out_dir / "mixture_fidelity.png")
    mix = tables.get("odm_mixture")
    if mix is not None and mix.height:
        figs["odm_mixture"] = T.plot_mixture(mix.filter(pl.col("seed") == seed).select("step", "cluster", "prob"), out_dir / "odm_mixture.png")
    return figs
