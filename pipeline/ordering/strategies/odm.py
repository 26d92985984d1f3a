"""``odm``: Online Data Mixing, a training-time strategy (``pipeline/ordering/odm.py``).

ODM's Exp3 sampler picks each step's sequences online from per-cluster pools, so it has no fixed
order to write or export: the orderings asset writes ``cluster_packed``'s packing for it (its
sequences each hold one cluster) and training samples from that.
"""

from pipeline.ordering.odm import odm_sampler
from pipeline.ordering.strategies import StrategySpec


def sampler(segments, doc_cluster, n_steps: int, seed: int, params):
    """ODM's Exp3 sampler over the clusters of ``segments``' sequences (``pipeline.ordering.odm.odm_sampler``),
    with the config group ``odm`` the training stage's ``params`` hold."""
    return odm_sampler(segments, doc_cluster, n_steps, seed, params.odm)


SPECS = (
    StrategySpec("odm", "training", "Online Data Mixing: an Exp3 bandit over the clusters picks each step's sequences during training",
                 seed_free=False, reads=("odm.smoothing", "odm.warmup_fraction", "odm.clock", "odm.micro_batches", "odm.initial_weights"),
                 packing_from="cluster_packed", sampler=sampler),
)
