"""The linear kernels at a 7B layer's shape on this CPU, one thread: what ``models.weight_layout`` and
``models.quantize`` choose from.

    python scripts/cpu_linear_7b.py --json docs/results/data/cpu-linear-7b.json

A product x W^T with W 11008 x 4096 (a Llama-7B feed-forward weight, 90 MB in bf16), three distinct
weights cycled (270 MB: every call streams its weight from memory, as in a decode), bf16
activations of 1 to 66 rows; per kernel the median of 7 timed calls after 2 untimed ones, the
kernels interleaved row count by row count:

- ``bf16 contiguous``: ``F.linear`` with W stored (out, in) (oneDNN re-lays it out per call);
- ``bf16 transposed``: W stored as the transpose of a contiguous (in, out) matrix;
- ``bf16 packed``: oneDNN over W packed once (``PackedLinear``);
- ``int8 torch``: ``aten._weight_int8pack_mm`` over int8 W with per-row scales (``Int8Linear``);
- ``int8 dequantised``: int8 W converted to bf16 and scaled, then ``F.linear``, per call;
- ``int8 torchao``: torchao's ``Int8WeightOnlyConfig`` (only where torchao is installed; specvis
  does not depend on it).

Pure torch (no specvis import), so it runs in any environment with torch (and torchao).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

N, K = 11008, 4096
ROWS = (1, 2, 4, 8, 18, 34, 66)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json")
    p.add_argument("--timed", type=int, default=7)
    a = p.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    ws = [(torch.randn(N, K, generator=g) / K ** 0.5).bfloat16() for _ in range(3)]
    wts = [w.t().contiguous().t() for w in ws]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in ws]

    def int8(w):
        s = w.float().abs().amax(1) / 127
        return torch.round(w.float() / s[:, None]).clamp(-127, 127).to(torch.int8), s.bfloat16()

    qs = [int8(w) for w in ws]
    kernels = {
        "bf16 contiguous": lambda x, i: F.linear(x, ws[i]),
        "bf16 transposed": lambda x, i: F.linear(x, wts[i]),
        "bf16 packed": lambda x, i: torch.ops.mkldnn._linear_pointwise(x, packed[i], None, "none", [], ""),
        "int8 torch": lambda x, i: torch.ops.aten._weight_int8pack_mm(x, qs[i][0], qs[i][1]),
        "int8 dequantised": lambda x, i: F.linear(x, qs[i][0].to(torch.bfloat16) * qs[i][1][:, None]),
    }
    versions = {"torch": torch.__version__}
    try:
        import torchao
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        mods = []
        for w in ws:
            m = torch.nn.Linear(K, N, bias=False).bfloat16()
            m.weight.data = w.clone()
            quantize_(m, Int8WeightOnlyConfig())
            mods.append(m)
        kernels["int8 torchao"] = lambda x, i: mods[i](x)
        versions["torchao"] = torchao.__version__
    except ImportError:
        pass
    out = {name: {} for name in kernels}
    with torch.inference_mode():
        for rows in ROWS:
            x = torch.randn(rows, K, generator=g).bfloat16()
            times = {name: [] for name in kernels}
            for rep in range(2 + a.timed):
                for name, fn in kernels.items():
                    t0 = time.perf_counter()
                    fn(x, rep % 3)
                    if rep >= 2:
                        times[name].append(time.perf_counter() - t0)
            for name in kernels:
                out[name][rows] = statistics.median(times[name]) * 1e3
            print(rows, {k: round(v[rows], 2) for k, v in out.items()}, flush=True)
    report = {"shape": [N, K], "threads": 1, "versions": versions, "ms": out}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
