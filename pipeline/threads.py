"""How torch's CPU thread pool waits: set before torch is imported (its OpenMP reads it at load)."""

from __future__ import annotations

import os


def set_thread_policy() -> None:
    """``OMP_WAIT_POLICY=PASSIVE`` unless the user set it: idle OpenMP threads sleep instead of spinning.

    Strata's CPU work is large matrix products (a parallel region of ~10 ms each in the demo's
    training), so waking a sleeping thread costs little, while spinning threads burn a core each
    between regions and, on a shared machine, while a partner thread waits for a core. Measured on
    the demo's training run (2 cores, load average ~4): 2 threads spinning 87 CPU-s, 2 threads
    passive 49 CPU-s, 1 thread 50 CPU-s, identical losses. No effect once torch is imported.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
