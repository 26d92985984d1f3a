"""The registries of Strata's extension families: ordering strategies, export formats, eval suites.

A family's built-in entries are the modules of one package (``pipeline/ordering/strategies/``,
``pipeline/export/formats/``, ``evals/suites/``); each module declares ``SPECS``, a tuple of the
family's spec objects. Plugins add entries without touching the tree: ``STRATA_PLUGINS`` lists
modules (dotted names or ``.py`` files, separated by ``os.pathsep``), each declaring ``SPECS``
like a built-in module; every registry takes the entries of its own spec type.

The built-in registries of the library are declared here (:data:`STRATEGIES`, :data:`FAMILIES`,
:data:`EXPORT_FORMATS`, :data:`SCORERS`), each by the package its entries live in and the name of its spec type,
both imported when the registry is first read: the configuration (``pipeline/config.py``, beneath
every stage) validates names against them without importing a stage package, and each package's
``REGISTRY`` is the handle declared here. Spec modules import their stage's code at their top;
what they must not import is a heavy dependency (``pipeline/heavy.py``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Generic, Iterator, TypeVar

from pipeline.errors import StrataInputError

PLUGINS_ENV = "STRATA_PLUGINS"
T = TypeVar("T")


def _plugin(ref: str) -> ModuleType:
    if not ref.endswith(".py"):
        try:
            return importlib.import_module(ref)
        except ImportError as exc:
            raise StrataInputError(f"cannot import the plugin module {ref!r} ({exc})",
                                   fix=f"put it on PYTHONPATH or name a .py file in {PLUGINS_ENV}") from None
    path = Path(ref).expanduser().resolve()
    if not path.is_file():
        raise StrataInputError("plugin file not found", path=path, fix=f"name existing .py files in {PLUGINS_ENV}")
    name = f"strata_plugin_{path.stem}"
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def plugin_modules() -> list[ModuleType]:
    """The modules named by ``STRATA_PLUGINS``, imported."""
    return [_plugin(ref) for ref in os.environ.get(PLUGINS_ENV, "").split(os.pathsep) if ref.strip()]


class Registry(Generic[T]):
    """Entries of one spec type by name: the modules of ``package``, then those of the packages
    ``also`` (entries that live higher in the package graph, e.g. a scorer that trains Strata's own
    model), then the plugins'. ``kind`` is the spec type, or its ``"module:Name"``, imported when
    the entries are first read."""

    def __init__(self, kind: type[T] | str, package: str, what: str, also: tuple[str, ...] = ()):
        self._kind, self.package, self.what, self.also = kind, package, what, also
        self._entries: dict[str, T] | None = None

    @property
    def kind(self) -> type[T]:
        if isinstance(self._kind, str):
            module, _, name = self._kind.partition(":")
            self._kind = getattr(importlib.import_module(module), name)
        return self._kind  # type: ignore[return-value]

    def _modules(self) -> Iterator[ModuleType]:
        for package in (self.package, *self.also):
            pkg = importlib.import_module(package)
            for info in pkgutil.iter_modules(pkg.__path__):
                if not info.name.startswith("_"):
                    yield importlib.import_module(f"{package}.{info.name}")
        yield from plugin_modules()

    def _put(self, entries: dict[str, T], spec: T, where: str) -> None:
        name = spec.name  # type: ignore[attr-defined]
        if name in entries and entries[name] is not spec:
            raise StrataInputError(f"more than one {self.what} is named {name!r} ({where})", fix="rename one of them")
        entries[name] = spec

    def entries(self) -> dict[str, T]:
        """Every entry by name, built-in modules first (in file order), then the plugins'."""
        if self._entries is None:
            entries: dict[str, T] = {}
            for module in self._modules():
                for spec in getattr(module, "SPECS", ()):
                    if isinstance(spec, self.kind):
                        self._put(entries, spec, module.__name__)
            self._entries = entries
        return self._entries

    def names(self) -> tuple[str, ...]:
        return tuple(self.entries())

    def get(self, name: str) -> T:
        entries = self.entries()
        if name not in entries:
            raise StrataInputError(f"unknown {self.what} {name!r}", fix=f"use one of {', '.join(entries)}")
        return entries[name]

    def reload(self) -> None:
        """Forget the loaded entries: the next read imports the modules and ``STRATA_PLUGINS`` again."""
        self._entries = None


STRATEGIES: Registry = Registry("pipeline.ordering.strategies:StrategySpec", "pipeline.ordering.strategies", "ordering strategy")
FAMILIES: Registry = Registry("pipeline.ordering.families:FamilySpec", "pipeline.ordering.families", "characteristic family")
EXPORT_FORMATS: Registry = Registry("pipeline.export.formats:ExportFormat", "pipeline.export.formats", "export format")
# the perplexity scorer trains Strata's own model (pipeline/training/), above the quality stage in the
# package graph: its package is read at run time, like a plugin, and imports the quality stage's Scorer
SCORERS: Registry = Registry("pipeline.quality.scorers:Scorer", "pipeline.quality.scorers", "quality scorer",
                             also=("pipeline.training.scorers",))
