"""What the checks of exercise 01 share: lesson 01's 5-token example."""

from __future__ import annotations

import torch

# The 5-token example of lesson 01.
P5 = [0.50, 0.25, 0.15, 0.07, 0.03]
Q5 = [0.30, 0.40, 0.10, 0.15, 0.05]


def _t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)
