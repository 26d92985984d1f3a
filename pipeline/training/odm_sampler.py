"""ODM outside Strata's trainer: a batch sampler over an ``hf`` or ``numpy`` export.

Online Data Mixing's Algorithm 1 (``pipeline.ordering.odm.ODMPolicy``, the state Strata's own
trainer keeps) chooses the cluster of every micro-batch; the sampler serves that many positions of
the export from the cluster's pool and learns from the losses it is told. A step is G
micro-batches (``accumulation``), each drawn from one cluster under the step's policy; the rewards
are updated once the step's G losses are known.

- Plain torch: ``DataLoader(dataset, batch_sampler=sampler)`` and ``sampler.observe(loss)`` after
  each micro-batch (its mean training loss).
- Hugging Face Trainer: ``train_dataset=ODMStream(dataset, sampler)``,
  ``callbacks=[ODMCallback(sampler)]``, ``max_steps`` set, ``per_device_train_batch_size`` = the
  sampler's batch size, ``gradient_accumulation_steps=1`` (the Trainer reports one loss per
  optimizer step, so each step is one micro-batch of one cluster) and
  ``dataloader_num_workers=0`` (the sampler must live in the training process). The callback
  makes the Trainer log every step and hands each step's loss to ``observe``; at the end of
  training it writes the served log.

Data loaders fetch batches ahead of training (accelerate one batch, the Trainer a step's
micro-batches), so a micro-batch is drawn before the losses of the last one or two are known:
``observe`` closes the oldest open micro-batch, and a policy is computed from the rewards
recorded when it is drawn (one or two steps late).

Clusters: :func:`export_clusters` follows the export's ``meta.json`` lineage to the ordering
(position -> sequence id) and the segments it was written from in the data root (their SHA-256
must still match), and takes each sequence's cluster as the cluster holding most of its tokens
(``pipeline.ordering.odm.sequence_clusters``) from the root's ``clusters.parquet``.

Served log (:meth:`ODMBatchSampler.write_log`, Parquet): one row per served sequence, in serving
order: ``step``, ``micro_batch``, ``position`` (row of the export), ``sequence_id``, ``cluster``,
``prob`` (the policy's probability of that cluster at that step).
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import Iterator

import numpy as np
import polars as pl
from torch.utils.data import IterableDataset, Sampler
from transformers import TrainerCallback

from pipeline.errors import StrataInputError
from pipeline.ordering.odm import ClusterPools, ODMPolicy, sequence_clusters
from pipeline.storage.atomic import file_sha256, write_parquet
from pipeline.storage.layout import Layout


def export_clusters(export_dir: str | Path, data_root: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(sequence id, cluster) of every position of an export written by ``strata export`` from ``data_root``."""
    meta_path = Path(export_dir) / "meta.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StrataInputError(f"cannot read the export's meta.json ({exc})", fix="give the directory `strata export` wrote",
                               path=meta_path) from None
    lineage = meta.get("lineage")
    if not isinstance(lineage, dict):
        raise StrataInputError("the export records no lineage", fix="export with `strata export` from the data root", path=meta_path)
    root = Path(data_root)
    paths = {}
    for key in ("ordering", "segments"):
        path = root / lineage[key]
        if not path.is_file():
            raise StrataInputError(f"the export's {key} {lineage[key]} is not in the data root",
                                   fix="give the data root the export was written from", path=path)
        if file_sha256(path) != lineage[f"{key}_sha256"]:
            raise StrataInputError(f"the {key} changed since the export was written",
                                   fix="export again (strata export) before training on it", path=path)
        paths[key] = path
    order = pl.read_parquet(paths["ordering"]).sort("position")["sequence_id"].to_numpy().astype(np.int64)
    if order.size != int(meta["n_sequences"]):
        raise StrataInputError(f"the ordering has {order.size} positions, the export {meta['n_sequences']}",
                               fix="export again (strata export)", path=paths["ordering"])
    layout = Layout(root)
    if not layout.clusters.is_file():
        raise StrataInputError("the data root has no clusters", fix="materialize `clusters` (strata run) first", path=layout.clusters)
    doc_cluster = pl.read_parquet(layout.clusters).sort("doc_id")["cluster"].to_numpy()
    seq_cluster = sequence_clusters(pl.read_parquet(paths["segments"]), doc_cluster)
    return order, seq_cluster[order]


class ODMBatchSampler(Sampler[list[int]]):
    """ODM's Algorithm 1 over the positions of an export: ``total_steps`` steps of ``accumulation``
    micro-batches of ``batch_size`` positions, each micro-batch from one cluster.

    ``position_cluster[p]`` is the cluster of the sequence at position p (:func:`export_clusters`);
    ``sequence_ids`` (optional) only labels the served log. ``smoothing``, ``warmup_fraction`` and
    ``prior``, ``clock`` and ``initial_weights`` are :class:`ODMPolicy`'s. Same arguments and losses => same batches.
    """

    def __init__(
        self,
        position_cluster: np.ndarray,
        batch_size: int,
        total_steps: int,
        seed: int = 0,
        *,
        accumulation: int = 1,
        sequence_ids: np.ndarray | None = None,
        smoothing: float = 0.5,
        warmup_fraction: float = 0.01,
        prior: str = "proportional",
        clock: str = "draw",
        initial_weights: str = "warmup",
    ):
        if batch_size < 1 or accumulation < 1 or total_steps < 1:
            raise StrataInputError(f"ODM batch_size={batch_size}, accumulation={accumulation}, total_steps={total_steps}",
                                   fix="use positive integers")
        self.position_cluster = np.asarray(position_cluster, dtype=np.int64)
        self.sequence_ids = np.arange(self.position_cluster.size) if sequence_ids is None else np.asarray(sequence_ids, dtype=np.int64)
        self.batch_size, self.accumulation, self.total_steps = int(batch_size), int(accumulation), int(total_steps)
        self.rng = np.random.default_rng(seed)
        self.pools = ClusterPools(self.position_cluster, self.rng)
        self.clusters = self.pools.clusters
        self.policy = ODMPolicy(self.pools.sizes, total_steps, smoothing=smoothing, warmup_fraction=warmup_fraction, prior=prior,
                                clock=clock, initial_weights=initial_weights)
        self._open: deque[tuple[int, int]] = deque()  # (step, arm) of micro-batches served, loss unknown
        self._steps: dict[int, tuple[np.ndarray, np.ndarray, list[float]]] = {}  # step -> arms, pi, losses so far
        self._served: list[tuple[int, int, np.ndarray, int, float]] = []  # step, micro-batch, positions, arm, prob
        self._policies: list[np.ndarray] = []
        self.recorded = 0  # steps whose rewards are updated

    @property
    def pending(self) -> int:
        """Micro-batches served whose loss has not been observed yet."""
        return len(self._open)

    @classmethod
    def from_export(cls, export_dir: str | Path, data_root: str | Path, batch_size: int, total_steps: int, seed: int = 0,
                    **kwargs) -> "ODMBatchSampler":
        """The sampler over an export's positions, clusters from the data root (:func:`export_clusters`)."""
        ids, cluster = export_clusters(export_dir, data_root)
        return cls(cluster, batch_size, total_steps, seed, sequence_ids=ids, **kwargs)

    def __len__(self) -> int:
        return self.total_steps * self.accumulation

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.total_steps):
            pi = self.policy.begin(self.accumulation)
            step = self.policy.step
            arms = self.rng.choice(self.policy.k, size=self.accumulation, p=pi)
            self._steps[step] = (arms, pi, [])
            self._policies.append(pi)
            for g, arm in enumerate(arms):
                positions = self.pools.take(int(arm), self.batch_size)
                self._open.append((step, int(arm)))
                self._served.append((step - 1, g, positions, int(arm), float(pi[arm])))
                yield positions.tolist()

    def observe(self, loss: float) -> None:
        """The mean training loss of the oldest served micro-batch whose loss is not known yet (Alg. 1, line 8);
        the step's rewards are updated when its last micro-batch is observed (lines 11-12)."""
        if not self._open:
            raise StrataInputError("ODM observed a loss but served no batch without one",
                                   fix="call observe(loss) once per micro-batch served")
        step, _ = self._open.popleft()
        arms, pi, losses = self._steps[step]
        losses.append(float(loss))
        if len(losses) == arms.size:
            del self._steps[step]
            self.policy.record(arms, np.asarray(losses), pi, step)
            self.recorded += 1

    def policy_rows(self) -> pl.DataFrame:
        """The policy of every step served: ``step`` (0-based), ``cluster``, ``prob``."""
        n, k = len(self._policies), self.policy.k
        probs = np.asarray(self._policies).reshape(n, k)
        return pl.DataFrame({"step": np.repeat(np.arange(n, dtype=np.int64), k), "cluster": np.tile(self.clusters, n),
                             "prob": probs.ravel()})

    def served_rows(self) -> pl.DataFrame:
        """Every position served, in serving order (the columns of the module docstring's served log)."""
        if not self._served:
            return pl.DataFrame(schema={"step": pl.Int64, "micro_batch": pl.Int64, "position": pl.Int64, "sequence_id": pl.Int64,
                                        "cluster": pl.Int64, "prob": pl.Float64})
        pos = np.concatenate([p for _, _, p, _, _ in self._served])
        reps = [p.size for _, _, p, _, _ in self._served]
        col = lambda i: np.repeat([row[i] for row in self._served], reps)  # noqa: E731
        return pl.DataFrame({"step": col(0).astype(np.int64), "micro_batch": col(1).astype(np.int64), "position": pos.astype(np.int64),
                             "sequence_id": self.sequence_ids[pos], "cluster": self.clusters[col(3)].astype(np.int64), "prob": col(4)})

    def write_log(self, path: str | Path) -> Path:
        """Write :meth:`served_rows` as Parquet (atomically)."""
        return write_parquet(self.served_rows(), path)


class ODMStream(IterableDataset):
    """The rows of a map-style ``dataset`` (an export read by ``datasets`` or ``OrderedSequences``)
    in the order ``sampler`` serves them, for trainers that take a dataset rather than a sampler
    (the Hugging Face Trainer)."""

    def __init__(self, dataset, sampler: ODMBatchSampler):
        self.dataset, self.sampler = dataset, sampler

    def __iter__(self):
        for positions in self.sampler:
            for p in positions:
                yield self.dataset[p]


class ODMCallback(TrainerCallback):
    """Feeds ``sampler`` each optimizer step's training loss (it turns the Trainer's logging on at
    every step) and writes the served log to ``log_path`` when training ends."""

    def __init__(self, sampler: ODMBatchSampler, log_path: str | Path | None = None):
        self.sampler, self.log_path = sampler, log_path

    def on_train_begin(self, args, state, control, **kwargs):
        s, problems = self.sampler, []
        if args.gradient_accumulation_steps != 1 or s.accumulation != 1:
            problems.append("gradient_accumulation_steps and the sampler's accumulation must be 1")
        if args.per_device_train_batch_size != s.batch_size:
            problems.append(f"per_device_train_batch_size must be the sampler's batch size {s.batch_size}")
        if args.dataloader_num_workers != 0:
            problems.append("dataloader_num_workers must be 0")
        if problems:
            raise StrataInputError("ODM with the Trainer: " + "; ".join(problems),
                                   fix="the Trainer reports one loss per optimizer step: make each step one micro-batch of one cluster")

    def on_step_end(self, args, state, control, **kwargs):
        control.should_log = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.sampler.observe(float(logs["loss"]))

    def on_train_end(self, args, state, control, **kwargs):
        if self.log_path is not None:
            self.sampler.write_log(self.log_path)
