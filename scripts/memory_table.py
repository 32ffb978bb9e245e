"""The README's memory table: what each real family needs, from ``specvis.memory``'s plan formula.

    python scripts/memory_table.py

For each release shape (``scripts/synthetic_checkpoint.py``'s numbers; config files written without
weights to a temporary directory) the decoder ``sv.load`` loads is built on the meta device: its
weights in bf16, and the KV cache of a call (``cache_geometry(...).nbytes``, the formula the
allocation uses) at its native grid with CFG (2 rows a sample), SJD window 16 (18 slots) and a
64-token prompt (LlamaGen t2i: 120 caption states), at batch 1 and 8: stored bf16 on a GPU, fp32 on
a CPU (``models.base.storage_dtype``). Nothing is allocated."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
GB = 10 ** 9
SLOTS = 18  # SJD(window=16).pad
ROWS = [("Janus-Pro-1B", "janus", "1b", None), ("Janus-Pro-7B", "janus", "7b", None), ("Emu3-Gen (8B)", "emu3", "8b", None),
        ("Anole-7B", "anole", "7b", None), ("Lumina-mGPT-7B-768", "lumina", "7b", (48, 48)),
        ("LlamaGen t2i XL, 256 px", "llamagen-t2i", "xl", None), ("LlamaGen t2i XL, 512 px", "llamagen-t2i", "xl", (32, 32))]


def decoder(family: str, size: str, grid, tmp: Path):
    from specvis.models.loading import skeleton

    if family == "llamagen-t2i":
        from specvis.models.llamagen import LlamaGenT2I
        from synthetic_checkpoint import llamagen_t2i_config

        cfg = llamagen_t2i_config(size)
        if grid:
            cfg.block_size = grid[0] * grid[1]
        return skeleton(lambda: LlamaGenT2I(cfg)), cfg.cls_token_num
    import specvis.families as fam

    d = tmp / f"{family}-{size}"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "synthetic_checkpoint.py"), family, size, str(d), "--config-only"],
                   check=True, capture_output=True)
    f, config = fam.detect(d)
    h, w = grid or (None, None)
    with torch.device("cpu"):
        model = skeleton(lambda: f.build(d, config, h, w)[0])
    return model, 64


def main() -> None:
    lines = ["| model | native grid | weights (bf16) | KV, batch 1 | KV, batch 8 | total, batch 1 / 8 (GPU) |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    with tempfile.TemporaryDirectory() as tmp:
        for name, family, size, grid in ROWS:
            model, prompt = decoder(family, size, grid, Path(tmp))
            weights = sum(p.numel() for p in model.parameters()) * 2
            kv = {(b, dev): model.cache_geometry(2 * b, prompt, SLOTS).nbytes(torch.bfloat16, dev)
                  for b in (1, 8) for dev in ("cuda", "cpu")}
            L = model.layout
            lines.append(f"| {name} | {L.height}x{L.width} ({L.stream_len} stream tokens) | {weights / GB:.1f} GB | "
                         f"{kv[1, 'cuda'] / GB:.2f} GB (CPU {kv[1, 'cpu'] / GB:.2f}) | {kv[8, 'cuda'] / GB:.1f} GB "
                         f"(CPU {kv[8, 'cpu'] / GB:.1f}) | {(weights + kv[1, 'cuda']) / GB:.1f} / {(weights + kv[8, 'cuda']) / GB:.1f} GB |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
