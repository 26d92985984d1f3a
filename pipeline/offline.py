"""The one place that keeps Hugging Face libraries offline (no hub request at run time)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

FLAGS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def set_offline(hf_home: str | os.PathLike | None = None, force: bool = False) -> None:
    """Set the HF offline flags (``force`` overrides a user's values) and quiet tokenizers' fork warning.

    ``hf_home`` points ``HF_HOME`` (datasets' Arrow cache) into a folder of ours. An already
    imported ``datasets`` reads its offline flag once at import, so it is set there too.
    """
    for flag in FLAGS:
        if force:
            os.environ[flag] = "1"
        else:
            os.environ.setdefault(flag, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if hf_home is not None:
        os.environ["HF_HOME"] = str(Path(hf_home).resolve())

    if "datasets" in sys.modules:
        try:
            sys.modules["datasets"].config.HF_HUB_OFFLINE = True
        except AttributeError:
            pass
