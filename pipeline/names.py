"""The names each stage answers to, declared without importing any stage.

The configuration validates against these lists; each stage's registry is built from (or
checked against) them — ``tests/test_config.py`` fails when a stage adds a name that is not
declared here, so add new strategies, packings, embedding methods or model presets here too.
"""

from __future__ import annotations

EMBED_METHODS = ("sentence", "shallow", "deep")
OBJECTIVES = ("stationary", "f1", "f2", "f3", "custom")  # greedy objectives: Don't Shuffle, Optimize's f1-f3, Strata's default, your own families
TOKEN_FAMILIES = ("cluster", "length_bin", "norm")  # built-in token families of the greedy (plus any documents column)
SEQUENCE_FAMILIES = ("concentration", "documents", "cluster_count")  # sequence families: quantile classes held at their share of sequences
WITHIN_SORTS = ("original", "length-asc", "length-desc", "length-riffle")
ORDERING_STRATEGIES = (
    "original", "random", "greedy", "greedy_fast", "greedy_curriculum", "greedy_block_shuffle", "stratified",
    "token_weighted", "round_robin", "bin_packing", "cluster_packed", "duplicate_separated",
    "cluster_sorted",  # the positive control (pipeline/ordering/control.py)
)
POSITIVE_CONTROL = "cluster_sorted"  # the deliberately harmful order every ablation report checks first
TRAINING_TIME_STRATEGIES = ("odm",)  # chosen online during training (ODM), not by a scheduler
PACKING_VARIANTS = ("concat", "padding", "best_fit")
ATOM_MULTIPLES = (0.25, 0.5, 1.0, 2.0, 4.0)  # Packing & shuffling, Table 1 / Table 4
MODEL_PRESETS = ("tiny", "small", "base", "100m")
EXPORT_FORMATS = ("numpy", "megatron", "mds", "hf")  # strata export / the exports asset


def packing_name(variant: str, atom_multiple: float | None) -> str:
    """``("concat", 0.5)`` -> ``"concat-x0.5"``; ``None`` -> the plain variant."""
    return variant if atom_multiple is None else f"{variant}-x{atom_multiple:g}"


PACKING_SPECS = (
    *(packing_name(v, a) for v in ("concat", "padding") for a in (None, *ATOM_MULTIPLES)),
    "best_fit",
)
