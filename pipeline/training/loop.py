"""Short training runs on an ordered stream (nanoGPT-style loop over a transformers model).

Every strategy gets the same model init (seeded), token budget, optimizer (AdamW, linear warmup
then cosine decay to 10% of the peak), batch size and sequence length; only the order of the
sequences differs. Step t trains on ``order[t*B:(t+1)*B]`` (wrapping into a next epoch if the
budget exceeds the stream), or, for a training-time strategy such as ODM (``pipeline.ordering.odm``), on the
ids a sampler returns. With ``epochs = N`` the run is N passes over the stream instead: each
epoch is the same ``floor(M / B)`` batches in the same order (an incomplete last batch is dropped,
as a data loader with ``drop_last`` does), so every epoch boundary is a clean restart of the
stream — the setting of Diversity-ordered training's epoch-boundary anomaly. Loss is next-token cross-entropy within documents only. On a
CUDA device the forward pass runs under bf16 autocast and document masking goes through FlexAttention block masks
(``attention="auto"``); on a CPU through a dense mask and SDPA. A fixed held-out batch
(``pipeline.training.heldout``) is scored every ``heldout_every`` steps. With a
:class:`~pipeline.training.checkpoint.Checkpointing` the run writes a checkpoint every
``every`` steps and, started again with the same settings, resumes from it: the resumed run's
model, log and callbacks equal those of an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Callable, Iterable, Protocol

import numpy as np
from tqdm import tqdm

from pipeline.devices import device
from pipeline.errors import StrataInputError
from pipeline.heavy import lazy
from pipeline.stage import StageParams, setting
from pipeline.training.checkpoint import Checkpointing, rng_state, set_rng_state
from pipeline.training.heldout import HeldoutBatch, score_heldout, score_steps
from pipeline.training.model import MASK_MODES, batch_tensors, build_model, token_losses

torch = lazy("torch")  # imported on first use (pipeline/heavy.py)

if TYPE_CHECKING:  # any store with masked_batch / seq_len / n_sequences trains (a numpy export's OrderedSequences too)
    from pipeline.packing.pack import SequenceStore


@dataclass(frozen=True)
class TrainConfig(StageParams):
    """The config keys :meth:`TrainSettings.from_config` reads (all but the seed, given per run):
    a stage that trains holds these and builds its runs' settings from them."""

    model_preset: str = setting()
    batch_size: int = setting()
    max_steps: int = setting()
    lr: float = setting()
    warmup_steps: int = setting()
    weight_decay: float = setting()
    cross_document: bool = setting()
    attention: str = setting()
    heldout_every: int = setting()
    compile: bool = setting()
    epochs: int = setting()


@dataclass(frozen=True)
class TrainSettings:
    preset: str = "tiny"
    batch_size: int = 16
    max_steps: int = 60
    lr: float = 3e-3
    warmup_steps: int = 6
    weight_decay: float = 0.1
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    cross_document: bool = False
    attention: str = "auto"  # auto (flex on CUDA, dense on CPU) | dense | flex
    heldout_every: int = 10  # score the held-out batch every N steps (0: at the end only)
    compile: bool = False  # torch.compile the decoder (pays on a GPU for long runs; see docs/training.md)
    epochs: int = 0  # 0: max_steps steps (wrapping); N >= 1: N passes of floor(M / batch_size) steps each

    @classmethod
    def from_config(cls, cfg: TrainConfig, seed: int) -> "TrainSettings":
        """The training settings of a :class:`TrainConfig` (or a config with its keys) for training seed ``seed``."""
        return cls(
            preset=cfg.model_preset, batch_size=cfg.batch_size, max_steps=cfg.max_steps,
            lr=cfg.lr, warmup_steps=cfg.warmup_steps, weight_decay=cfg.weight_decay, seed=seed,
            cross_document=cfg.cross_document, attention=cfg.attention, heldout_every=cfg.heldout_every,
            compile=cfg.compile, epochs=cfg.epochs,
        )

    def steps(self, n_sequences: int) -> int:
        """Optimizer steps of a run over ``n_sequences`` sequences: ``max_steps``, or with ``epochs``
        N passes of ``floor(n_sequences / batch_size)`` steps."""
        if self.epochs <= 0:
            return self.max_steps
        if n_sequences < self.batch_size:
            raise StrataInputError(
                f"an epoch of {n_sequences} sequences holds no full batch of {self.batch_size}",
                fix="use more sequences per epoch or a smaller batch_size",
            )
        return self.epochs * (n_sequences // self.batch_size)

    def mask_mode(self, dev: str) -> str:
        if self.attention == "auto":
            return "flex" if dev == "cuda" else "dense"
        if self.attention not in MASK_MODES:
            raise StrataInputError(f"unknown attention {self.attention!r}", fix="use auto, dense or flex")
        return self.attention


class BatchSampler(Protocol):
    """A training-time strategy: chooses each step's sequences and learns from their losses.

    The training stage also reads ``served_ids()`` (every id served, in order: the run's stream)
    and, from a sampler that names a DuckDB ``table``, ``mixture_rows()`` (ODM's policy per step)."""

    def next_batch(self, batch_size: int) -> np.ndarray: ...

    def update(self, ids: np.ndarray, losses: np.ndarray) -> None: ...

    def state_dict(self) -> dict: ...  # numpy arrays and plain values (checkpointing)

    def load_state_dict(self, state: dict) -> None: ...


def lr_at(step: int, s: TrainSettings) -> float:
    """Linear warmup for ``warmup_steps``, then cosine decay to ``min_lr_ratio * lr``."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    progress = (step - s.warmup_steps) / max(1, s.max_steps - s.warmup_steps)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def autocast(dev: str):
    """bf16 autocast on CUDA, a no-op context on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if dev == "cuda" else torch.autocast("cpu", enabled=False)


def batch_positions(step: int, batch_size: int, n_sequences: int, epochs: int = 0) -> np.ndarray:
    """Positions in the stream of the sequences of step ``step``: ``[t*B, (t+1)*B)`` modulo M, or
    with ``epochs`` the batch ``t mod floor(M/B)`` of the same epoch order (drop-last)."""
    if epochs > 0:
        step = step % (n_sequences // batch_size)
    return np.arange(step * batch_size, (step + 1) * batch_size) % n_sequences


def stream_ids(order: np.ndarray, steps: int, batch_size: int, epochs: int = 0) -> np.ndarray:
    """The sequence ids ``steps`` steps of training consume from ``order``, in training order."""
    order = np.asarray(order, dtype=np.int64)
    i = np.arange(max(0, steps) * batch_size)
    if epochs > 0:
        return order[(i // batch_size) % (order.size // batch_size) * batch_size + i % batch_size]
    return order[i % order.size]


def checkpoint_steps(max_steps: int, fractions: Iterable[float] = (0.2, 1.0)) -> list[int]:
    """Steps completed at the given fractions of the run (Don't Shuffle, Optimize probes 20% and 100%)."""
    return sorted({max(1, min(max_steps, int(round(f * max_steps)))) for f in fractions})


def fingerprint(settings: TrainSettings, order: np.ndarray | None, n_sequences: int, vocab_size: int, eos_id: int,
                pad_id: int, dev: str, sampler: BatchSampler | None) -> dict:
    """What a run's result depends on in the loop itself: a checkpoint is resumed only under the same values."""
    return {
        "settings": asdict(settings), "n_sequences": n_sequences, "vocab_size": vocab_size, "eos_id": eos_id, "pad_id": pad_id,
        "device": dev, "sampler": type(sampler).__name__ if sampler is not None else "",
        "order_sha256": hashlib.sha256(np.ascontiguousarray(order, dtype=np.int64).tobytes()).hexdigest() if order is not None else "",
    }


def train(store: SequenceStore, order: np.ndarray | None, vocab_size: int, eos_id: int, pad_id: int, settings: TrainSettings,
          on_step: Callable[[dict], None] | None = None, progress: bool = True, sampler: BatchSampler | None = None,
          checkpoints: Iterable[int] = (), on_checkpoint: Callable[[int, object], None] | None = None,
          heldout: HeldoutBatch | None = None, on_heldout: Callable[[int, int, np.ndarray], None] | None = None,
          stop_after: int | None = None, checkpointing: Checkpointing | None = None,
          on_losses: Callable[[int, np.ndarray, np.ndarray, np.ndarray], None] | None = None):
    """Train a fresh model on ``order`` (or on what ``sampler`` serves); return ``(model, log rows)``.

    The run lasts ``settings.steps(M)`` steps (``max_steps``, or ``epochs`` passes); ``stop_after``
    ends it earlier with the learning-rate schedule of the whole run (a model as it is at that step
    of the run). Log rows: ``step, loss, grad_norm, lr, tokens_seen, epoch, tokens_per_s``; ``epoch`` counts
    passes over the stream (``order`` or, with a sampler, the store's sequences). With a sampler
    ``order`` may be None; the sampler gets every step's per-sequence mean losses (its mixture log
    stays on the sampler, e.g. ``ODMSampler.mixture_rows()``). ``on_checkpoint(steps_done, model)``
    is called after each step count in ``checkpoints`` (for gradient probes; it must not step the
    optimizer). With ``heldout``, ``on_heldout(steps_done, tokens_seen, per_doc_losses)`` is called
    before the first step and every ``settings.heldout_every`` steps and after the last.

    With ``checkpointing`` a checkpoint is written every ``checkpointing.every`` steps, after that
    step's callbacks; a run started with a checkpoint of the same fingerprint (:func:`fingerprint`
    plus ``checkpointing.key``) continues after its step, with the callbacks of the steps before it
    not repeated (their effects are in the caller's restored state). A sampler must then provide
    ``state_dict()`` / ``load_state_dict()``.

    ``on_losses(step, ids, loss_sums, tokens)`` gets each step's per-sequence training loss before
    the update: the summed next-token loss (nats) of sequence ``ids[i]`` and its scored tokens.
    """
    order, M, n_steps, last = _run_length(store, order, settings, sampler, stop_after)
    settings = replace(settings, max_steps=n_steps)  # the lr schedule and the held-out steps follow the run's length
    dev = device()
    mode = settings.mask_mode(dev)
    if checkpointing is not None and sampler is not None and not callable(getattr(sampler, "state_dict", None)):
        raise StrataInputError(f"the sampler {type(sampler).__name__} has no state_dict(), so its run cannot be checkpointed",
                               fix="give the sampler state_dict() / load_state_dict(), or set checkpoint_every: 0")
    model = _fresh_model(settings, vocab_size, store.seq_len, eos_id, pad_id, mode, dev)
    score_at = set(score_steps(settings.max_steps, settings.heldout_every)) if heldout is not None else set()
    run = _Run(store, order, M, sampler, settings, model, _optimizer(model, settings, dev), dev, mode, autocast(dev), heldout,
               on_heldout, score_at)
    probe_at = set(checkpoints)
    start, tokens_seen, rows = 0, 0, []
    if checkpointing is not None:
        key = {**fingerprint(settings, order, M, vocab_size, eos_id, pad_id, dev, sampler), "caller": checkpointing.key}
        start, tokens_seen, rows = run.resume(checkpointing, key, n_steps)
    model.train()
    if start == 0:
        run.score(0, 0)
    for step in tqdm(range(start, last), desc="train", unit="step", disable=not progress, initial=start, total=last):
        row = run.step(step, tokens_seen, on_losses)
        tokens_seen = row["tokens_seen"]
        rows.append(row)
        if on_step is not None:
            on_step(row)
        if on_checkpoint is not None and step + 1 in probe_at:
            on_checkpoint(step + 1, model)
        run.score(step + 1, tokens_seen)
        if checkpointing is not None and checkpointing.due(step + 1, n_steps):
            checkpointing.save(key, run.state(step + 1, tokens_seen, rows))
    model.eval()
    return model, rows


def _run_length(store: SequenceStore, order: np.ndarray | None, settings: TrainSettings, sampler: BatchSampler | None,
                stop_after: int | None) -> tuple[np.ndarray | None, int, int, int]:
    """(``order`` as int64, the M sequences of the stream, the run's steps, the step it stops at):
    the stream is ``order`` or, with a sampler, the store's sequences; ``stop_after`` ends the run
    early without changing its length (the learning-rate schedule's)."""
    if sampler is None:
        if order is None or np.asarray(order).size == 0:
            raise StrataInputError("training needs a non-empty ordering or a sampler", fix="pass order=<sequence ids> or sampler=")
        order = np.asarray(order, dtype=np.int64)
        M = order.size
    else:
        M = store.n_sequences
    n_steps = settings.steps(M)
    last = n_steps if stop_after is None else max(0, min(n_steps, int(stop_after)))
    return order, M, n_steps, last


def _fresh_model(settings: TrainSettings, vocab_size: int, seq_len: int, eos_id: int, pad_id: int, mode: str, dev: str):
    """The run's model, initialized from ``settings.seed`` and moved to ``dev``; with ``settings.compile`` its
    decoder's forward is compiled."""
    model = build_model(settings.preset, vocab_size, seq_len, settings.seed, eos_id, pad_id, mode).to(dev)
    if settings.compile:
        model.model.compile()  # in place: the decoder's forward is compiled, state_dict keys unchanged
    return model


def _optimizer(model, settings: TrainSettings, dev: str):
    """AdamW over the model's parameters, weight decay on the matrices (2 or more dimensions) only."""
    import torch

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lr, betas=(0.9, 0.95), fused=dev == "cuda",
    )


@dataclass
class _Run:
    """What one call of :func:`train` holds fixed: the stream (``order`` of M sequences, or the
    sampler), the settings, the model and its optimizer, where they run, and the held-out
    scoring at ``score_at`` steps done. :meth:`step` is one optimizer step."""

    store: SequenceStore
    order: np.ndarray | None
    M: int
    sampler: BatchSampler | None
    settings: TrainSettings
    model: object
    opt: object
    dev: str
    mode: str
    amp: object
    heldout: HeldoutBatch | None
    on_heldout: Callable[[int, int, np.ndarray], None] | None
    score_at: set[int]

    def score(self, steps_done: int, tokens: int) -> None:
        """The held-out batch's per-document losses to ``on_heldout``, at the steps of ``score_at``."""
        if steps_done in self.score_at and self.on_heldout is not None:
            with self.amp:
                self.on_heldout(steps_done, tokens, score_heldout(self.model, self.heldout, self.dev, self.settings.batch_size,
                                                                  self.mode))

    def resume(self, checkpointing: Checkpointing, key: dict, n_steps: int) -> tuple[int, int, list[dict]]:
        """The model, optimizer, sampler, caller's state and RNG as the checkpoint of ``key`` saved them:
        (its steps done, tokens seen, log rows); (0, 0, []) when there is none."""
        saved = checkpointing.load(key)
        if saved is None:
            return 0, 0, []
        self.model.load_state_dict(saved["model"])
        self.opt.load_state_dict(saved["optimizer"])
        if self.sampler is not None:
            self.sampler.load_state_dict(saved["sampler"])
        if checkpointing.restore is not None:
            checkpointing.restore(saved["caller"])
        set_rng_state(saved["rng"])
        start, tokens_seen, rows = int(saved["step"]), int(saved["tokens_seen"]), list(saved["rows"])
        checkpointing.resumed_from = start
        checkpointing.log(f"resuming from {checkpointing.path} at step {start} of {n_steps}")
        return start, tokens_seen, rows

    def step(self, step: int, tokens_seen: int, on_losses: Callable[[int, np.ndarray, np.ndarray, np.ndarray], None] | None) -> dict:
        """Step ``step``: the batch the order (or the sampler) serves, the update at the step's
        learning rate, the sampler's per-sequence losses, ``on_losses``; returns the step's log row."""
        import torch

        t0 = time.perf_counter()
        settings, B, L, M = self.settings, self.settings.batch_size, self.store.seq_len, self.M
        ids = self.sampler.next_batch(B) if self.sampler is not None else self.order[batch_positions(step, B, M, settings.epochs)]
        batch = batch_tensors(self.store, ids, settings.cross_document, self.dev, self.mode)
        lr = lr_at(step, settings)
        for group in self.opt.param_groups:
            group["lr"] = lr
        with self.amp:
            tok_loss, scored = token_losses(self.model, batch)
        tok_loss = tok_loss * scored
        loss = tok_loss.sum() / scored.sum().clamp(min=1)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), settings.grad_clip)
        self.opt.step()
        if self.sampler is not None:
            per_seq = tok_loss.detach().sum(1) / scored.sum(1).clamp(min=1)
            self.sampler.update(ids, per_seq.cpu().numpy())
        if on_losses is not None:
            on_losses(step, np.asarray(ids), tok_loss.detach().float().sum(1).cpu().numpy().astype(np.float64),
                      scored.sum(1).cpu().numpy().astype(np.int64))
        tokens_seen += int(batch["filled"].sum())
        return {
            "step": step,
            "loss": float(loss.item()),
            "grad_norm": float(grad_norm.item()),
            "lr": lr,
            "tokens_seen": tokens_seen,
            "epoch": int(step // (M // B)) if settings.epochs > 0 else int((step * B) // M),
            "tokens_per_s": B * L / (time.perf_counter() - t0),
        }

    def state(self, steps_done: int, tokens_seen: int, rows: list[dict]) -> dict:
        """What a checkpoint after ``steps_done`` steps holds (what :meth:`resume` restores)."""
        return {
            "step": steps_done, "tokens_seen": tokens_seen, "rows": rows, "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(), "rng": rng_state(),
            "sampler": self.sampler.state_dict() if self.sampler is not None else {},
        }


def epoch_boundary_jumps(
    log_rows: list[dict],
    window: int | None = None,
    post: int = 3,
    z_threshold: float = 4.0,
    metrics: Iterable[str] = ("loss", "grad_norm"),
) -> list[dict]:
    """Loss / grad-norm jumps where a run wraps into a new epoch (Diversity-ordered training's anomaly).

    Diversity-ordered training observes the loss dropping near the end of an epoch and spiking when the loader
    restarts, with the gradient norm at ~4x its normal value. For every boundary (the first step of
    epoch e >= 1) and metric, the ``window`` steps before it are the reference and the first
    ``post`` steps from it the probe: ``z = (max(post) - mean(pre)) / std(pre)`` and
    ``ratio = max(post) / mean(pre)``; ``flagged`` when ``z >= z_threshold``. The probe is short
    because Diversity-ordered training's spike is immediate and the maximum of a long probe window would exceed a
    few standard deviations by chance. ``window`` defaults to a tenth of an epoch, clamped to
    [5, 50] steps; boundaries with fewer than 3 reference steps get ``z = nan`` and are not flagged.
    """
    rows = sorted(log_rows, key=lambda r: r["step"])
    if not rows:
        return []
    epoch = np.array([r["epoch"] for r in rows])
    bounds = np.flatnonzero(np.diff(epoch) > 0) + 1
    if bounds.size == 0:
        return []
    w = window if window is not None else int(np.clip(bounds[0] // 10, 5, 50))
    out = []
    for b in bounds:
        for m in metrics:
            v = np.array([r[m] for r in rows], dtype=np.float64)
            pre, probe = v[max(0, b - w) : b], v[b : b + post]
            mean = float(pre.mean()) if pre.size else math.nan
            std = float(pre.std(ddof=1)) if pre.size >= 3 else math.nan
            peak = float(probe.max())
            z = (peak - mean) / std if std > 0 else (math.inf if std == 0 and peak > mean else math.nan)
            out.append({
                "boundary_step": int(rows[b]["step"]), "epoch": int(epoch[b]), "metric": m,
                "pre_mean": mean, "pre_std": std, "post_max": peak, "post_mean": float(probe.mean()),
                "z": z, "ratio": peak / mean if mean else math.nan, "flagged": bool(z >= z_threshold),
            })
    return out
