"""Strata's pure library: every pipeline stage as plain functions (no Dagster imports)."""
