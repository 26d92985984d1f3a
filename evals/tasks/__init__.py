"""lm-eval task YAMLs and their ``utils.py`` (loaded by ``TaskManager(include_path=...)``)."""
