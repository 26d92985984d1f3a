"""Quality scorers that train Strata's own model (``pipeline/training/``). The quality registry
(:data:`pipeline.registry.SCORERS`) reads this package after ``pipeline/quality/scorers/``: the
quality stage finds them by name at run time, as it finds a plugin, without importing the
training package, which sits above it in the package graph (docs/architecture.md)."""
