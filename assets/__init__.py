"""Strata's Dagster layer: thin asset definitions over ``pipeline/`` (see ``assets.definitions``)."""
