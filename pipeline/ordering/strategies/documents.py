"""Document-level strategies (Diversity-ordered training; Don't Shuffle, Optimize Idea 1): order the
documents (``pipeline/ordering/documents.py``), then repack them."""

from __future__ import annotations

from pipeline.ordering.documents import bin_packing_order, round_robin_order, stratified_order, token_weighted_order
from pipeline.ordering.strategies import StrategySpec
from pipeline.packing.pack import check_seq_len


def stratified(cluster, length, seq_len: int, params):
    return stratified_order(cluster, length, params.within)


def token_weighted(cluster, length, seq_len: int, params):
    return token_weighted_order(cluster, length, params.within)


def round_robin(cluster, length, seq_len: int, params):
    return round_robin_order(cluster, length, params.within)


def bin_packing(cluster, length, seq_len: int, params):
    check_seq_len(seq_len)
    return bin_packing_order(cluster, length, seq_len, params.within)


SPECS = (
    StrategySpec("stratified", "document",
                 "Diversity-ordered training stratified greedy on document counts (within-cluster sort `within`), repacked",
                 seed_free=True, reads=("within",), order=stratified),
    StrategySpec("token_weighted", "document",
                 "Don't Shuffle, Optimize Idea 1: the argmin of the token deviation over all remaining documents, repacked",
                 seed_free=True, reads=("within",), order=token_weighted),
    StrategySpec("round_robin", "document", "one document per cluster in turn, repacked", seed_free=True, reads=("within",),
                 order=round_robin),
    StrategySpec("bin_packing", "document", "worst-fit packing of round-robin documents into sequence-sized bins, repacked",
                 seed_free=True, reads=("within",), order=bin_packing),
)
