"""``norm``: the single column ||c_s||_2 with target rho = sum ||c_s|| / sum l_s (Don't Shuffle,
Optimize's f2 term lam (N - rho S)^2)."""

from __future__ import annotations

import numpy as np

from pipeline.ordering.characteristics import cluster_norms
from pipeline.ordering.families import TokenFamily
from pipeline.ordering.features import Csr


class Norm(TokenFamily):
    name = "norm"
    description = "||c_s||_2, held at rho = sum ||c_s|| / sum l_s per token (f2)"

    def tokens(self, features):
        norms = cluster_norms(features)
        m = norms.size
        return Csr(np.arange(m + 1, dtype=np.int64), np.zeros(m, dtype=np.int64), norms, 1)


SPECS = (Norm(),)
