"""The papers' claims, reproduced on the user's corpus: the registry of claims, one module per
paper (``pipeline/claims/papers/``), what they measure from (``measure``: the rows, ``ClaimData``,
the statistics; ``inputs``: ``ClaimData`` gathered from a data root), their figures (``plots``)
and the stage that measures them all (``stage.measure_claims``, the ``claims`` asset)."""
