"""The report stage: each ordering's diagnostics (``ordering_diagnostics``), all strategies side by
side (``diagnostics_report``) and the ablation's strategy x metric report (``ablation_report``, with
the section of the papers' claims that ``pipeline.claims.stage.measure_claims`` measured)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import polars as pl

from pipeline.clean.decontam import eval_sets
from pipeline.clean.report import clean_section, plot_clean
from pipeline.clean.report import read_tables as read_clean_tables
from pipeline.data.paloma import read_paloma_docs
from pipeline.names import POSITIVE_CONTROL
from pipeline.ordering.frozen_boundary import boundary_summary
from pipeline.ordering.strategies import training_time
from pipeline.render.markdown import frame_table, image_markdown
from pipeline.reports import diagnostics as D
from pipeline.reports import stationarity as S
from pipeline.reports import training_plots as T
from pipeline.reports import visual as V
from pipeline.reports import windows as W
from pipeline.reports.ablate_report import campaign_markdown, plot_campaign
from pipeline.reports.band_cache import band_cache, window_band_cache
from pipeline.reports.claims_section import CLAIM_TABLES, claims_report_section
from pipeline.reports.diagnostics_report import ordering_schedules, write_diagnostics_report
from pipeline.reports.plots import plot_k_calibration, plot_window_deviation
from pipeline.reports.power_plots import plot_power
from pipeline.reports.quality_stream import plot_quality_stream, quality_along_stream
from pipeline.reports.stats import control_verdict, delta_table, mde_by_checkpoint, power_table
from pipeline.reports.tables import ablation_table, render_report, run_units
from pipeline.represent.calibrate import DEFAULT_KS, calibrate_k
from pipeline.represent.embedding_index import open_embeddings
from pipeline.segments import warm_kernels
from pipeline.stage import CheckFact, Connect, Markdown, StageParams, StageResult, setting
from pipeline.storage.atomic import write_parquet, write_text
from pipeline.storage.warehouse import replace_rows
from pipeline.threads import concurrently
from pipeline.training.gradients import summarize_stable_ranks

STATIONARITY_CHECK, REPORT_CHECK = "ordering_is_stationary", "report_covers_strategies"



@dataclass(frozen=True)
class DiagnoseParams(StageParams):
    """One ordering's diagnostics (``ordering_diagnostics``): the prefix is ``max_steps x batch_size`` sequences."""

    length_bins: int = setting()
    max_steps: int = setting()
    batch_size: int = setting()
    seed: int = setting()
    stationarity_shuffles: int = setting()


@dataclass(frozen=True)
class DiagnosticsReportParams(StageParams):
    """All strategies side by side (``diagnostics_report``)."""

    length_bins: int = setting()
    seed: int = setting()
    strategies: list[str] = setting(versioned=False)  # the strategy partitions
    max_steps: int = setting(versioned=False)  # the prefix: ordering_diagnostics' parameters
    batch_size: int = setting(versioned=False)
    quality_enabled: bool = setting("quality.enabled")  # the quality along the stream (pipeline.reports.quality_stream)


@dataclass(frozen=True)
class AblationReportParams(StageParams):
    """The ablation's report (``ablation_report``); the evaluation sets name the cleaning section's."""

    bootstrap_samples: int = setting()
    seed: int = setting()
    strategies: list[str] = setting(versioned=False)  # the strategy partitions
    seeds: list[int] = setting(versioned=False)  # the run partitions
    max_steps: int = setting(versioned=False)  # tokens per run: training_runs' parameters
    batch_size: int = setting(versioned=False)
    seq_len: int = setting(versioned=False)
    decontam: Any = setting(versioned=False)  # the evaluation sets checked (pipeline.clean.decontam.eval_sets): clean's parameters
    wikitext_path: str = setting(versioned=False)
    paloma_dir: str = setting(versioned=False)
    dclm_dir: str = setting(versioned=False)


RUN_TABLES = ("train_log", "eval_results", "eval_units", "heldout_curve", "consumed_metrics", "stable_rank", "fidelity", "odm_mixture",
              "epoch_jumps")  # the DuckDB tables of the training runs and their evaluations the report reads


def stationarity_check(strategy: str, table: pl.DataFrame, n_random: int) -> CheckFact:
    """``ordering_is_stationary``: passes when no part of ``table`` is outside random's band; else
    a warning whose description names every characteristic and part outside it."""
    if table.is_empty():
        return CheckFact(STATIONARITY_CHECK, True, {"strategy": strategy}, f"{strategy} has no schedule before training: nothing to test",
                         warn=True)
    lines = S.out_of_band(table)
    summary = S.out_of_band_summary(table)
    control = strategy == POSITIVE_CONTROL  # harmful on purpose: leaving the band is what it is for
    if lines and control:
        description = f"expected for the positive control: outside random's band: {summary}"
    else:
        description = f"outside random's band: {summary}" if lines else "every characteristic inside random's band"
    return CheckFact(
        STATIONARITY_CHECK, not lines or control, warn=True, description=description,
        metadata={
            "strategy": strategy,
            **({"expected": "yes: the positive control is built to leave random's band (README)"} if control else {}),
            "parts_outside": len(lines),
            "characteristics_outside": ", ".join(S.characteristics(table.filter(~pl.col("inside")))) or "none",
            "outside": Markdown("\n".join(f"- {line}" for line in lines) or "none"),
            "shuffles": n_random,
            # a uniform shuffle leaves the simultaneous envelope somewhere about this often (pipeline/reports/stationarity.py)
            "false_alarm_rate": f"about {1 / (n_random + 1):.3f} (1 / (shuffles + 1), all characteristics and parts at once)",
        },
    )


def window_metadata(layout, strategy: str, metrics: pl.DataFrame) -> tuple[list[Path], dict]:
    """The worst-window figure ``diagnostics/<strategy>.windows.png`` and the facts that show it in
    the UI: the table of worst windows against random's band, the figure inline, and the window
    lengths where the ordering is above every shuffle."""
    frame = W.window_frame(metrics, strategy)
    if frame.is_empty():
        return [], {}
    png = plot_window_deviation(frame, strategy, layout.inside("diagnostics", f"{strategy}.windows.png"))
    above = "; ".join(f"{kind}: w = {', '.join(map(str, ws))}" for kind, ws in W.above_random(frame).items() if ws)
    return [png], {"worst_window": Markdown(W.markdown(frame) + "\n\n" + image_markdown(png, "worst window vs window length")),
                   "worst_window_above_random": above or "none"}


def diagnose_ordering(layout, params: DiagnoseParams, strategy: str, connect: Connect) -> StageResult:
    """``strategy``'s ordering against the papers' yardsticks: per-sequence and per-batch metrics,
    prefix error, drift and the worst windows against random's band (``diagnostics/<strategy>.parquet``,
    the figure ``diagnostics/<strategy>.windows.png``, DuckDB ``ordering_metrics``), and its
    stationarity against ``stationarity_shuffles`` uniform shuffles (``diagnostics/<strategy>.stationarity.parquet``,
    DuckDB ``ordering_stationarity``, the check ``ordering_is_stationary``). The shuffles' bands are
    cached per packing (``pipeline/reports/band_cache.py``). A training-time strategy has no
    schedule before training: it gets no rows."""
    warm_kernels()  # numba's first load, beside this run's reading
    prefix = params.max_steps * params.batch_size
    reused = window_reused = False
    if strategy in training_time():
        metrics, stationarity = D.rows_frame([]), S.empty_table()
    else:
        sched = V.strategy_schedule(layout, strategy, params.length_bins)
        cache, window_cache = band_cache(layout, strategy, params, prefix), window_band_cache(layout, strategy, params)
        reused = cache is not None and cache.is_file()
        window_reused = window_cache is not None and window_cache.is_file()
        # independent: each one's one-core passes run while the other computes
        stationarity, metrics = concurrently(
            lambda: S.stationarity_table(sched, prefix=prefix, strategy=strategy, n_random=params.stationarity_shuffles,
                                         seed=params.seed, band_cache=cache),
            lambda: D.ordering_diagnostics(strategy, sched, batch_sizes=(8, 32, 128), window_batch=params.batch_size,
                                           seed=params.seed, window_band_cache=window_cache))
    out = write_parquet(metrics, layout.inside("diagnostics", f"{strategy}.parquet"))
    out_stat = write_parquet(stationarity, layout.inside("diagnostics", f"{strategy}.stationarity.parquet"))
    window_files, window_facts = window_metadata(layout, strategy, metrics)
    with connect() as con:
        replace_rows(con, "ordering_metrics", metrics, {"strategy": strategy})
        replace_rows(con, "ordering_stationarity", stationarity, {"strategy": strategy})
    return StageResult(
        outputs=[out, out_stat, *window_files], rows={"metrics": metrics.height, "stationarity": stationarity.height},
        parameters={"strategy": strategy, "length_bins": params.length_bins, "prefix_sequences": prefix,
                    "stationarity_shuffles": params.stationarity_shuffles, "seed": params.seed, "window_batch": params.batch_size,
                    "window_shuffles": W.SHUFFLES},
        facts={"summary": Markdown(frame_table(V.summary_table(metrics))),
               "stationarity": Markdown(S.markdown(stationarity) if stationarity.height else "no schedule"),
               "stationarity_outside": S.out_of_band_summary(stationarity) or "none",
               "band": "shuffles of these sequences reused (diagnostics/bands)" if reused else "shuffles computed",
               **window_facts,
               **({"window_band": "shuffles' worst windows reused (diagnostics/window_bands)" if window_reused
                   else "shuffles' worst windows computed"} if window_facts else {}),
               **(boundary_summary(layout, strategy) or {})},  # the frozen prefix's boundary, when the stream has one
        checks=[stationarity_check(strategy, stationarity, params.stationarity_shuffles)])


def report_check(wanted: list[str], reported: list[str], figures: dict[str, Path]) -> CheckFact:
    """``report_covers_strategies``: passes when ``reported`` holds every strategy of ``wanted`` and
    each figure file starts with a PNG or GIF signature; else a warning naming what is missing."""
    missing = [s for s in wanted if s not in reported]
    broken = [n for n, p in figures.items() if not p.read_bytes()[:8].startswith((b"\x89PNG\r\n\x1a\n", b"GIF8"))]
    problems = ([f"no ordering for {missing}: materialize their orderings"] if missing else []) + (
        [f"not an image: {broken}"] if broken else [])
    return CheckFact(REPORT_CHECK, not problems, {"strategies": ", ".join(reported), "figures": len(figures)},
                     "; ".join(problems) or f"{len(reported)} strategies, {len(figures)} figures", warn=True)


def diagnostics_report(layout, params: DiagnosticsReportParams, connect: Connect) -> StageResult:
    """All strategies with a schedule side by side: figures under ``report/`` and
    ``report/diagnostics.md`` (from ``ordering_metrics`` and ``ordering_stationarity``), corpus-side
    metrics in DuckDB ``corpus_metrics``, the k calibration (silhouette vs k on a sample) in
    ``k_calibration``, and the check ``report_covers_strategies``."""
    strategies = [s for s in params.strategies if layout.ordering(s).exists() and s not in training_time()]
    docs, schedules = ordering_schedules(layout, strategies, params.length_bins)
    emb = open_embeddings(layout)
    labels = docs["source"].to_numpy()
    corpus = D.corpus_diagnostics(docs["cluster"].to_numpy(), docs["stream_length"].to_numpy(), embeddings=emb,
                                  labels=labels if len(set(labels)) > 1 else None, seed=params.seed)
    with connect() as con:
        replace_rows(con, "corpus_metrics", corpus, {})
        metrics = con.sql("SELECT * FROM ordering_metrics").pl().filter(pl.col("strategy").is_in(strategies))
        stationarity = S.sort_table(con.sql("SELECT * FROM ordering_stationarity").pl(), strategies)
    extra = {}
    ks = [k for k in DEFAULT_KS if k <= emb.shape[0] // 40]  # faiss wants >= 39 points per centroid
    if len(ks) >= 2:
        cal = calibrate_k(emb, ks, sample_size=min(5000, emb.shape[0]), seed=params.seed)
        png = layout.inside("report", "k_calibration.png")
        extra["k_calibration"] = plot_k_calibration(cal.ks, cal.silhouettes, cal.recommended_k, png)
        with connect() as con:
            replace_rows(con, "k_calibration", pl.DataFrame({"k": cal.ks, "silhouette": cal.silhouettes,
                                                            "recommended": cal.ks == cal.recommended_k}), {})
    if params.quality_enabled and layout.quality.exists():
        along, prefix = quality_along_stream(layout, strategies, prefix_sequences=params.max_steps * params.batch_size)
        with connect() as con:
            replace_rows(con, "quality_along_stream", along, {})
        extra["quality_along_stream"] = plot_quality_stream(along, prefix, layout.inside("report", "quality_along_stream.png"))
    summary, figures, md_path = write_diagnostics_report(layout, docs, schedules, emb, metrics, stationarity,
                                                         params.max_steps * params.batch_size, extra)
    windows = V.window_summary(metrics)
    ui = "\n\n".join([frame_table(summary), "**stationarity: outside random's band**",
                       frame_table(V.stationarity_summary(stationarity))]
                      + (["**worst window (max over windows [a:b]) above random's**", frame_table(windows)] if windows.height else [])
                      + [image_markdown(p, n) for n, p in figures.items()])
    check = report_check([s for s in params.strategies if s not in training_time()], strategies, figures)
    return StageResult(outputs=[md_path, *figures.values()], rows={"strategies": len(strategies), "figures": len(figures)},
                       parameters={"strategies": strategies}, facts={"report": Markdown(ui)}, checks=[check])


def ablation_report(layout, params: AblationReportParams, connect: Connect, higher_is_better: Callable[[str], bool]) -> StageResult:
    """Strategy x metric table (the fixed held-out batch's final loss and every evaluation metric,
    mean ± std over seeds; DuckDB ``ablation``), every strategy's difference to ``random`` with a
    paired-bootstrap interval (``ablation_delta``), the power of the run (``ablation_power``), and
    ``report.md`` with its figures under ``report/`` (the cleaning section, the claims' section and the latest
    ``strata ablate`` campaign included where their tables exist). ``higher_is_better(metric)``: whether
    a rise of ``suite/task/metric`` is better (the eval suites declare it: ``evals.suites.is_higher_better``)."""
    tables, mine, claim_tables, strategies = _report_inputs(connect, params)
    table, deltas, verdict, power = _ablation_statistics(layout, params, connect, mine, higher_is_better)
    diversity = mine.get("consumed_metrics")
    figures, extra = _report_figures(layout, params, connect, mine, power, tables)
    claims_md, claim_figures = claims_report_section(claim_tables.get, base=layout.root)
    md = render_report(table, strategies=strategies, extra=extra, deltas=deltas, diversity=diversity, power=power, claims=claims_md)
    outputs = [write_text(md, layout.report), write_parquet(deltas, layout.inside("report", "ablation_delta.parquet")),
               write_parquet(power, layout.inside("report", "ablation_power.parquet"))]
    ui = (render_report(table, strategies=strategies, deltas=deltas, diversity=diversity, power=power,
                        claims=claims_md.split("\n![")[0])
          + "\n\n".join(image_markdown(p, n) for n, p in figures.items())
          + "\n\n" + "\n\n".join(image_markdown(p, n) for n, p in claim_figures.items()))
    significant = deltas.filter(pl.col("significant")).height if deltas.height else 0
    plan = power.filter(pl.col("strategy") == "pooled").to_dicts()
    return StageResult(outputs=[*outputs, *figures.values()],
                       rows={"strategies": len(strategies), "rows": table.height, "deltas": deltas.height, "power": power.height},
                       parameters={"strategies": strategies, "seeds": params.seeds, "bootstrap_samples": params.bootstrap_samples},
                       facts={"report": Markdown(ui), "significant_differences": significant,
                              "positive_control": verdict.status,
                              "power_seeds_needed": plan[0]["seeds_needed"] if plan else None,
                              "power_heldout_docs_needed": plan[0]["units_needed"] if plan else None})


def _report_inputs(connect: Connect, params: AblationReportParams):
    """``(the warehouse's table names, the runs' tables of the configured strategies and seeds, the
    claims' tables, the configured strategies that trained)``: what the ablation report reads."""
    with connect() as con:
        tables = {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        read = {t: con.sql(f"SELECT * FROM {t}").pl() for t in RUN_TABLES if t in tables}
        claim_tables = {t: con.sql(f"SELECT * FROM {t}").pl() for t in CLAIM_TABLES if t in tables}
    train_log = read["train_log"]
    strategies = [s for s in params.strategies if s in set(train_log["strategy"])]
    seeds = set(params.seeds)
    mine = {t: df.filter(pl.col("strategy").is_in(strategies) & pl.col("seed").is_in(seeds)) if "seed" in df.columns
            else df.filter(pl.col("strategy").is_in(strategies)) for t, df in read.items()}
    return tables, mine, claim_tables, strategies


def _ablation_statistics(layout, params: AblationReportParams, connect: Connect, mine: dict[str, pl.DataFrame],
                         higher_is_better: Callable[[str], bool]):
    """``(ablation, ablation_delta, the positive control's verdict, ablation_power)`` from the runs'
    units, the three tables written to DuckDB."""

    units = run_units(mine.get("heldout_curve"), mine.get("eval_results"), mine.get("eval_units"))
    table = ablation_table(units)
    deltas = delta_table(units, "random", params.bootstrap_samples, params.seed, higher_is_better)
    verdict = control_verdict(deltas, POSITIVE_CONTROL)
    heldout_available = read_paloma_docs(layout.heldout).height if any(layout.heldout.rglob("*.jsonl.gz")) else None
    power = power_table(units, "random", POSITIVE_CONTROL, max_units=heldout_available,
                        tokens_per_run=params.max_steps * params.batch_size * params.seq_len)
    with connect() as con:
        replace_rows(con, "ablation", table, {})
        replace_rows(con, "ablation_delta", deltas, {})
        con.execute("DROP TABLE IF EXISTS ablation_power")  # wholly derived: its columns follow this code's POWER_SCHEMA
        replace_rows(con, "ablation_power", power, {})
    return table, deltas, verdict, power


def _report_figures(layout, params: AblationReportParams, connect: Connect, mine: dict[str, pl.DataFrame], power: pl.DataFrame,
                    tables: set[str]) -> tuple[dict[str, Path], str]:
    """The report's figures under ``report/`` (power, training, cleaning, the latest ``strata
    ablate`` campaign: whichever has data) and the markdown after its tables (the figures, the
    flagged epoch-boundary jumps, the cleaning section, the campaign)."""

    figures = {}
    if power.filter(pl.col("strategy") == "pooled").height:
        checkpoints = mde_by_checkpoint(mine["heldout_curve"]) if "heldout_curve" in mine else pl.DataFrame()
        figures["power"] = plot_power(power, checkpoints, layout.inside("report", "power.png"))
    figures |= training_figures(mine, layout.inside("report"), params.seeds[0])
    cleaned = read_clean_tables(connect)  # the clean stage's removals (docs/cleaning.md)
    if cleaned:
        figures["clean"] = plot_clean(cleaned, layout.inside("report", "clean.png"))
    jumps = mine.get("epoch_jumps")
    flagged = jumps.filter(pl.col("flagged")) if jumps is not None and jumps.height else None
    extra = "\n## Figures\n\n" + "\n".join(f"![{n}](report/{p.name})" for n, p in figures.items()) + "\n"
    if flagged is not None and flagged.height:
        extra += "\n## Epoch-boundary jumps (Diversity-ordered training)\n\n" + frame_table(flagged) + "\n"
    extra += "\n" + clean_section(cleaned, ", ".join(eval_sets(params, layout.heldout))) if cleaned else ""
    if "ablation_campaign" in tables:  # the latest `strata ablate` campaign: verdicts and its intervals round by round

        with connect() as con:
            campaign = con.sql("SELECT * FROM ablation_campaign WHERE campaign = (SELECT arg_max(campaign, created_at) "
                               "FROM ablation_campaign) ORDER BY round, strategy").pl()
        figures["ablation_campaign"] = plot_campaign(campaign, layout.inside("report", "ablation_campaign.png"))
        extra += "\n" + campaign_markdown(campaign, "ablation_campaign.png")
    return figures, extra


def training_figures(tables: dict[str, pl.DataFrame], out_dir: Path, seed: int) -> dict[str, Path]:
    """Loss curves, stable ranks, fidelity heatmaps and the ODM mixture (whatever data exists)."""
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
        mine = mix.filter(pl.col("seed") == seed).select("step", "cluster", "prob")
        figs["odm_mixture"] = T.plot_mixture(mine, out_dir / "odm_mixture.png")
    return figs
