"""Strata's evaluation suite: wikitext-style and Paloma-style rolling log-likelihood through
lm-eval task YAMLs (``evals/tasks/``) and DCLM-core scored the llm-foundry way.

Entry point: :func:`evals.run.evaluate`.
"""
