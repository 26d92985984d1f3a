"""``strata list``: the rows of the library's registries (strategies, characteristic families, export
formats, the papers' claims) and the tables that print them."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from pipeline.claims.papers import ordered as claims
from pipeline.export.formats import REGISTRY as formats
from pipeline.ordering.families import REGISTRY as families
from pipeline.ordering.strategies import REGISTRY as strategies

Row = tuple[str, str, str, str]  # name, kind, config keys read, description


def library_rows(family: str) -> list[Row]:
    """The rows of the library registry ``family``: strategies, formats, families or claims."""
    if family == "strategies":
        return [(s.name, f"{s.level}{'' if s.seed_free else ', seeded'}{', greedy' if s.greedy_based else ''}", ", ".join(s.reads),
                 s.description) for s in strategies.entries().values()]
    if family == "formats":
        return [(f.name, "export format", ", ".join(f.reads), f.description) for f in formats.entries().values()]
    if family == "families":
        return [(f.name, f"{f.level} family" + (", repaired" if f.repaired else "")
                 + (f", diagnosed as {f.diagnosed}" if f.diagnosed else ""),
                 "", f.description) for f in families.entries().values()]
    return [(c.name, f"claim of {c.paper}" + (f", from {', '.join(c.inputs)}" if c.inputs else ""), ", ".join(c.reads),
             c.description) for c in claims()]


def print_registries(rows: dict[str, list[Row]]) -> None:
    """One table per registry: name, kind, the config keys it reads, description."""
    console = Console()
    for family, entries in rows.items():
        table = Table(title=family)
        for col in ("name", "kind", "reads", "description"):
            table.add_column(col, overflow="fold")
        for row in entries:
            table.add_row(*row)
        console.print(table)
