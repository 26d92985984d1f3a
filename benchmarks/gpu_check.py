"""Strata's training path on one GPU, in one command: masked-attention correctness, speed and MFU,
and a powered ordering ablation, written as JSON after every phase.

    python benchmarks/gpu_check.py --data gpu_data [--out benchmarks/results/gpu_check.json] [--budget 420]
    python benchmarks/gpu_check.py --data DIR --tiny          # the CPU dry run (tests/test_gpu_check.py)

``--data`` is the folder ``benchmarks/gpu_data.py`` writes: ``<strategy>/`` numpy exports (``strata
export --format numpy``, read with ``pipeline.export.torch_dataset.OrderedSequences``),
``heldout.npz`` (the fixed held-out batch) and ``manifest.json``. The script imports only
``pipeline.training``, ``pipeline.export.torch_dataset`` and ``pipeline.reports.paired`` (numpy,
pyarrow, torch, transformers): no dagster, polars, duckdb or faiss, which the GPU machine lacks.

Phases (each with its own time budget, all under ``--budget``; the JSON is rewritten after each, so
a run cut short keeps what finished):

1. **correctness** — one packed batch of the export (several documents per sequence), built by
   ``batch_tensors`` as training builds it. The reference is the dense block-diagonal mask through
   SDPA (``attention: dense``); compared with it, loss and every parameter's gradient of the
   FlexAttention ``BlockMask`` path (``attention: flex``, compile off and on) and of an explicit
   per-document loop (each document alone, positions from 0: what the mask must equal). On CUDA
   all run under bf16 autocast as training does, and the dense path in float32 gives the precision
   floor. Where FlexAttention has no backward (CPU), its loss alone is compared and the JSON says
   so. Positions must restart at every document.
2. **speed** — Strata's loop (``pipeline.training.loop.train``) on the random export, per preset
   and compile setting: tokens/s (mean step time after ``--warmup`` steps), p50/p90 step time, MFU
   = model FLOPs per token x tokens/s / the GPU's dense bf16 peak (null where the peak is unknown,
   e.g. on a CPU). Model FLOPs per token: 6 x parameters (the tied head included) + 12 x layers x
   hidden x seq_len (attention scores, PaLM's appendix B, causal and document masking not
   subtracted).
3. **ablation** — a model per strategy x seed trained by the same loop on each export (seeds vary
   the init; each strategy's order is its exported one), the held-out batch scored at the end; the
   paired difference to random over (seeds x held-out documents) with the report's interval
   (``pipeline.reports.paired.paired_delta``: two-way bootstrap). Seeds run in turn over all
   strategies, so a budget cut leaves complete pairs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.export.torch_dataset import OrderedSequences  # noqa: E402
from pipeline.reports.paired import paired_delta  # noqa: E402
from pipeline.training.heldout import HeldoutBatch  # noqa: E402
from pipeline.training.loop import TrainSettings, autocast, train  # noqa: E402
from pipeline.training.model import (  # noqa: E402
    PRESETS,
    attention_inputs,
    batch_tensors,
    build_model,
    next_token_labels,
    preset_parameters,
    token_losses,
)

# Dense (no sparsity) bf16 tensor-core peak FLOP/s per GPU, from NVIDIA's datasheets; the longest
# key found in the device name wins ("NVIDIA H100 80GB HBM3" is the SXM part).
BF16_PEAK_FLOPS = {"H200": 989.4e12, "H100 NVL": 835.5e12, "H100 PCIe": 756.5e12, "H100": 989.4e12}
# Stated tolerances of the correctness phase: |loss - reference| / |reference| and, per parameter,
# ||grad - reference|| / ||reference grad||. bf16 autocast rounds every matmul input to 8 bits of
# mantissa, so two attention kernels agree only to bf16 rounding (the JSON's precision_floor is the
# dense path's own bf16-vs-float32 difference, the scale to read them against); float32 paths
# agree to float32 rounding.
TOLERANCES = {"bf16": {"loss_rel": 5e-3, "grad_rel": 5e-2}, "float32": {"loss_rel": 1e-5, "grad_rel": 1e-4}}
STACK = ("dagster", "polars", "duckdb", "faiss")  # what the GPU machine lacks: the script must not load them
REPORT_METRIC = "heldout_batch/loss"


def clean(obj):
    """``obj`` with NaN / infinity as null and numpy scalars as Python ones (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(clean(result), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out)


def commit_of(given: str | None) -> str | None:
    if given:
        return given
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None  # a copy of the tree without .git (pass --commit)


def peak_flops(device_name: str) -> float | None:
    hits = [k for k in BF16_PEAK_FLOPS if k in device_name]
    return BF16_PEAK_FLOPS[max(hits, key=len)] if hits else None


def flops_per_token(preset: str, vocab: int, seq_len: int) -> float:
    spec = PRESETS[preset]
    return 6.0 * preset_parameters(preset, vocab)["total"] + 12.0 * spec["num_hidden_layers"] * spec["hidden_size"] * seq_len


class Data:
    """The ``--data`` folder: one ``OrderedSequences`` per strategy, the held-out batch, the manifest."""

    def __init__(self, root: Path):
        self.manifest = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
        self.sets = {s: OrderedSequences(root / s) for s in self.manifest["strategies"]}
        first = next(iter(self.sets.values()))
        self.seq_len, self.eos, self.pad = first.seq_len, int(first.meta["eos_id"]), int(first.meta["pad_id"])
        self.vocab = int(self.manifest["vocab_size"])
        held = np.load(root / "heldout.npz")
        self.heldout = HeldoutBatch(held["tokens"].astype(np.int64), held["filled"].astype(bool), [str(u) for u in held["units"]])


# --- correctness --------------------------------------------------------------------------------


def document_pieces(ds: OrderedSequences, positions: np.ndarray) -> list[tuple[int, int, int]]:
    """``(row, start, length)`` of every document piece of the sequences at ``positions`` (the
    reader's own piece table)."""
    counts, lengths, is_doc = ds.pieces.of(positions)
    rows = np.repeat(np.arange(positions.size), counts)
    starts = (np.cumsum(lengths) - lengths) - rows * ds.seq_len
    return [(int(r), int(s), int(n)) for r, s, n, d in zip(rows, starts, lengths, is_doc) if d]


def position_check(position_ids: np.ndarray, pieces: list[tuple[int, int, int]]) -> dict:
    """Whether positions are 0 at every document start and count up by one inside each document."""
    bad = 0
    for r, s, n in pieces:
        bad += int(not np.array_equal(position_ids[r, s : s + n], np.arange(n)))
    return {"documents": len(pieces), "documents_with_wrong_positions": bad, "restart_at_every_document": bad == 0}


def run_path(data: Data, preset: str, mode: str, compiled: bool, batch: dict, dev: str, amp) -> dict:
    """Loss and gradients of one attention path on ``batch`` (same seed: same weights)."""
    import torch

    model = build_model(preset, data.vocab, data.seq_len, 0, data.eos, data.pad, mode).to(dev)
    if compiled:
        model.model.compile()
    model.train()
    out: dict = {"grads": None, "note": None}
    try:
        with amp:
            tok, scored = token_losses(model, batch)
        loss = (tok * scored).sum() / scored.sum().clamp(min=1)
        loss.backward()
        out["grads"] = {n: p.grad.detach().float().cpu() for n, p in model.named_parameters()}
    except NotImplementedError as err:  # FlexAttention has no backward on a CPU: compare its loss only
        out["note"] = f"no gradients: {err}"
        with torch.no_grad(), amp:
            tok, scored = token_losses(model, batch)
        loss = (tok * scored).sum() / scored.sum().clamp(min=1)
    out["loss"] = float(loss.detach().float())
    return out


def run_per_document(data: Data, preset: str, toks: np.ndarray, pieces: list[tuple[int, int, int]], dev: str, amp) -> dict:
    """The same loss with every document alone in its own sequence (positions from 0, plain causal
    attention): what the block-diagonal mask must reproduce."""
    import torch

    model = build_model(preset, data.vocab, data.seq_len, 0, data.eos, data.pad, "dense").to(dev)
    model.train()
    total, count = None, 0
    for r, s, n in pieces:
        ids = toks[r : r + 1, s : s + n]
        seg = np.zeros_like(ids)
        batch = {"input_ids": torch.as_tensor(ids, device=dev),
                 "attention_mask": attention_inputs(torch.as_tensor(seg, device=dev), False, "dense"),
                 "position_ids": torch.arange(n, device=dev)[None],
                 "labels": torch.as_tensor(next_token_labels(ids, seg), device=dev)}
        with amp:
            tok, scored = token_losses(model, batch)
        part = (tok * scored).sum()
        total = part if total is None else total + part
        count += int(scored.sum())
    loss = total / max(count, 1)
    loss.backward()
    return {"loss": float(loss.detach().float()), "grads": {n: p.grad.detach().float().cpu() for n, p in model.named_parameters()},
            "note": None}


def compare(ref: dict, other: dict, tol: dict) -> dict:
    loss_rel = abs(other["loss"] - ref["loss"]) / max(abs(ref["loss"]), 1e-12)
    row = {"loss": other["loss"], "loss_abs_diff": abs(other["loss"] - ref["loss"]), "loss_rel_diff": loss_rel,
           "gradients_compared": other["grads"] is not None, "note": other["note"]}
    ok = loss_rel <= tol["loss_rel"]
    if other["grads"] is not None:
        rel = {n: float((other["grads"][n] - g).norm() / g.norm().clamp(min=1e-30)) for n, g in ref["grads"].items()}
        worst = max(rel, key=rel.get)
        row.update(grad_max_rel_diff=rel[worst], grad_worst_parameter=worst,
                   grad_max_abs_diff=max(float((other["grads"][n] - g).abs().max()) for n, g in ref["grads"].items()))
        ok = ok and rel[worst] <= tol["grad_rel"]
    row["passed"] = bool(ok)
    return row


def correctness(data: Data, args, dev: str, deadline: float) -> dict:
    import torch

    ds = data.sets[args.strategies[0]]
    positions = np.arange(min(args.check_rows, ds.n_sequences))
    toks, _, _, _ = ds.masked_batch(positions)
    pieces = document_pieces(ds, positions)
    batches = {m: batch_tensors(ds, positions, False, dev, m) for m in ("dense", "flex")}
    amp = autocast(dev)
    precision = "bf16" if dev == "cuda" else "float32"
    tol = TOLERANCES[precision]
    ref = run_path(data, args.check_preset, "dense", False, batches["dense"], dev, amp)
    paths = {}
    skipped = {}
    for compiled in args.compile:
        name = "flex_compiled" if compiled else "flex"
        if time.monotonic() > deadline:
            skipped[name] = "phase budget spent"
            continue
        paths[name] = compare(ref, run_path(data, args.check_preset, "flex", compiled, batches["flex"], dev, amp), tol)
    paths["per_document_loop"] = compare(ref, run_per_document(data, args.check_preset, toks, pieces, dev, amp), tol)
    out = {"preset": args.check_preset, "rows": int(positions.size), "seq_len": data.seq_len, "precision": precision,
           "reference": "sdpa_dense", "reference_loss": ref["loss"], "tolerances": tol,
           "positions": position_check(batches["dense"]["position_ids"].cpu().numpy(), pieces),
           "flex_backward_on_device": all(p["gradients_compared"] for k, p in paths.items() if k.startswith("flex")),
           "paths": paths}
    out["skipped"] = skipped
    if dev == "cuda" and time.monotonic() < deadline:  # the reference's own bf16 error: the scale of the tolerances
        fp32 = run_path(data, args.check_preset, "dense", False, batches["dense"], dev, torch.autocast("cuda", enabled=False))
        out["precision_floor"] = compare(fp32, ref, TOLERANCES["bf16"])
    out["passed"] = bool(out["positions"]["restart_at_every_document"] and all(p["passed"] for p in paths.values()))
    return out


# --- speed --------------------------------------------------------------------------------------


def step_times(log: list[dict], batch_size: int, seq_len: int) -> np.ndarray:
    return np.array([batch_size * seq_len / r["tokens_per_s"] for r in log], dtype=np.float64)


def speed(data: Data, args, dev: str, device_name: str, deadline: float) -> dict:
    import torch

    ds = data.sets[args.strategies[0]]
    peak = peak_flops(device_name) if dev == "cuda" else None
    rows, last = [], 0.0
    for preset in args.presets:
        for compiled in args.compile:
            if time.monotonic() + last > deadline:
                rows.append({"preset": preset, "compile": compiled, "skipped": "phase budget spent"})
                continue
            t0 = time.monotonic()
            settings = TrainSettings(preset=preset, batch_size=args.speed_batch, max_steps=args.warmup + args.speed_steps,
                                     lr=1e-3, warmup_steps=args.warmup, seed=0, heldout_every=0, compile=compiled)
            if dev == "cuda":
                torch.cuda.reset_peak_memory_stats()
            model, log = train(ds, np.arange(ds.n_sequences), data.vocab, data.eos, data.pad, settings, progress=False)
            times = step_times(log, args.speed_batch, data.seq_len)[args.warmup :]
            tps = args.speed_batch * data.seq_len / float(times.mean())
            fpt = flops_per_token(preset, data.vocab, data.seq_len)
            rows.append({
                "preset": preset, "compile": compiled, "parameters": preset_parameters(preset, data.vocab),
                "batch_size": args.speed_batch, "seq_len": data.seq_len, "warmup_steps_excluded": args.warmup,
                "measured_steps": int(times.size), "tokens_per_s": tps, "step_s_mean": float(times.mean()),
                "step_s_p50": float(np.percentile(times, 50)), "step_s_p90": float(np.percentile(times, 90)),
                "flops_per_token": fpt, "mfu": fpt * tps / peak if peak else None,
                "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else None,
                "loss_first": log[0]["loss"], "loss_last": log[-1]["loss"], "wall_s": time.monotonic() - t0,
            })
            del model
            if dev == "cuda":
                torch.cuda.empty_cache()
            last = time.monotonic() - t0
    return {"peak_bf16_flops": peak, "mfu_formula": "(6 * parameters + 12 * layers * hidden * seq_len) * tokens_per_s / peak",
            "attention": "auto (flex on CUDA, dense on CPU)", "runs": rows}


# --- ablation -----------------------------------------------------------------------------------


def ablation(data: Data, args, deadline: float, on_run) -> dict:
    base = TrainSettings(preset=args.ablation_preset, batch_size=args.ablation_batch, max_steps=args.ablation_steps,
                         lr=args.ablation_lr, warmup_steps=max(1, args.ablation_steps // 10), heldout_every=0)
    runs: list[dict] = []
    out = {"preset": args.ablation_preset, "parameters": preset_parameters(args.ablation_preset, data.vocab),
           "settings": {"batch_size": base.batch_size, "steps": base.max_steps, "lr": base.lr, "warmup_steps": base.warmup_steps,
                        "seq_len": data.seq_len, "tokens_per_run": base.batch_size * base.max_steps * data.seq_len},
           "strategies": list(args.strategies), "seeds_requested": args.seeds, "heldout_units": data.heldout.units,
           "seed_varies": "model init (each strategy trains on its one exported order)", "runs": runs}
    last, stopped = 0.0, None
    for seed in range(args.seeds):
        if time.monotonic() + last * len(args.strategies) > deadline:
            stopped = f"phase budget spent after {seed} seeds"
            break
        t0 = time.monotonic()
        for strategy in args.strategies:
            ds, scored = data.sets[strategy], []
            r0 = time.monotonic()
            _, log = train(ds, np.arange(ds.n_sequences), data.vocab, data.eos, data.pad, replace(base, seed=seed), progress=False,
                           heldout=data.heldout, on_heldout=lambda steps, tokens, losses, into=scored: into.append(losses))
            losses = scored[-1]  # the held-out batch after the run's last step
            runs.append({"strategy": strategy, "seed": seed, "heldout_loss": float(losses.mean()),
                         "heldout_losses": losses.tolist(), "train_loss_last": log[-1]["loss"],
                         "wall_s": time.monotonic() - r0})
        last = (time.monotonic() - t0) / len(args.strategies)
        out["intervals"] = intervals(runs, args)
        on_run(out)
    out["seeds_done"] = len({r["seed"] for r in runs if sum(q["seed"] == r["seed"] for q in runs) == len(args.strategies)})
    out["stopped"] = stopped
    out["intervals"] = intervals(runs, args)
    return out


def intervals(runs: list[dict], args) -> list[dict]:
    """Each strategy minus random on the held-out batch, as the report's delta table computes it."""
    by = {(r["strategy"], r["seed"]): np.asarray(r["heldout_losses"]) for r in runs}
    rows = []
    for strategy in args.strategies:
        if strategy == "random":
            continue
        seeds = sorted(s for (k, s) in by if k == strategy and ("random", s) in by)
        if not seeds:
            continue
        d = np.stack([by[(strategy, s)] - by[("random", s)] for s in seeds])
        rows.append({"metric": REPORT_METRIC, "strategy": strategy, "baseline": "random",
                     **paired_delta(d, args.bootstrap, 0, higher_is_better=False)})
    return rows


# --- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO / "gpu_data"), help="folder from benchmarks/gpu_data.py")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "gpu_check.json"))
    ap.add_argument("--commit", default=None, help="commit of the tree (default: git rev-parse HEAD, where .git exists)")
    ap.add_argument("--tiny", "--dry-run", dest="tiny", action="store_true",
                    help="tiny model, few steps, compile off: the CPU dry run of every phase")
    ap.add_argument("--phases", nargs="*", default=["correctness", "speed", "ablation"])
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for all phases together")
    ap.add_argument("--correctness-budget", type=float, default=100.0)
    ap.add_argument("--speed-budget", type=float, default=150.0)
    ap.add_argument("--compile", default="off,on", help="compile settings to run: off,on | off | on")
    ap.add_argument("--check-preset", default="base")
    ap.add_argument("--check-rows", type=int, default=2)
    ap.add_argument("--presets", nargs="*", default=["base", "100m"])
    ap.add_argument("--speed-batch", type=int, default=16)
    ap.add_argument("--speed-steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--strategies", nargs="*", default=None, help="default: the manifest's, random first")
    ap.add_argument("--ablation-preset", default="base")
    ap.add_argument("--ablation-batch", type=int, default=16)
    ap.add_argument("--ablation-steps", type=int, default=30)
    ap.add_argument("--ablation-lr", type=float, default=2e-3)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--bootstrap", type=int, default=2000)
    args = ap.parse_args(argv)
    if args.tiny:
        args.compile = "off"
        args.check_preset = args.ablation_preset = "tiny"
        args.presets, args.speed_batch, args.speed_steps, args.warmup = ["tiny"], 2, 2, 1
        args.ablation_batch, args.ablation_steps, args.seeds = 2, 2, min(args.seeds, 2)
        args.bootstrap = min(args.bootstrap, 200)
    args.compile = [c == "on" for c in args.compile.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    import torch
    import transformers

    args = parse_args(argv)
    start = time.monotonic()
    deadline = start + args.budget
    data = Data(Path(args.data))
    strategies = args.strategies or data.manifest["strategies"]
    args.strategies = ["random", *[s for s in strategies if s != "random"]] if "random" in strategies else list(strategies)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    device_name = torch.cuda.get_device_name() if dev == "cuda" else f"{platform.processor() or 'cpu'} ({torch.get_num_threads()} threads)"
    out = Path(args.out)
    result = {"commit": commit_of(args.commit), "device": dev, "device_name": device_name, "torch": torch.__version__,
              "transformers": transformers.__version__, "python": platform.python_version(), "tiny": args.tiny,
              "gpu_run": dev == "cuda", "data": {"manifest": data.manifest, "seq_len": data.seq_len, "vocab_size": data.vocab,
                                                  "sequences": {s: d.n_sequences for s, d in data.sets.items()},
                                                  "heldout_documents": data.heldout.n_docs},
              "args": {k: v for k, v in vars(args).items()}, "phases": {}}

    def save() -> None:
        result["elapsed_s"] = time.monotonic() - start
        result["stack_modules_loaded"] = sorted(m for m in STACK if sys.modules.get(m) is not None)
        write(result, out)

    budgets = {"correctness": args.correctness_budget, "speed": args.speed_budget, "ablation": args.budget}
    failed = False
    for phase in args.phases:
        t0 = time.monotonic()
        phase_deadline = min(deadline, t0 + budgets[phase])
        print(f"gpu_check: {phase} ...", flush=True)
        try:
            if phase == "correctness":
                section = correctness(data, args, dev, phase_deadline)
                failed |= not section["passed"]
            elif phase == "speed":
                section = speed(data, args, dev, device_name, phase_deadline)
            elif phase == "ablation":
                section = ablation(data, args, phase_deadline, lambda part: (result.update(ablation=part), save()))
            else:
                raise ValueError(f"unknown phase {phase!r} (correctness, speed, ablation)")
        except Exception as err:  # noqa: BLE001 — a failed phase is recorded and the next still runs
            section, failed = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}, True
        section["wall_s"] = time.monotonic() - t0
        result[phase] = section
        result["phases"][phase] = "error" if "error" in section else "done"
        save()
        print(f"gpu_check: {phase} {result['phases'][phase]} in {section['wall_s']:.1f} s -> {out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
