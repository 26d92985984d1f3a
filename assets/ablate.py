"""``strata ablate`` (and the ``ablate`` job of the UI): a sequential ablation campaign.

A pilot (the first ``pilot_seeds`` seeds × ``heldout_docs`` held-out documents), then rounds that
add seeds (more strategy × seed partitions of ``training_runs``, and of ``evaluations`` for an
evaluation metric; every partition already materialized and fresh is reused) and held-out
documents (each scored once per run by the saved model: one forward pass), chosen by
``pipeline.reports.sequential.plan_round`` from the measured σ_seed / σ_doc / σ_res and the budget
left, until every strategy has a verdict or the budget is spent. The intervals are the
anytime-valid confidence sequence of ``pipeline.reports.sequential``, so looking after every round
keeps the error rates.

State lives in DuckDB: ``ablation_campaign`` (one row per round and strategy: grid, Δ, interval,
components, verdict, spending, the next round's plan) and ``ablation_units`` (the per-document
scores of each model, keyed by its data version). A killed campaign run again with the same
arguments finds its rows, and runs the round its last row planned: the partitions that round had
already materialized are reused, the rest trained (a training run killed midway resumes from its
checkpoint). Spending is counted from the lineage (``wall_s`` of every materialization since the
campaign started) plus the scoring time, so a kill loses none of it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from pipeline.errors import StrataInputError
from pipeline.reports import sequential as Q
from pipeline.reports.stats import TARGET_EFFECT

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

    def check(self, cfg) -> None:
        from pipeline.ordering.strategies import names as strategy_names

        known = set(strategy_names())  # every registered strategy (STRATA_PLUGINS' too)
        for s in (*self.strategies, self.baseline):
            if s not in known:
                raise StrataInputError(f"unknown strategy {s!r}", fix=f"name strategies among {sorted(known)} (strata list strategies)")
        if not self.strategies or self.baseline in self.strategies:
            raise StrataInputError("strata ablate needs strategies other than the baseline",
                                   fix=f"pass --strategies with names other than {self.baseline!r}, e.g. --strategies greedy")
        if (self.budget_s is None) == (self.budget_tokens is None):
            raise StrataInputError("strata ablate needs one budget", fix="pass --budget 60m (wall time) or --budget 5M tokens")
        if not (0 < self.effect < 1):
            raise StrataInputError(f"effect {self.effect!r} is not a fraction of the baseline",
                                   fix="pass --effect 0.005 (0.5% of the baseline's mean)")
        if self.pilot_seeds < 2:
            raise StrataInputError("the pilot needs at least 2 seeds (the seed-to-seed spread)", fix="pass --pilot-seeds 3")


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


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class Campaign:
    """One campaign over a data root: materializes the runs a round needs, scores documents, looks."""

    def __init__(self, spec: CampaignSpec, config_file: str | None, data_root: str | None, log=print, instance=None):
        import yaml

        from pipeline.config import resolve_config

        self.spec, self.log = spec, log
        base = resolve_config(config_file, data_root)
        spec.check(base)
        self.root = base.root
        self.base_data = yaml.safe_load(Path(config_file).read_text(encoding="utf-8")) if config_file else {}
        self.base_data = {k: v for k, v in (self.base_data or {}).items() if k != "data_root"}
        self.base_seeds = list(base.seeds)
        self.config_path = self.root / "ablate_config.yaml"
        self.instance = instance
        self.id = spec.key()
        self._write_config(seed_list(self.base_seeds, spec.pilot_seeds))
        self.cfg = resolve_config(str(self.config_path), str(self.root))

    # --- the configuration the UI and the assets see ---------------------------------------------

    def _write_config(self, seeds: list[int]) -> None:
        import yaml

        from pipeline.config import config_from_dict

        data = dict(self.base_data)
        strategies = list(dict.fromkeys([*(data.get("strategies") or []), self.spec.baseline, *self.spec.strategies]))
        if not data.get("strategies"):
            from pipeline.config import StrataConfig

            strategies = list(dict.fromkeys([*StrataConfig().strategies, self.spec.baseline, *self.spec.strategies]))
        data["strategies"] = strategies
        data["seeds"] = sorted(set(self.base_seeds) | set(seeds))
        config_from_dict({**data, "data_root": str(self.root)})  # a bad value stops here, naming the fix
        self.root.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(data, sort_keys=True), encoding="utf-8")

    def _definitions(self):
        import dagster as dg

        from assets.common import record_config, sync_partitions
        from assets.definitions import build_definitions
        from pipeline.config import resolve_config

        os.environ["STRATA_CONFIG"] = str(self.config_path)
        self.cfg = resolve_config(str(self.config_path), str(self.root))
        defs = build_definitions(str(self.config_path), str(self.root))
        self.instance = self.instance or dg.DagsterInstance.get()
        record_config(self.cfg)
        sync_partitions(self.instance, self.cfg, defs.resolve_asset_graph())
        return defs

    # --- DuckDB -------------------------------------------------------------------------------------

    def _con(self, read_only: bool = False):
        import duckdb

        return duckdb.connect(str(self.root / "strata.duckdb"), read_only=read_only)

    def rows(self) -> pl.DataFrame:
        if not (self.root / "strata.duckdb").exists():
            return pl.DataFrame()
        with self._con() as con:
            if not con.execute(f"SELECT count(*) FROM information_schema.tables WHERE table_name = '{CAMPAIGN_TABLE}'").fetchall()[0][0]:
                return pl.DataFrame()
            return con.sql(f"SELECT * FROM {CAMPAIGN_TABLE} WHERE campaign = ? ORDER BY round, strategy", params=[self.id]).pl()

    def _spent(self, started: datetime, scoring_s: float) -> tuple[float, int]:
        """(wall seconds, training tokens) spent since ``started``: every materialization's ``wall_s``
        in the lineage (training, evaluations and anything upstream the campaign ran) plus scoring."""
        with self._con() as con:
            s, runs = con.execute("SELECT coalesce(sum(wall_s), 0), count(*) FILTER (WHERE asset = 'training_runs') "
                                  "FROM lineage WHERE created_at >= ?", [started]).fetchall()[0]
        return float(s) + scoring_s, int(runs) * self.tokens_per_run

    @property
    def tokens_per_run(self) -> int:
        return self.cfg.max_steps * self.cfg.batch_size * self.cfg.seq_len

    # --- materializing and scoring -------------------------------------------------------------------

    def _fresh(self, defs, asset: str, partition) -> bool:
        import dagster as dg
        from dagster._core.definitions.data_version import StaleStatus

        from assets.status import OnDisk, resolver

        status = resolver(defs, self.instance).get_status(dg.AssetKey(asset), partition)
        return status == StaleStatus.FRESH and not OnDisk(self.root).problem(asset, str(partition))

    def ensure_upstream(self, defs) -> None:
        """Materialize what the orderings of the campaign's strategies need, when any of it is
        missing or stale (a data root after ``strata demo`` has it all)."""
        from assets.runner import materialize_all

        need = [s for s in (self.spec.baseline, *self.spec.strategies)
                if not self._fresh(defs, "orderings", s)]
        if need:
            self.log(f"orderings missing or stale for {', '.join(need)}: materializing everything up to the orderings")
            materialize_all(str(self.config_path), str(self.root), select="*orderings", log=self.log, instance=self.instance)

    def materialize_runs(self, defs, wanted: dict[str, list[int]], progress) -> int:
        """Train (and evaluate, for an evaluation metric) every (strategy, seed) of ``wanted`` whose
        partition is missing or stale; returns how many were run."""
        import dagster as dg

        from assets.partition_runs import materialize_run
        from assets.runner import release_dead_claims

        for run_id in release_dead_claims(self.instance):
            self.log(f"freed the training-pool slot of run {run_id} (its strata process is gone)")
        assets = ["training_runs"] + ([] if self.spec.metric == HELDOUT else ["evaluations"])
        all_assets = list(defs.assets) + list(defs.asset_checks or [])
        tags = {"strata/pid": str(os.getpid()), "strata/host": socket.gethostname(), "strata/campaign": self.id}
        todo = []
        for strategy, seeds in wanted.items():
            for seed in seeds:
                key = dg.MultiPartitionKey({"strategy": strategy, "seed": str(seed)})
                stale = [a for a in assets if not self._fresh(defs, a, key)]
                if stale:
                    todo.append((key, stale))
        for i, (key, stale) in enumerate(todo, 1):
            progress(i - 1, len(todo), key)
            materialize_run(all_assets, defs.resources, self.instance, stale, key, "WARNING", tags)
        return len(todo)

    def scores(self, wanted: dict[str, list[int]], n_units: int) -> tuple[pl.DataFrame, float, int]:
        """Per-document values of ``metric`` for every (strategy, seed) of ``wanted``: (rows
        strategy, seed, metric, unit, value; scoring seconds spent; documents available)."""
        if self.spec.metric != HELDOUT:
            return self._eval_units(wanted)
        from dataclasses import replace

        import torch  # noqa: F401  (loaded before the model)
        from transformers import AutoModelForCausalLM

        from assets.training import load_heldout_batch
        from pipeline.data.tokenizer import load_tokenizer
        from pipeline.devices import device
        from pipeline.storage.layout import Layout
        from pipeline.storage.warehouse import latest_data_version, replace_rows
        from pipeline.training.heldout import score_heldout

        layout = Layout(self.root)
        tok = load_tokenizer(layout.tokenizer)
        every = load_heldout_batch(layout, 10 ** 9, tok)
        if every is None:
            raise StrataInputError("no held-out documents to score", path=layout.heldout,
                                   fix="set heldout_fraction > 0 and rerun strata run")
        n = min(n_units, every.n_docs)
        batch = replace(every, tokens=every.tokens[:n], filled=every.filled[:n], units=every.units[:n])
        frames, fresh, spent = [], [], 0.0
        with self._con() as con:
            have = {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
            cached = con.sql(f"SELECT * FROM {UNITS_TABLE}").pl() if UNITS_TABLE in have else pl.DataFrame()
            versions = {(s, seed): latest_data_version(con, "training_runs", f"{seed}|{s}") for s,
                        seeds in wanted.items() for seed in seeds}
        for (strategy, seed), version in versions.items():
            mine = cached.filter((pl.col("strategy") == strategy) & (pl.col("seed") == seed) & (pl.col("version") == version)
                                 & pl.col("unit").is_in(batch.units)) if cached.height else cached
            if mine.height >= n:  # this model's documents, scored before
                frames.append(mine)
                continue
            t0 = time.perf_counter()
            dev = device()
            model = AutoModelForCausalLM.from_pretrained(str(layout.run_dir(strategy, seed) / "model")).to(dev).eval()
            values = score_heldout(model, batch, dev)
            spent += time.perf_counter() - t0
            df = pl.DataFrame({"strategy": strategy, "seed": seed, "unit": batch.units, "value": values, "version": version},
                              schema={"strategy": pl.String, "seed": pl.Int64, "unit": pl.String, "value": pl.Float64,
                                      "version": pl.String})
            fresh.append(((strategy, seed), df))
            frames.append(df)
        if fresh:
            with self._con() as con:
                for (strategy, seed), df in fresh:
                    replace_rows(con, UNITS_TABLE, df, {"strategy": strategy, "seed": seed})
        out = pl.concat([f.select("strategy", pl.col("seed").cast(pl.Int64), "unit", "value") for f in frames])
        return out.with_columns(metric=pl.lit(HELDOUT)), spent, every.n_docs

    def _eval_units(self, wanted: dict[str, list[int]]) -> tuple[pl.DataFrame, float, int]:
        from pipeline.reports.tables import run_units

        with self._con() as con:
            have = {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
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

    # --- the campaign --------------------------------------------------------------------------------

    def run(self) -> pl.DataFrame:
        spec, log = self.spec, self.log
        dsg_margin = None
        rows = self.rows()
        t_start = time.perf_counter()
        if rows.height:
            last = rows.filter(pl.col("round") == rows["round"].max())
            started = rows["started_at"].min()
            scoring = float(rows["scoring_s"].sum())
            rnd = int(last["round"][0]) + 1
            plan = json.loads(last["next_plan"][0])
            if plan.get("stop"):
                log(f"campaign {self.id} already finished after round {rnd - 1}: {plan['stop']}")
                self.write_report(rows)
                return rows
            log(f"resuming campaign {self.id} at round {rnd} (planned: {plan['seeds']} seeds, {plan['units']} documents)")
            dsg_margin = float(last["margin"][0])
        else:
            started, scoring, rnd = _now(), 0.0, 0
            plan = {"seeds": {s: spec.pilot_seeds for s in spec.strategies}, "baseline_seeds": spec.pilot_seeds,
                    "units": self.cfg.heldout_docs if spec.metric == HELDOUT else 0}
        resolved = {}
        if rows.height:
            for r in rows.filter(pl.col("verdict") != "unresolved").iter_rows(named=True):
                resolved[r["strategy"]] = r["verdict"]
        defs = None
        while True:
            self._write_config(seed_list(self.base_seeds, max([plan["baseline_seeds"], *plan["seeds"].values()])))
            defs = self._definitions()
            if rnd == 0 and defs is not None:
                self.ensure_upstream(defs)
            wanted = {s: seed_list(self.base_seeds, n) for s, n in plan["seeds"].items()}
            wanted[spec.baseline] = seed_list(self.base_seeds, plan["baseline_seeds"])
            for s in spec.strategies:  # a strategy with a verdict keeps its seeds (its looks are over)
                wanted.setdefault(s, seed_list(self.base_seeds, self._seeds_of(rows, s)))
            budget = spec.budget_s if spec.budget_s is not None else spec.budget_tokens

            def progress(done: int, total: int, key, rnd=rnd, budget=budget, scoring=scoring) -> None:
                s, tk = self._spent(started, scoring)
                spent = s if spec.budget_s is not None else tk
                log(f"round {rnd}: run {done + 1}/{total} ({key}); spent {self._fmt(spent)} of {self._fmt(budget)}, "
                    f"{self._fmt(max(0.0, budget - spent))} left")

            n_new = self.materialize_runs(defs, wanted, progress)
            units, score_s, available = self.scores(wanted, plan["units"] or 10 ** 9)
            scoring += score_s
            spent_s, spent_tok = self._spent(started, scoring)
            base_mean = float(units.filter(pl.col("strategy") == spec.baseline)["value"].mean())
            if dsg_margin is None:
                dsg_margin = spec.effect * base_mean  # fixed at the pilot: the design must not move with the data
            dsg = Q.design(dsg_margin, spec.alpha, spec.power)
            from pipeline.reports.stats import paired_differences
            from pipeline.reports.tables import higher_is_better

            hib = higher_is_better(spec.metric)
            states, new_rows = [], []
            for s in spec.strategies:
                d = paired_differences(units, spec.metric, s, spec.baseline)
                iv = Q.sequential_interval(d, dsg)
                v = resolved.get(s) or Q.verdict(iv.low, iv.high, dsg.margin, hib)
                states.append(Q.StrategyState(s, iv.n_seeds, iv.n_units, (iv.sigma2_seed, iv.sigma2_doc, iv.sigma2_res),
                                              v != "unresolved"))
                new_rows.append({"campaign": self.id, "round": rnd, "strategy": s, "baseline": spec.baseline, "metric": spec.metric,
                                 "n_seeds": iv.n_seeds, "n_units": iv.n_units, "delta": iv.delta, "ci_low": iv.low,
                                 "ci_high": iv.high, "se": iv.se, "df": iv.df, "sigma_seed": math.sqrt(iv.sigma2_seed),
                                 "sigma_doc": math.sqrt(iv.sigma2_doc), "sigma_res": math.sqrt(iv.sigma2_res),
                                 "baseline_mean": base_mean, "margin": dsg.margin, "effect_rel": spec.effect,
                                 "alpha": spec.alpha, "power": spec.power, "verdict": v,
                                 "runs_trained": n_new, "scoring_s": 0.0, "spent_s": spent_s, "spent_tokens": spent_tok,
                                 "budget_s": spec.budget_s, "budget_tokens": spec.budget_tokens,
                                 "started_at": started, "created_at": _now()})
                if v != "unresolved":
                    resolved[s] = v
            new_rows[0]["scoring_s"] = score_s
            # the cost of a run and of a scored document, measured (wall time) or counted (tokens)
            run_cost, unit_cost, left = self._costs(spent_s, spent_tok, units)
            base_have = len(wanted[spec.baseline])
            nxt = Q.plan_round(states, dsg, base_have, available, left, run_cost, unit_cost)
            need = Q.remaining_need(states, dsg, base_have, available, run_cost, unit_cost)
            for r in new_rows:
                r["next_plan"] = json.dumps({"seeds": nxt.seeds, "baseline_seeds": nxt.baseline_seeds, "units": nxt.units,
                                             "stop": nxt.stop, "cost": nxt.cost})
                r["needed"] = json.dumps(need.get(r["strategy"], {}))
            table = pl.DataFrame(new_rows, infer_schema_length=None).with_columns(
                pl.col("budget_s").cast(pl.Float64), pl.col("budget_tokens").cast(pl.Int64))
            with self._con() as con:
                from pipeline.storage.warehouse import replace_rows

                replace_rows(con, CAMPAIGN_TABLE, table, {"campaign": self.id, "round": rnd})
            rows = self.rows()
            self._log_round(rnd, table, need, nxt, spent_s, spent_tok, time.perf_counter() - t_start)
            if rnd == 0:
                self._after_pilot(need, left, run_cost)
            if nxt.stop or (not nxt.seeds and nxt.units <= plan.get("units", 0)):
                break
            plan = {"seeds": nxt.seeds, "baseline_seeds": nxt.baseline_seeds, "units": nxt.units}
            rnd += 1
        self.write_report(rows)
        return rows

    def _seeds_of(self, rows: pl.DataFrame, strategy: str) -> int:
        if not rows.height:
            return self.spec.pilot_seeds
        mine = rows.filter(pl.col("strategy") == strategy)
        return int(mine["n_seeds"].max()) if mine.height else self.spec.pilot_seeds

    def _costs(self, spent_s: float, spent_tok: int, units: pl.DataFrame) -> tuple[float, float, float]:
        """(cost of one training run, of one scored (run, document), budget left) in the budget's unit."""
        if self.spec.budget_tokens is not None:
            return float(self.tokens_per_run), 0.0, float(self.spec.budget_tokens - spent_tok)
        with self._con() as con:
            per = con.execute("SELECT avg(w) FROM (SELECT partition, sum(wall_s) AS w FROM lineage WHERE asset IN "
                              "('training_runs', 'evaluations') GROUP BY partition, run_id)").fetchall()[0][0]
            scored = con.execute(f"SELECT count(*) FROM {UNITS_TABLE}").fetchall()[0][0] if self.spec.metric == HELDOUT else 0
        score_s = float(self.rows()["scoring_s"].sum()) if self.rows().height else 0.0
        run_cost = float(per) if per else 60.0
        unit_cost = score_s / scored if scored else 0.0
        return run_cost, unit_cost, float(self.spec.budget_s - spent_s)

    def _fmt(self, x: float) -> str:
        if self.spec.budget_tokens is not None:
            return f"{x:,.0f} tokens"
        return f"{x / 60:.1f} min"

    def _log_round(self, rnd, table, need, nxt, spent_s, spent_tok, elapsed) -> None:
        name = "pilot" if rnd == 0 else f"round {rnd}"
        self.log(f"{name}: spent {spent_s / 60:.1f} min, {spent_tok:,} training tokens (this process: {elapsed / 60:.1f} min)")
        for r in table.iter_rows(named=True):
            self.log(f"  {r['strategy']}: Δ {r['delta']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] over {r['n_seeds']} seeds × "
                     f"{r['n_units']} documents (σ_seed {r['sigma_seed']:.4f}, σ_doc {r['sigma_doc']:.4f}, σ_res {r['sigma_res']:.4f}): "
                     f"{r['verdict']}")
        if nxt.stop:
            self.log(f"stop: {nxt.stop}")
        else:
            self.log(f"next round: seeds {nxt.seeds} (baseline {nxt.baseline_seeds}), {nxt.units} documents, "
                     f"cost {self._fmt(nxt.cost)}")

    def _after_pilot(self, need: dict, left: float, run_cost: float) -> None:
        """Right after the pilot: whether the budget can reach a verdict, and what it would need."""
        for s, n in need.items():
            if not n["feasible"]:
                self.log(f"after the pilot: {s} cannot be resolved at ±{self.spec.effect:.2%} with the held-out documents there are "
                         f"({n['reason']}; it needs ≥ {n['units_floor']} documents: raise heldout_fraction)")
            elif n["cost"] > left:
                self.log(f"after the pilot: {s} needs {n['seeds']} seeds × {n['units']} documents, about {self._fmt(n['cost'])} more; "
                         f"the budget has {self._fmt(left)} left: run `strata ablate` again with --budget "
                         f"{self._budget_text(n['cost'] - left)} more")

    def _budget_text(self, extra: float) -> str:
        if self.spec.budget_tokens is not None:
            return f"'{(self.spec.budget_tokens + extra) / 1e6:.1f}M tokens'"
        return f"{math.ceil((self.spec.budget_s + extra) / 60)}m"

    def write_report(self, rows: pl.DataFrame) -> None:
        from pipeline.reports.ablate_report import campaign_markdown, plot_campaign
        from pipeline.storage.atomic import write_text
        from pipeline.storage.layout import Layout

        layout = Layout(self.root)
        fig = plot_campaign(rows, layout.inside("report", "ablation_campaign.png"))
        md = campaign_markdown(rows, fig.name)
        write_text(md, layout.inside("report", "ablate.md"))
        self.log("\n" + md)


def run_campaign(spec: CampaignSpec, config_file: str | None, data_root: str | None, log=print, instance=None) -> pl.DataFrame:
    """Run (or resume) the campaign ``spec`` on the data root; returns its ``ablation_campaign`` rows."""
    return Campaign(spec, config_file, data_root, log, instance).run()


def demo_sentence(power: pl.DataFrame, tokens_per_run: int, run_seconds: float | None, strategies: int = 1) -> str:
    """What ``strata ablate --budget …`` would need, in one sentence, from the report's pooled power row."""
    import math as _m

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
        need = f"--budget {_m.ceil(runs * run_seconds / 60)}m"
    else:
        need = f"--budget '{runs * tokens_per_run / 1e6:.1f}M tokens'"
    return (f"`strata ablate --strategies greedy {need}` would need {t.seeds} seeds × {t.units} held-out documents "
            f"({runs} more training runs) to call greedy better, worse or equivalent within ±{r['target_rel']:.1%} of random.")



def demo_ablate_sentence(root) -> str:
    """:func:`demo_sentence` from a data root's ``ablation_power`` and the measured run times."""
    import duckdb

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
