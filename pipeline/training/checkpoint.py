"""Checkpoint and resume of a training run, as nanoGPT's ``ckpt.pt``.

One file, written atomically every ``every`` steps: the model, the optimizer, the RNG states
(torch, CUDA when present, numpy's global generator, Python's ``random``), the step, the tokens
seen, the per-step log rows, a training-time sampler's state and the caller's state (e.g. its
held-out curve and probe rows). The learning rate is a function of the step (``lr_at``), so the
step is the whole scheduler state. The file holds tensors and plain Python values only and is
read with ``torch.load(weights_only=True)``: numpy arrays and polars frames are stored as raw
bytes (:func:`encode` / :func:`decode`), nothing is unpickled as an object.

Each checkpoint carries a fingerprint of what the run's result depends on (settings, stream,
vocabulary, device, the caller's key). A checkpoint with another fingerprint is ignored with a
message naming the fields that differ; the run starts from step 0 and replaces it.
"""

from __future__ import annotations

import io
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from pipeline.heavy import lazy
from pipeline.storage.atomic import atomic_path

torch = lazy("torch")  # imported on first use (pipeline/heavy.py)

FORMAT = 1


def _bytes_tensor(data: bytes):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


def encode(obj: Any) -> Any:
    """``obj`` with numpy arrays and polars frames replaced by byte tensors (exact dtype, shape, schema)."""
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError("object arrays cannot be checkpointed")
        return {"__ndarray__": _bytes_tensor(np.ascontiguousarray(obj).tobytes()), "dtype": obj.dtype.str, "shape": list(obj.shape)}
    pl = sys.modules.get("polars")  # a frame exists only where polars is loaded (the loop runs without it)
    if pl is not None and isinstance(obj, pl.DataFrame):
        buf = io.BytesIO()
        obj.write_ipc(buf)
        return {"__frame__": _bytes_tensor(buf.getvalue())}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(encode(v) for v in obj)
    return obj


def decode(obj: Any) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            raw = obj["__ndarray__"].numpy().tobytes()
            return np.frombuffer(raw, dtype=np.dtype(obj["dtype"])).reshape(obj["shape"]).copy()
        if "__frame__" in obj:  # written by a caller that holds frames, so polars is loaded (the loop runs without it)
            return sys.modules["polars"].read_ipc(io.BytesIO(obj["__frame__"].numpy().tobytes()))
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(decode(v) for v in obj)
    return obj


def rng_state() -> dict:
    """The global RNG states: torch (CPU and every CUDA device), numpy's legacy generator, ``random``."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": list(np.random.get_state()),
        "python": random.getstate(),
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    np.random.set_state(tuple(state["numpy"]))
    random.setstate(state["python"])


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def differing(a: dict, b: dict) -> list[str]:
    """Dotted names of the fields where two fingerprints differ."""
    fa, fb = _flat(a), _flat(b)
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))


@dataclass
class Checkpointing:
    """Where and how often a run checkpoints, and what the caller keeps in the checkpoint.

    ``key``: JSON-serialisable facts the run's result depends on beyond the loop's own settings
    (e.g. input data versions); ``state()`` returns the caller's state to keep (tensors, numpy
    arrays, polars frames, plain values) and ``restore(state)`` puts it back on resume. After a
    resume ``resumed_from`` holds the step the run continued from. The caller removes the file
    (:meth:`remove`) once the run's outputs are written.
    """

    path: Path
    every: int
    key: dict = field(default_factory=dict)
    state: Callable[[], dict] | None = None
    restore: Callable[[dict], None] | None = None
    log: Callable[[str], None] = print
    resumed_from: int | None = None

    def due(self, steps_done: int, n_steps: int) -> bool:
        """Write a checkpoint after ``steps_done`` steps? Every ``every`` steps, never after the last."""
        return self.every > 0 and steps_done % self.every == 0 and steps_done < n_steps

    def save(self, fingerprint: dict, payload: dict) -> None:
        body = {"format": FORMAT, "fingerprint": json.dumps(fingerprint, sort_keys=True), **payload,
                "caller": self.state() if self.state is not None else {}}
        with atomic_path(self.path) as tmp:
            torch.save(encode(body), tmp)

    def load(self, fingerprint: dict) -> dict | None:
        """The checkpoint written with this fingerprint, or None (absent, unreadable or other settings: logged)."""
        if not self.path.exists():
            return None
        try:
            body = torch.load(self.path, map_location="cpu", weights_only=True)
            saved = json.loads(body["fingerprint"]) if body.get("format") == FORMAT else None
        except Exception as exc:  # a checkpoint of another torch/format version: start over, say so
            self.log(f"ignoring the checkpoint {self.path}: it cannot be read ({type(exc).__name__}: {exc}); training from step 0")
            return None
        if saved is None:
            self.log(f"ignoring the checkpoint {self.path}: written in another format; training from step 0")
            return None
        mine = json.loads(json.dumps(fingerprint, sort_keys=True))
        if saved != mine:
            self.log(f"ignoring the checkpoint {self.path} (step {body.get('step')}): it was written by a run with other "
                     f"settings (differing: {', '.join(differing(saved, mine))}); training from step 0 and replacing it")
            return None
        return decode(body)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
