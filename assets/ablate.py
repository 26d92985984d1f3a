"""``strata ablate`` (and the ``ablate`` job of the UI): the driver of a sequential ablation campaign.

The campaign's decisions (the pilot, each round's verdicts, the next round or the stop) and its
records are the library's, :mod:`pipeline.reports.campaign`; this module materializes what a round
needs through Dagster: the orderings when they are missing or stale, then the strategy × seed
partitions of ``training_runs`` (and of ``evaluations`` for an evaluation metric; every partition
already materialized and fresh is reused). A killed campaign run again with the same arguments
finds its rows, and runs the round its last row planned: the partitions that round had already
materialized are reused, the rest trained (a training run killed midway resumes from its checkpoint).
"""

from __future__ import annotations

import os
import socket
import time

import dagster as dg
import polars as pl

from assets.dagster_internals import StaleStatus
from evals.suites import is_higher_better
from pipeline.config import resolve_config
from pipeline.config_source import record_config
from pipeline.reports import campaign as C
from pipeline.reports.campaign import CampaignSpec, seed_list


class Campaign:
    """One campaign over a data root: materializes the runs a round needs, scores documents, decides."""

    def __init__(self, spec: CampaignSpec, config_file: str | None, data_root: str | None, log=print, instance=None):
        self.spec, self.log = spec, log
        base = resolve_config(config_file, data_root)
        self.root = base.root
        self.base_data, self.base_seeds = C.base_config_data(config_file), list(base.seeds)
        self.config_path = self.root / "ablate_config.yaml"
        self.instance = instance
        self.id = spec.key()
        self.store = C.CampaignStore(self.root, spec)
        self._write_config(seed_list(self.base_seeds, spec.pilot_seeds))
        self.cfg = resolve_config(str(self.config_path), str(self.root))

    def _write_config(self, seeds: list[int]) -> None:
        """The configuration the UI and the assets see (``ablate_config.yaml``)."""
        C.write_config(self.config_path, self.base_data, self.base_seeds, self.spec, seeds, self.root)

    def _definitions(self) -> dg.Definitions:
        from assets.common import sync_partitions
        from assets.definitions import build_definitions

        os.environ["STRATA_CONFIG"] = str(self.config_path)
        self.cfg = resolve_config(str(self.config_path), str(self.root))
        defs = build_definitions(str(self.config_path), str(self.root))
        self.instance = self.instance or dg.DagsterInstance.get()
        record_config(self.cfg)
        sync_partitions(self.instance, self.cfg, defs.resolve_asset_graph())
        return defs

    def _fresh(self, defs: dg.Definitions, asset: str, partition) -> bool:
        from assets.status import resolver
        from pipeline.storage.lineage import OnDisk

        status = resolver(defs, self.instance).get_status(dg.AssetKey(asset), partition)
        return status == StaleStatus.FRESH and not OnDisk(self.root).problem(asset, str(partition))

    def ensure_upstream(self, defs: dg.Definitions) -> None:
        """Materialize what the orderings of the campaign's strategies need, when any of it is
        missing or stale (a data root after ``strata demo`` has it all)."""
        from assets.runner import materialize_all

        need = [s for s in (self.spec.baseline, *self.spec.strategies) if not self._fresh(defs, "orderings", s)]
        if need:
            self.log(f"orderings missing or stale for {', '.join(need)}: materializing everything up to the orderings")
            materialize_all(str(self.config_path), str(self.root), select="*orderings", log=self.log, instance=self.instance)

    def materialize_runs(self, defs: dg.Definitions, wanted: dict[str, list[int]], progress) -> int:
        """Train (and evaluate, for an evaluation metric) every (strategy, seed) of ``wanted`` whose
        partition is missing or stale; returns how many were run."""
        from assets.partition_runs import materialize_run
        from assets.runner import release_dead_claims

        for run_id in release_dead_claims(self.instance):
            self.log(f"freed the training-pool slot of run {run_id} (its strata process is gone)")
        assets = ["training_runs"] + ([] if self.spec.metric == C.HELDOUT else ["evaluations"])
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

    def run(self) -> pl.DataFrame:
        """Run the campaign's rounds from where its rows left off until the planner stops; its rows."""
        rows = self.store.rows()
        state = C.start_state(self.spec, rows, self.cfg.heldout_docs, C.now())
        if state.finished:
            self.log(f"campaign {self.id} already finished after round {state.round - 1}: {state.finished}")
        elif rows.height:
            self.log(f"resuming campaign {self.id} at round {state.round} (planned: {state.plan['seeds']} seeds, "
                     f"{state.plan['units']} documents)")
        t_start = time.perf_counter()
        while not state.finished:
            self._write_config(C.config_seeds(self.base_seeds, state.plan))
            defs = self._definitions()
            if state.round == 0:
                self.ensure_upstream(defs)
            wanted = C.round_seeds(self.spec, state.plan, self.base_seeds, rows)
            trained = self.materialize_runs(defs, wanted, lambda *run, state=state: self.log(self.store.progress(self.cfg, state, *run)))
            measured = self.store.measure(self.cfg, state, wanted, trained)
            decision = C.decide_round(self.spec, self.id, state, measured, C.now(), higher_is_better=is_higher_better(self.spec.metric))
            self.store.write_round(decision.table, state.round)
            rows = self.store.rows()
            for line in C.round_lines(self.spec, state.round, decision, time.perf_counter() - t_start):
                self.log(line)
            for line in C.after_pilot_lines(self.spec, decision.need, measured.left) if state.round == 0 else ():
                self.log(line)
            if decision.stop:
                break
            state = decision.next
        self.store.write_report(rows, self.log)
        return rows


def run_campaign(spec: CampaignSpec, config_file: str | None, data_root: str | None, log=print, instance=None) -> pl.DataFrame:
    """Run (or resume) the campaign ``spec`` on the data root; returns its ``ablation_campaign`` rows."""
    return Campaign(spec, config_file, data_root, log, instance).run()
