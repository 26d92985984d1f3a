"""A sequential ablation campaign's decisions, state and records (``strata ablate``), without Dagster.

A pilot (the first ``pilot_seeds`` seeds × ``heldout_docs`` held-out documents), then rounds that
add seeds and held-out documents, chosen by :func:`pipeline.reports.sequential.plan_round` from the
measured σ_seed / σ_doc / σ_res and the budget left, until every strategy has a verdict or the
budget is spent. The intervals are the anytime-valid confidence sequence of
:mod:`pipeline.reports.sequential`, so looking after every round keeps the error rates.

The decisions are pure functions: :func:`start_state` (where a new or resumed campaign stands),
:func:`round_seeds` (the runs a round needs) and :func:`decide_round` (a round's measurements in,
its rows and the next round, or the stop, out). The driver (``assets/ablate.py``) materializes the
runs through Dagster between them. State lives in DuckDB (:class:`CampaignStore`):
``ablation_campaign`` (one row per round and strategy: grid, Δ, interval, components, verdict,
spending, the next round's plan) and ``ablation_units`` (the per-document scores of each model,
keyed by its data version). Spending is counted from the lineage (``wall_s`` of every
materialization since the campaign started) plus the scoring time, so a kill loses none of it.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Callable

import duckdb
import polars as pl
import yaml

from pipeline.config import StrataConfig, config_from_dict
from pipeline.data.tokenizer import load_tokenizer
from pipeline.devices import device
from pipeline.errors import StrataInputError
from pipeline.reports import sequential as Q
from pipeline.reports.ablate_report import campaign_markdown, plot_campaign
from pipeline.reports.stats import TARGET_EFFECT, paired_differences
from pipeline.reports.tables import run_units
from pipeline.storage.atomic import write_text
from pipeline.storage.layout import Layout, check_data_root
from pipeline.storage.warehouse import latest_data_version, replace_rows
from pipeline.training.heldout import score_heldout
from pipeline.training.stage import load_heldout_batch

CAMPAIGN_TABLE = "ablation_campaign"
UNITS_TABLE = "ablation_units"
HELDOUT = "heldout_batch/loss"


@dataclass(frozen=True)
class CampaignSpec:
    """What ``strata ablate`` was asked: strategies against ``baseline`` on ``metric``, the effect
    of interest (a fraction of the baseline's mean), the budget (``budget_s`` wall seconds or
    ``budget_tokens`` training tokens), the pilot's seeds."""

    strategies: tuple[str, ...]
    baseline: str = "random"
    metric: str = HELDOUT
    effect: float = TARGET_EFFECT
    budget_s: float | None = None
    budget_tokens: int | None = None
    pilot_seeds: int = 3
    alpha: float = Q.ALPHA
    power: float = Q.POWER

    def key(self) -> str:
        blob = json.dumps({"strategies": sorted(self.strategies), "baseline": self.baseline, "metric": self.metric,
                           "effect": self.effect, "budget_s": self.budget_s, "budget_tokens": self.budget_tokens,
                           "pilot_seeds": self.pilot_seeds, "alpha": self.alpha, "power": self.power}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def budget(self) -> float:
        """The budget in its own unit: wall seconds or training tokens."""
        return self.budget_s if self.budget_s is not None else self.budget_tokens

    def fmt(self, x: float) -> str:
        """An amount of the budget's unit, as the campaign's messages write it."""
        return f"{x:,.0f} tokens" if self.budget_tokens is not None else f"{x / 60:.1f} min"


def parse_budget(text: str) -> tuple[float | None, int | None]:
    """``60m`` / ``90s`` / ``2h`` → seconds; ``5M tokens`` / ``500k tokens`` / ``1200000 tokens`` → tokens."""
    t = text.strip().lower().replace("_", "").replace(",", "")
    mult = {"k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9}
    try:
        if t.endswith(("tokens", "token")):
            num = t.removesuffix("tokens").removesuffix("token").strip()
            scale = mult.get(num[-1:], 1.0)
            value = float(num[:-1] if num[-1:] in mult else num) * scale
            if value > 0:
                return None, int(value)
        else:
            units = {"s": 1, "m": 60, "min": 60, "h": 3600}
            for suffix in ("min", "s", "m", "h"):
                if t.endswith(suffix):
                    value = float(t.removesuffix(suffix)) * units[suffix]
                    if value > 0:
                        return value, None
    except ValueError:
        pass
    raise StrataInputError(f"cannot read budget {text!r}",
                           fix="write a wall time (90s, 60m, 2h) or training tokens (5M tokens, 500k tokens)")


def seed_list(config_seeds: list[int], n: int) -> list[int]:
    """The first ``n`` seeds: the config's, in order, then the next integers above them."""
    out = list(dict.fromkeys(config_seeds))[:n]
    nxt = max(out, default=-1) + 1
    while len(out) < n:
        out.append(nxt)
        nxt += 1
    return out


def tokens_per_run(cfg) -> int:
    """The training tokens of one run under ``cfg``: steps × batch × sequence length."""
    return cfg.max_steps * cfg.batch_size * cfg.seq_len


def now() -> datetime:
    """The campaign's clock: UTC, naive (DuckDB's TIMESTAMP)."""
    return datetime.now(UTC).replace(tzinfo=None)


# --- the configuration the campaign runs with ---------------------------------------------------------


def base_config_data(config_file: str | None) -> dict:
    """The keys of the campaign's config file, but ``data_root`` (the campaign writes its own file)."""
    data = yaml.safe_load(Path(config_file).read_text(encoding="utf-8")) if config_file else {}
    return {k: v for k, v in (data or {}).items() if k != "data_root"}


def write_config(path: Path, base_data: dict, base_seeds: list[int], spec: CampaignSpec, seeds: list[int], root: Path) -> None:
    """Write the campaign's config (``<root>/ablate_config.yaml``): the base config's keys, with the
    campaign's strategies and the base seeds plus ``seeds``; a bad value stops here, naming the fix."""
    data = dict(base_data)
    strategies = data.get("strategies") or StrataConfig().strategies
    data["strategies"] = list(dict.fromkeys([*strategies, spec.baseline, *spec.strategies]))
    data["seeds"] = sorted(set(base_seeds) | set(seeds))
    config_from_dict({**data, "data_root": str(root)})
    check_data_root(root)  # a folder of the user's is refused before the campaign's config goes in
    path.write_text(yaml.safe_dump(data, sort_keys=True), encoding="utf-8")


# --- the decisions ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CampaignState:
    """Where a campaign stands before a round: the round to run and its plan (seeds per strategy,
    the baseline's seeds, documents), when it started, the scoring seconds spent so far, the
    equivalence margin (fixed at the pilot; None before it), the verdicts reached, and ``finished``
    (why a resumed campaign has no round left to run)."""

    round: int
    plan: dict
    started: datetime
    scoring_s: float = 0.0
    margin: float | None = None
    resolved: dict[str, str] = field(default_factory=dict)
    finished: str = ""


def start_state(spec: CampaignSpec, rows: pl.DataFrame, heldout_docs: int, started: datetime) -> CampaignState:
    """A new campaign's pilot (``started`` now), or where the campaign's ``rows`` left off: the
    round its last row planned, with its margin, spending and verdicts."""
    if not rows.height:
        return CampaignState(0, {"seeds": {s: spec.pilot_seeds for s in spec.strategies}, "baseline_seeds": spec.pilot_seeds,
                                 "units": heldout_docs if spec.metric == HELDOUT else 0}, started)
    last = rows.filter(pl.col("round") == rows["round"].max())
    plan = json.loads(last["next_plan"][0])
    resolved = {r["strategy"]: r["verdict"] for r in rows.filter(pl.col("verdict") != "unresolved").iter_rows(named=True)}
    return CampaignState(int(last["round"][0]) + 1, plan, rows["started_at"].min(), float(rows["scoring_s"].sum()),
                         float(last["margin"][0]), resolved, plan.get("stop") or "")


def seeds_of(spec: CampaignSpec, rows: pl.DataFrame, strategy: str) -> int:
    """The seeds ``strategy`` has in the campaign's rows (the pilot's before any)."""
    mine = rows.filter(pl.col("strategy") == strategy) if rows.height else rows
    return int(mine["n_seeds"].max()) if mine.height else spec.pilot_seeds


def round_seeds(spec: CampaignSpec, plan: dict, base_seeds: list[int], rows: pl.DataFrame) -> dict[str, list[int]]:
    """The seeds of every (strategy, seed) run a round with ``plan`` needs; a strategy with a
    verdict keeps the seeds it has (its looks are over)."""
    wanted = {s: seed_list(base_seeds, n) for s, n in plan["seeds"].items()}
    wanted[spec.baseline] = seed_list(base_seeds, plan["baseline_seeds"])
    for s in spec.strategies:
        wanted.setdefault(s, seed_list(base_seeds, seeds_of(spec, rows, s)))
    return wanted


def config_seeds(base_seeds: list[int], plan: dict) -> list[int]:
    """The seeds the campaign's config must list for a round with ``plan``."""
    return seed_list(base_seeds, max([plan["baseline_seeds"], *plan["seeds"].values()]))


@dataclass(frozen=True)
class Measured:
    """What a round measured: every run's per-document values (``units``: strategy, seed, metric,
    unit, value), the documents there are, the runs it trained, its scoring seconds, what the
    campaign has spent (wall seconds, training tokens), and the costs the planner weighs (a
    training run, a scored (run, document), the budget left) in the budget's unit."""

    units: pl.DataFrame
    available: int
    baseline_seeds: int
    runs_trained: int
    scoring_s: float
    spent_s: float
    spent_tokens: int
    run_cost: float
    unit_cost: float
    left: float


@dataclass(frozen=True)
class Decision:
    """A round's verdict: its rows (``ablation_campaign``), the planner's next round and what each
    strategy would need, whether the campaign stops, and the state of the next round."""

    table: pl.DataFrame
    plan: Q.RoundPlan
    need: dict
    stop: bool
    next: CampaignState


def _round_row(spec: CampaignSpec, iv, margin: float, base_mean: float, verdict: str, m: Measured) -> dict:
    return {"baseline": spec.baseline, "metric": spec.metric, "n_seeds": iv.n_seeds, "n_units": iv.n_units, "delta": iv.delta,
            "ci_low": iv.low, "ci_high": iv.high, "se": iv.se, "df": iv.df, "sigma_seed": math.sqrt(iv.sigma2_seed),
            "sigma_doc": math.sqrt(iv.sigma2_doc), "sigma_res": math.sqrt(iv.sigma2_res), "baseline_mean": base_mean,
            "margin": margin, "effect_rel": spec.effect, "alpha": spec.alpha, "power": spec.power, "verdict": verdict,
            "runs_trained": m.runs_trained, "scoring_s": 0.0, "spent_s": m.spent_s, "spent_tokens": m.spent_tokens,
            "budget_s": spec.budget_s, "budget_tokens": spec.budget_tokens}


def decide_round(spec: CampaignSpec, campaign: str, state: CampaignState, m: Measured, created: datetime, *,
                 higher_is_better: bool) -> Decision:
    """Each strategy's interval and verdict after the round ``state`` ran (a verdict, once reached,
    stays), the round's rows, and the next round the planner chooses within the budget left; the
    campaign stops when the planner says so or a round would add nothing. ``higher_is_better``: whether a
    rise of the metric is better (the eval suites declare it: ``evals.suites.is_higher_better``)."""
    base_mean = float(m.units.filter(pl.col("strategy") == spec.baseline)["value"].mean())
    dsg = Q.design(spec.effect * base_mean if state.margin is None else state.margin, spec.alpha, spec.power)  # fixed at the pilot
    hib = higher_is_better
    resolved, states, rows = dict(state.resolved), [], []
    for s in spec.strategies:
        iv = Q.sequential_interval(paired_differences(m.units, spec.metric, s, spec.baseline), dsg)
        v = resolved.get(s) or Q.verdict(iv.low, iv.high, dsg.margin, hib)
        states.append(Q.StrategyState(s, iv.n_seeds, iv.n_units, (iv.sigma2_seed, iv.sigma2_doc, iv.sigma2_res), v != "unresolved"))
        rows.append({"campaign": campaign, "round": state.round, "strategy": s, **_round_row(spec, iv, dsg.margin, base_mean, v, m),
                     "started_at": state.started, "created_at": created})
        if v != "unresolved":
            resolved[s] = v
    rows[0]["scoring_s"] = m.scoring_s
    nxt = Q.plan_round(states, dsg, m.baseline_seeds, m.available, m.left, m.run_cost, m.unit_cost)
    need = Q.remaining_need(states, dsg, m.baseline_seeds, m.available, m.run_cost, m.unit_cost)
    for r in rows:
        r["next_plan"] = json.dumps({"seeds": nxt.seeds, "baseline_seeds": nxt.baseline_seeds, "units": nxt.units,
                                     "stop": nxt.stop, "cost": nxt.cost})
        r["needed"] = json.dumps(need.get(r["strategy"], {}))
    table = pl.DataFrame(rows, infer_schema_length=None).with_columns(
        pl.col("budget_s").cast(pl.Float64), pl.col("budget_tokens").cast(pl.Int64))
    stop = bool(nxt.stop) or (not nxt.seeds and nxt.units <= state.plan.get("units", 0))
    following = replace(state, round=state.round + 1, plan={"seeds": nxt.seeds, "baseline_seeds": nxt.baseline_seeds, "units": nxt.units},
                        scoring_s=state.scoring_s + m.scoring_s, margin=dsg.margin, resolved=resolved)
    return Decision(table, nxt, need, stop, following)


# --- what the campaign says -----------------------------------------------------------------------------


def round_lines(spec: CampaignSpec, rnd: int, d: Decision, elapsed: float) -> list[str]:
    """The log of a round: spending, each strategy's interval and verdict, the stop or the next round."""
    first = d.table.row(0, named=True)
    out = [f"{'pilot' if rnd == 0 else f'round {rnd}'}: spent {first['spent_s'] / 60:.1f} min, {first['spent_tokens']:,} training "
           f"tokens (this process: {elapsed / 60:.1f} min)"]
    for r in d.table.iter_rows(named=True):
        out.append(f"  {r['strategy']}: Δ {r['delta']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] over {r['n_seeds']} seeds × "
                   f"{r['n_units']} documents (σ_seed {r['sigma_seed']:.4f}, σ_doc {r['sigma_doc']:.4f}, σ_res {r['sigma_res']:.4f}): "
                   f"{r['verdict']}")
    nxt = d.plan
    out.append(f"stop: {nxt.stop}" if nxt.stop else
               f"next round: seeds {nxt.seeds} (baseline {nxt.baseline_seeds}), {nxt.units} documents, cost {spec.fmt(nxt.cost)}")
    return out


def _budget_text(spec: CampaignSpec, extra: float) -> str:
    if spec.budget_tokens is not None:
        return f"'{(spec.budget_tokens + extra) / 1e6:.1f}M tokens'"
    return f"{math.ceil((spec.budget_s + extra) / 60)}m"


def after_pilot_lines(spec: CampaignSpec, need: dict, left: float) -> list[str]:
    """Right after the pilot: whether the budget can reach a verdict, and what it would need."""
    out = []
    for s, n in need.items():
        if not n["feasible"]:
            out.append(f"after the pilot: {s} cannot be resolved at ±{spec.effect:.2%} with the held-out documents there are "
                       f"({n['reason']}; it needs ≥ {n['units_floor']} documents: raise heldout_fraction)")
        elif n["cost"] > left:
            out.append(f"after the pilot: {s} needs {n['seeds']} seeds × {n['units']} documents, about {spec.fmt(n['cost'])} more; "
                       f"the budget has {spec.fmt(left)} left: run `strata ablate` again with --budget "
                       f"{_budget_text(spec, n['cost'] - left)} more")
    return out


# --- the records ------------------------------------------------------------------------------------------


class CampaignStore:
    """The campaign's rows and scores in the data root's DuckDB, and what it has spent."""

    def __init__(self, root: Path, spec: CampaignSpec):
        self.root, self.spec, self.id = Path(root), spec, spec.key()

    def _con(self, read_only: bool = False):
        return duckdb.connect(str(self.root / "strata.duckdb"), read_only=read_only)

    def _tables(self, con) -> set[str]:
        return {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}

    def rows(self) -> pl.DataFrame:
        """This campaign's ``ablation_campaign`` rows, by round and strategy (none yet: empty)."""
        if not (self.root / "strata.duckdb").exists():
            return pl.DataFrame()
        with self._con() as con:
            if CAMPAIGN_TABLE not in self._tables(con):
                return pl.DataFrame()
            return con.sql(f"SELECT * FROM {CAMPAIGN_TABLE} WHERE campaign = ? ORDER BY round, strategy", params=[self.id]).pl()

    def write_round(self, table: pl.DataFrame, rnd: int) -> None:
        with self._con() as con:
            replace_rows(con, CAMPAIGN_TABLE, table, {"campaign": self.id, "round": rnd})

    def spent(self, started: datetime, scoring_s: float, tokens_per_run: int) -> tuple[float, int]:
        """(wall seconds, training tokens) spent since ``started``: every materialization's ``wall_s``
        in the lineage (training, evaluations and anything upstream the campaign ran) plus scoring."""
        with self._con() as con:
            s, runs = con.execute("SELECT coalesce(sum(wall_s), 0), count(*) FILTER (WHERE asset = 'training_runs') "
                                  "FROM lineage WHERE created_at >= ?", [started]).fetchall()[0]
        return float(s) + scoring_s, int(runs) * tokens_per_run

    def costs(self, spent_s: float, spent_tokens: int, tokens_per_run: int) -> tuple[float, float, float]:
        """(cost of one training run, of one scored (run, document), budget left) in the budget's unit."""
        if self.spec.budget_tokens is not None:
            return float(tokens_per_run), 0.0, float(self.spec.budget_tokens - spent_tokens)
        with self._con() as con:
            per = con.execute("SELECT avg(w) FROM (SELECT partition, sum(wall_s) AS w FROM lineage WHERE asset IN "
                              "('training_runs', 'evaluations') GROUP BY partition, run_id)").fetchall()[0][0]
            scored = con.execute(f"SELECT count(*) FROM {UNITS_TABLE}").fetchall()[0][0] if self.spec.metric == HELDOUT else 0
        rows = self.rows()
        score_s = float(rows["scoring_s"].sum()) if rows.height else 0.0
        return float(per) if per else 60.0, score_s / scored if scored else 0.0, float(self.spec.budget_s - spent_s)

    def scores(self, wanted: dict[str, list[int]], n_units: int) -> tuple[pl.DataFrame, float, int]:
        """Per-document values of the campaign's metric for every (strategy, seed) of ``wanted``:
        (rows strategy, seed, metric, unit, value; scoring seconds spent; documents available)."""
        return self._eval_units(wanted) if self.spec.metric != HELDOUT else self._heldout_units(wanted, n_units)

    def _heldout_units(self, wanted: dict[str, list[int]], n_units: int) -> tuple[pl.DataFrame, float, int]:
        """The held-out documents' losses under each run's saved model (one forward pass each), the
        first ``n_units`` documents of the fixed held-out order; a model's documents scored before
        (same data version) are read from ``ablation_units``."""
        layout = Layout(self.root)
        every = load_heldout_batch(layout, 10 ** 9, load_tokenizer(layout.tokenizer))
        if every is None:
            raise StrataInputError("no held-out documents to score", path=layout.heldout,
                                   fix="set heldout_fraction > 0 and rerun strata run")
        n = min(n_units, every.n_docs)
        batch = replace(every, tokens=every.tokens[:n], filled=every.filled[:n], units=every.units[:n])
        with self._con() as con:
            cached = con.sql(f"SELECT * FROM {UNITS_TABLE}").pl() if UNITS_TABLE in self._tables(con) else pl.DataFrame()
            versions = {(s, seed): latest_data_version(con, "training_runs", f"{seed}|{s}") for s,
                        seeds in wanted.items() for seed in seeds}
        frames, fresh, spent = [], [], 0.0
        for (strategy, seed), version in versions.items():
            mine = cached.filter((pl.col("strategy") == strategy) & (pl.col("seed") == seed) & (pl.col("version") == version)
                                 & pl.col("unit").is_in(batch.units)) if cached.height else cached
            if mine.height >= n:  # this model's documents, scored before
                frames.append(mine)
                continue
            t0 = time.perf_counter()
            values = _score(layout, strategy, seed, batch)
            df = pl.DataFrame({"strategy": strategy, "seed": seed, "unit": batch.units, "value": values, "version": version},
                              schema={"strategy": pl.String, "seed": pl.Int64, "unit": pl.String, "value": pl.Float64,
                                      "version": pl.String})
            spent += time.perf_counter() - t0
            fresh.append(((strategy, seed), df))
            frames.append(df)
        if fresh:
            with self._con() as con:
                for (strategy, seed), df in fresh:
                    replace_rows(con, UNITS_TABLE, df, {"strategy": strategy, "seed": seed})
        out = pl.concat([f.select("strategy", pl.col("seed").cast(pl.Int64), "unit", "value") for f in frames])
        return out.with_columns(metric=pl.lit(HELDOUT)), spent, every.n_docs

    def _eval_units(self, wanted: dict[str, list[int]]) -> tuple[pl.DataFrame, float, int]:
        with self._con() as con:
            have = self._tables(con)
            evals = con.sql("SELECT * FROM eval_results").pl() if "eval_results" in have else None
            units = con.sql("SELECT * FROM eval_units").pl() if "eval_units" in have else None
        u = run_units(None, evals, units).filter(pl.col("metric") == self.spec.metric)
        keep = pl.concat([pl.DataFrame({"strategy": [s] * len(v), "seed": v}, schema={"strategy": pl.String, "seed": pl.Int64})
                          for s, v in wanted.items()])
        u = u.join(keep, on=["strategy", "seed"], how="inner")
        if u.is_empty():
            raise StrataInputError(f"metric {self.spec.metric!r} has no values in eval_results / eval_units",
                                   path=self.root / "strata.duckdb",
                                   fix=f"use --metric {HELDOUT}, or a metric the report lists (strata report)")
        return u, 0.0, int(u["unit"].n_unique())

    def measure(self, cfg, state: CampaignState, wanted: dict[str, list[int]], runs_trained: int) -> Measured:
        """What the round ``state`` measured once its runs (``wanted``) are trained: their scores, what
        the campaign has spent and what the next round would cost."""
        units, score_s, available = self.scores(wanted, state.plan["units"] or 10 ** 9)
        spent_s, spent_tokens = self.spent(state.started, state.scoring_s + score_s, tokens_per_run(cfg))
        run_cost, unit_cost, left = self.costs(spent_s, spent_tokens, tokens_per_run(cfg))
        return Measured(units, available, len(wanted[self.spec.baseline]), runs_trained, score_s, spent_s, spent_tokens,
                        run_cost, unit_cost, left)

    def progress(self, cfg, state: CampaignState, done: int, total: int, key) -> str:
        """The line logged as the round ``state`` starts its run ``done + 1`` of ``total`` (``key``): the budget spent and left."""
        s, tokens = self.spent(state.started, state.scoring_s, tokens_per_run(cfg))
        spec = self.spec
        spent = s if spec.budget_s is not None else tokens
        return (f"round {state.round}: run {done + 1}/{total} ({key}); spent {spec.fmt(spent)} of {spec.fmt(spec.budget)}, "
                f"{spec.fmt(max(0.0, spec.budget - spent))} left")

    def write_report(self, rows: pl.DataFrame, log: Callable[[str], None]) -> None:
        """``report/ablate.md`` and its figure from the campaign's rows; the markdown is logged too."""
        layout = Layout(self.root)
        fig = plot_campaign(rows, layout.inside("report", "ablation_campaign.png"))
        md = campaign_markdown(rows, fig.name)
        write_text(md, layout.inside("report", "ablate.md"))
        log("\n" + md)


def _score(layout: Layout, strategy: str, seed: int, batch):
    """Each held-out document's loss under the saved model of run (strategy, seed)."""
    import torch  # noqa: F401  (loaded before the model)
    from transformers import AutoModelForCausalLM

    dev = device()
    model = AutoModelForCausalLM.from_pretrained(str(layout.run_dir(strategy, seed) / "model")).to(dev).eval()
    return score_heldout(model, batch, dev)


# --- what a campaign would need, for the demo ---------------------------------------------------------------


def demo_sentence(power: pl.DataFrame, tokens_per_run: int, run_seconds: float | None, strategies: int = 1) -> str:
    """What ``strata ablate --budget …`` would need, in one sentence, from the report's pooled power row."""
    pooled = power.filter(pl.col("strategy") == "pooled")
    if pooled.is_empty():
        return ""
    r = pooled.row(0, named=True)
    vc = Q.VarianceComponents(r["sigma_seed"] ** 2, r["sigma_doc"] ** 2, r["sigma_res"] ** 2, r["n_seeds"], r["n_units"])
    dsg = Q.design(r["target"])
    t = Q.target_grid(vc.clipped(), dsg, r["n_seeds"], r["n_units"], r["max_units"])
    if not t.feasible:
        return (f"`strata ablate --strategies greedy` cannot resolve ±{r['target_rel']:.1%} on this corpus at any budget: the "
                f"document-to-document spread needs ≥ {t.units_floor} held-out documents and {r['max_units']} exist (raise "
                "heldout_fraction).")
    runs = (t.seeds - r["n_seeds"]) * (strategies + 1)
    if run_seconds:
        need = f"--budget {math.ceil(runs * run_seconds / 60)}m"
    else:
        need = f"--budget '{runs * tokens_per_run / 1e6:.1f}M tokens'"
    return (f"`strata ablate --strategies greedy {need}` would need {t.seeds} seeds × {t.units} held-out documents "
            f"({runs} more training runs) to call greedy better, worse or equivalent within ±{r['target_rel']:.1%} of random.")


def demo_ablate_sentence(root) -> str:
    """:func:`demo_sentence` from a data root's ``ablation_power`` and the measured run times."""
    db = Path(root) / "strata.duckdb"
    if not db.is_file():
        return ""
    with duckdb.connect(str(db), read_only=True) as con:
        have = {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        if "ablation_power" not in have:
            return ""
        power = con.sql("SELECT * FROM ablation_power").pl()
        per = con.execute("SELECT avg(w) FROM (SELECT partition, run_id, sum(wall_s) AS w FROM lineage WHERE asset IN "
                          "('training_runs', 'evaluations') GROUP BY partition, run_id)").fetchall()[0][0]
    tokens = power["tokens_per_run"].drop_nulls()
    return demo_sentence(power, int(tokens[0]) if tokens.len() else 0, float(per) if per else None)
