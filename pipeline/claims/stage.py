"""The claims stage: each paper's measurable claims (the registry ``pipeline.claims.papers``),
measured on this corpus (``claims``; ``strata claims``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import polars as pl

from pipeline.claims.inputs import claim_data
from pipeline.claims.measure import claims_frame, evaluate
from pipeline.ordering.engine import OrderParams
from pipeline.render.markdown import image_markdown
from pipeline.reports.claims_section import claims_section
from pipeline.stage import Connect, Markdown, StageParams, StageResult, setting
from pipeline.storage.atomic import write_parquet, write_text
from pipeline.storage.warehouse import replace_rows


@dataclass(frozen=True)
class ClaimsParams(StageParams):
    """The papers' claims measured on this corpus (``claims``); :func:`pipeline.claims.inputs.claim_data` takes them."""

    claims_k: int = setting("claims.k")
    claims_shuffles: int = setting("claims.shuffles")
    bootstrap_samples: int = setting()
    batch_size: int = setting()
    length_bins: int = setting()
    seed: int = setting()
    max_steps: int = setting(versioned=False)  # the prefix: upstream parameters from here on
    seq_len: int = setting(versioned=False)
    seeds: list[int] = setting(versioned=False)
    k: int = setting(versioned=False)  # the pipeline's clusters (claims.k 0 = k), and their k-means settings
    kmeans_iters: int = setting(versioned=False)
    pca_components: int = setting(versioned=False)
    kmeans_spherical: bool = setting(versioned=False)
    kmeans_max_points_per_centroid: int = setting(versioned=False)
    order: OrderParams = setting(versioned=False, convert=OrderParams)  # the random shuffles and the diversity schedules


CLAIM_SIDE_TABLES = ("claims_diversity", "claims_epoch_jumps")  # left by the claim functions in ClaimData.tables_out


def measure_claims(layout, params: ClaimsParams, connect: Connect, log: Callable[[str], None] = print) -> StageResult:
    """One row per claim of the papers, measured on this corpus: the paper's figure, Strata's figure
    with a 95% interval and the verdict the interval decides (DuckDB ``claims``, with
    ``claims_diversity``, ``claims_epoch_jumps`` and ``claims_not_measured``), a figure per claim
    and ``report/claims/claims.md``. Claims whose data the root lacks are listed as not measured;
    the claims' own runs (``claim_runs``), when they exist, are an input (``deps``)."""

    out_dir = layout.inside("report", "claims")
    t0 = time.perf_counter()

    def read_table(name: str) -> pl.DataFrame | None:  # a short connection per read (claims may read later)
        with connect() as con:
            tables = {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
            return con.sql(f"SELECT * FROM {name}").pl() if name in tables else None

    data = claim_data(layout, params, params.order, read_table, out_dir, log=log)
    deps = {"claim_runs": None} if data.claim_log is not None else {}  # the claims' own runs exist: their version is an input too
    found, missing = evaluate(data, progress=lambda name: log(f"claim {name} ({time.perf_counter() - t0:.0f} s)"))
    table = claims_frame(found).with_columns(  # figures relative to the data root: the same bytes wherever it lies
        pl.col("figure").map_elements(lambda f: str(Path(f).relative_to(layout.root)) if f and Path(f).is_relative_to(layout.root) else f,
                                      return_dtype=pl.String))
    side = {name: data.tables_out.get(name) for name in CLAIM_SIDE_TABLES}
    side["claims_not_measured"] = pl.DataFrame({"claim": list(missing), "reason": list(missing.values())},
                                               schema={"claim": pl.String, "reason": pl.String})
    outputs = [write_parquet(table, out_dir / "claims.parquet")]
    with connect() as con:
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
    return StageResult(outputs=[*outputs, *figures.values()], rows={"claims": table.height, "figures": len(figures)},
                       parameters={"claims_k": params.claims_k, "claims_shuffles": params.claims_shuffles,
                                   "bootstrap_samples": params.bootstrap_samples},
                       facts={"report": Markdown(ui), "verdicts": verdicts, "not_measured": missing}, deps=deps)
