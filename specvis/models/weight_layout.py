"""CPU weight layout of linear layers.

``F.linear(x, W)`` computes x W^T with W stored (out, in). On the CPU with few rows per call (a
cached decode step: 1-34 rows at batch 1 with CFG) the matmul runs faster when W is the transpose
of a contiguous (in, out) matrix, i.e. W has strides (1, out): x W^T is then a plain row-major
product. Measured on this repository's 2-core machine, one thread, 24 distinct 704 x 256 weights
(docs/benchmarks/weight-layout-cpu*.md, two runs minutes apart): where the weights stream at L3
speed 1.05-1.12x and the emoji target's forward unchanged within drift; in a window where memory
was 2.6x slower, 1.3-1.7x and the forward 13-16% faster. Never slower; the values are unchanged,
only the strides differ.
"""
from __future__ import annotations

from torch import nn

__all__ = ["transpose_linear_weights"]


def transpose_linear_weights(module: nn.Module) -> int:
    """Store every CPU ``nn.Linear`` weight of ``module`` as the transpose of a contiguous (in, out)
    matrix (same values and shape, strides (1, out)); returns how many were changed. A weight shared
    with another module (an output head tied to the token embedding) is left as it is: embedding
    lookups read rows, which the transposed layout would scatter."""
    owners: dict[int, int] = {}
    for sub in module.modules():
        for p in sub.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    changed = 0
    for sub in module.modules():
        w = getattr(sub, "weight", None)
        if (isinstance(sub, nn.Linear) and w is not None and w.device.type == "cpu" and owners[id(w)] == 1
                and w.dim() == 2 and w.is_contiguous() and min(w.shape) > 1):
            w.data = w.data.t().contiguous().t()
            changed += 1
    return changed
