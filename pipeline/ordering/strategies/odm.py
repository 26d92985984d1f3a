"""``odm``: Online Data Mixing, a training-time strategy (``pipeline/training/odm.py``).

ODM's Exp3 sampler picks each step's sequences online from per-cluster pools, so it has no fixed
order to write or export: the orderings asset writes ``cluster_packed``'s packing for it (its
sequences each hold one cluster) and training samples from that.
"""

from pipeline.ordering.strategies import StrategySpec

SPECS = (
    StrategySpec("odm", "training", "Online Data Mixing: an Exp3 bandit over the clusters picks each step's sequences during training",
                 seed_free=False, reads=("odm_smoothing", "odm_warmup_fraction", "odm_clock", "odm_micro_batches", "odm_initial_weights"), packing_from="cluster_packed"),
)
