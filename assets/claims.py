"""claims and claim_runs: each paper's measurable claim, reproduced on this corpus (pipeline/reports/claims.py)."""

import time
from pathlib import Path

import dagster as dg
import numpy as np
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.common import Recorder, StrataSettings
from assets.params import PARAM_CLASSES, asset_config
from pipeline.reports.markdown import frame_table
from pipeline.storage.atomic import write_parquet, write_text
from pipeline.storage.warehouse import replace_rows

ClaimsParams = PARAM_CLASSES["claims"]  # launchpad: this asset's parameters (assets/params.py)
ClaimRunsParams = PARAM_CLASSES["claim_runs"]
SIDE_TABLES = ("claims_diversity", "claims_epoch_jumps")  # left by the claim functions in ClaimData.tables_out


def _reader(con):
    tables = {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    return lambda name: con.sql(f"SELECT * FROM {name}").pl() if name in tables else None


@dg.asset(group_name="ablation", deps=["orderings", "training_runs", "gradient_analyses", "embeddings", "clusters"],
          code_version="1", kinds={"duckdb", "matplotlib"})
def claims(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
           config: ClaimsParams) -> dg.MaterializeResult:
    """One row per claim of the papers, measured on this corpus: the paper's figure (quoted), Strata's
    figure with a 95% interval and the verdict the interval decides (DuckDB ``claims``; the
    four-strategy table of Diversity-ordered training in ``claims_diversity``, the epoch-boundary
    jump ratios in ``claims_epoch_jumps``), a figure per claim and ``report/claims.md``. Claims
    whose data this root lacks (the runs of ``claim_runs``, until ``strata claims --full``) are
    listed as not measured."""
    from pipeline.ordering.engine import OrderParams
    from pipeline.reports.claim_inputs import claim_data
    from pipeline.reports.claims import claims_frame, claims_section, evaluate
    from pipeline.reports.visual import image_markdown

    rec = Recorder(context, duckdb, {"orderings": "*", "training_runs": "*", "gradient_analyses": None, "embeddings": None, "clusters": None})
    cfg, layout = asset_config(context, settings, config), settings.layout()
    out_dir = layout.inside("report", "claims")
    t0 = time.perf_counter()

    def read_table(name: str) -> pl.DataFrame | None:  # a short connection per read (claims may read later)
        with duckdb.get_connection() as con:
            return _reader(con)(name)

    data = claim_data(layout, cfg, OrderParams.from_config(cfg), read_table, out_dir, log=context.log.info)
    if data.claim_log is not None:  # the claims' own runs exist: their version is an input too
        rec.deps["claim_runs"] = None
    found, missing = evaluate(data, progress=lambda name: context.log.info(f"claim {name} ({time.perf_counter() - t0:.0f} s)"))
    table = claims_frame(found).with_columns(  # figures relative to the data root: the same bytes wherever it lies
        pl.col("figure").map_elements(lambda f: str(Path(f).relative_to(layout.root)) if f and Path(f).is_relative_to(layout.root) else f,
                                      return_dtype=pl.String))
    side = {name: data.tables_out.get(name) for name in SIDE_TABLES}
    side["claims_not_measured"] = pl.DataFrame({"claim": list(missing), "reason": list(missing.values())},
                                               schema={"claim": pl.String, "reason": pl.String})
    outputs = [write_parquet(table, out_dir / "claims.parquet")]
    with duckdb.get_connection() as con:
        replace_rows(con, "claims", table, {})
        for name, df in side.items():
            if df is not None:
                replace_rows(con, name, df, {})
                outputs.append(write_parquet(df, out_dir / f"{name}.parquet"))
            else:
                con.execute(f"DROP TABLE IF EXISTS {name}")
    md, figures = claims_section(table, side["claims_diversity"], side["claims_epoch_jumps"], missing, base=out_dir, root=layout.root)
    outputs.append(write_text(md, out_dir / "claims.md"))
    ui, _ = claims_section(table, side["claims_diversity"], side["claims_epoch_jumps"], missing, root=layout.root)
    ui = ui.split("\n![")[0] + "\n\n" + "\n\n".join(image_markdown(p, n) for n, p in figures.items())
    verdicts = {v: int((table["verdict"] == v).sum()) for v in ("reproduced", "not reproduced", "inconclusive")}
    return rec.finish([*outputs, *figures.values()], {"claims": table.height, "figures": len(figures)},
                      {"claims_k": cfg.claims_k, "claims_shuffles": cfg.claims_shuffles, "bootstrap_samples": cfg.bootstrap_samples},
                      {"report": dg.MetadataValue.md(ui), "verdicts": dg.MetadataValue.json(verdicts),
                       "not_measured": dg.MetadataValue.json(missing)})


@dg.asset(group_name="ablation", deps=["tokens", "clusters", "embeddings", "corpus"], code_version="1", kinds={"pytorch"})
def claim_runs(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
               config: ClaimRunsParams) -> dg.MaterializeResult:
    """The training runs only the claims need (``strata claims --full``; pipeline/training/experiments.py):
    multi-epoch runs of a corpus sample in a topical order (grouped by source) and in the stratified order
    (Diversity-ordered training's epoch-boundary anomaly), and runs per packing — concat with each
    atom size of ``claims_atoms`` and padding — (Packing & shuffling), for every seed of
    ``claims_seeds``: in the paper's protocol (``claims_packing_protocol: paper``, 2 epochs of a
    sample at an MSL below the mean document length) or at equal tokens (``equal_tokens``).
    DuckDB ``claim_runs_log`` (per step), ``claim_runs_sequences`` (paper protocol: every
    sequence's training loss), ``claim_runs_heldout`` (equal tokens: the fixed held-out batch's
    per-document loss after the last step) and ``claim_runs_arms`` (what each run trained on).
    Materialize ``claims`` afterwards to turn them into claim rows."""
    from pipeline.training.stage import load_heldout_batch
    from pipeline.training.loop import TrainSettings
    from pipeline.data.tokenizer import load_tokenizer
    from pipeline.data.tokens import open_tokens
    from pipeline.packing.pack import SequenceStore
    from pipeline.reports.claim_inputs import diversity_clusters
    from pipeline.reports.visual import document_features
    from pipeline.training.experiments import epoch_boundary_arms, packing_arms, paper_packing_arms, sequence_loss_rows, topic_groups
    from pipeline.training.loop import train

    rec = Recorder(context, duckdb, {"tokens": None, "clusters": None, "embeddings": None, "corpus": None})
    cfg, layout = asset_config(context, settings, config), settings.layout()
    docs = document_features(layout)
    lengths = docs["stream_length"].to_numpy()
    cluster, k = diversity_clusters(layout, cfg, docs)
    base = TrainSettings.from_config(cfg, cfg.seed)
    topic, kind = topic_groups(docs["source"].to_numpy(), cluster)
    if cfg.claims_packing_protocol == "paper":
        packing = paper_packing_arms(lengths, cfg.seq_len, cfg.claims_atoms, cfg.claims_seeds, base, cfg.claims_packing_sequences,
                                     cfg.claims_packing_epochs, cfg.claims_packing_seq_len)
    else:
        packing = packing_arms(lengths, cfg.seq_len, cfg.claims_atoms, cfg.claims_seeds, base)
    arms = epoch_boundary_arms(lengths, cluster, topic, cfg.seq_len, cfg.claims_epoch_sequences, cfg.claims_epochs, cfg.claims_seeds,
                               base, kind) + packing
    tok = load_tokenizer(layout.tokenizer)
    held = load_heldout_batch(layout, cfg, tok)
    tokens, offsets = open_tokens(layout.tokens, layout.doc_offsets)
    total = sum(a.steps for a in arms)
    logs, units, info, seq_losses = [], [], [], []
    done, t0 = 0, time.perf_counter()
    for i, arm in enumerate(arms):
        eta = f", about {(time.perf_counter() - t0) / done * (total - done) / 60:.1f} min left" if done else ""
        context.log.info(f"claim run {i + 1}/{len(arms)}: {arm.experiment} {arm.arm} seed {arm.seed}, {arm.steps} steps "
                         f"({done}/{total} steps done{eta})")
        store = SequenceStore(tokens, offsets, arm.segments, arm.seq_len or cfg.seq_len, pad_id=tok.pad_token_id)
        final: dict[int, np.ndarray] = {}
        scored = held if arm.experiment == "packing" else None
        per_seq: list[dict] = []
        per_epoch = arm.order.size // arm.settings.batch_size
        keep = (lambda step, _ids, sums, n: per_seq.append(sequence_loss_rows(step, arm.settings.batch_size, per_epoch, sums, n))
                ) if arm.experiment == "packing_epochs" else None
        _, log = train(store, arm.order, len(tok), tok.eos_token_id, tok.pad_token_id, arm.settings, heldout=scored,
                       on_heldout=lambda step, _tokens, losses: final.update({step: losses}), on_losses=keep)
        done += len(log)
        key = {"experiment": arm.experiment, "arm": arm.arm, "seed": arm.seed}
        if per_seq:
            seq_losses.append(pl.concat([pl.DataFrame(r) for r in per_seq]).with_columns(**{c: pl.lit(v) for c, v in key.items()}))
        logs.append(pl.DataFrame(log).drop("tokens_per_s").with_columns(**{c: pl.lit(v) for c, v in key.items()}))
        if final:
            last = max(final)
            units.append(pl.DataFrame({"unit": held.units, "loss": final[last]}).with_columns(
                step=pl.lit(last), **{c: pl.lit(v) for c, v in key.items()}))
        info.append({**key, "steps": len(log), "tokens": int(log[-1]["tokens_seen"]), "k": k, **arm.info})
    log_df, arms_df = pl.concat(logs), pl.DataFrame(info, infer_schema_length=None)
    out_dir = layout.inside("claim_runs")
    outputs = [write_parquet(log_df, out_dir / "log.parquet"), write_parquet(arms_df, out_dir / "arms.parquet")]
    with duckdb.get_connection() as con:
        replace_rows(con, "claim_runs_log", log_df, {})
        replace_rows(con, "claim_runs_arms", arms_df, {})
        if units:
            heldout = pl.concat(units)
            replace_rows(con, "claim_runs_heldout", heldout, {})
            outputs.append(write_parquet(heldout, out_dir / "heldout.parquet"))
        else:
            con.execute("DROP TABLE IF EXISTS claim_runs_heldout")
        if seq_losses:
            sequences = pl.concat(seq_losses)
            replace_rows(con, "claim_runs_sequences", sequences, {})
            outputs.append(write_parquet(sequences, out_dir / "sequences.parquet"))
        else:
            con.execute("DROP TABLE IF EXISTS claim_runs_sequences")
    return rec.finish(outputs, {"runs": len(arms), "steps": total},
                      {"claims_seeds": cfg.claims_seeds, "claims_epochs": cfg.claims_epochs, "claims_atoms": cfg.claims_atoms,
                       "claims_packing_protocol": cfg.claims_packing_protocol},
                      {"runs": dg.MetadataValue.md(frame_table(arms_df)),
                       "minutes": round((time.perf_counter() - t0) / 60, 2)})
