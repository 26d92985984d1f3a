"""Each part of a stage's own peak resident memory: the kernel's high-water mark of this process
(``VmHWM`` in ``/proc/self/status``), reset to the current resident size before each part (writing
``5`` to ``/proc/self/clear_refs``), so a part's figure is the most this process held while it ran:
what earlier parts left in memory counts, a finished part's peak does not. Pages of memory-mapped
files the part touched count too, as they count in any resident-size figure. On a kernel without
these files (not Linux) the figures are absent, never guessed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def reset_peak() -> bool:
    """Set this process's high-water mark to its resident size now; False where the kernel does not allow it."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def peak_mb() -> float | None:
    """This process's high-water mark of resident memory (MiB) since it started or since :func:`reset_peak`."""
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class PartPeaks:
    """The peak resident MiB of each named part, as ``with peaks.part("near"): ...`` measures it."""

    def __init__(self) -> None:
        self.mb: dict[str, float] = {}

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        reset = reset_peak()
        try:
            yield
        finally:
            peak = peak_mb() if reset else None
            if peak is not None:
                self.mb[name] = round(peak, 1)

    def facts(self, prefix: str = "peak_rss_mb_") -> dict[str, float]:
        """One fact a part: ``<prefix><part>``."""
        return {f"{prefix}{name}": mb for name, mb in self.mb.items()}
