"""Faithfulness of ``sv.ZipAR`` to the official LlamaGen-ZipAR loop, greedily, on a tiny random LlamaGen.

    python docs/results/archive/faithfulness_zipar.py PATH/TO/ZipAR [--windows 2 3 4 8] [--grid 8] [--out docs/results/archive/zipar-faithfulness]

PATH is a local checkout of ThisisBillhe/ZipAR (its ``LlamaGen-ZipAR`` tree is imported; nothing of it is
copied here). Runs on CPU (torch only). Setting (pjd_zipar_brief D1): the official ``Transformer`` with
``ModelArgs(dim=64, n_layer=2, n_head=4, vocab_size=50, block_size=grid^2, num_classes=10)``, dropouts 0,
every parameter re-drawn N(0, 0.2) (the official init zeroes the output head), ``zipar_window_size = s``;
its state dict is loaded into specvis with ``LlamaGen.from_checkpoint`` (the official-checkpoint loader).
Both decode classes 0..7 greedily with CFG 2.0 (official ``generate(..., cfg_scale=2.0, sample_logits=False)``
then ``reset_zipar()``; specvis ``ZipAR(window=s)`` under ``Sampling(temperature=0, cfg_scale=2.0)``).
Reported per window: forwards of each (the official model's forward calls, counted by a hook; specvis's
``target_forwards``), the fraction of equal tokens overall and per image row, and the same for plain AR
(official ``generate.generate`` vs ``sv.AR``) as the check that both run the same model.

Expected differences (docstring of ``specvis/methods/zipar.py``): the official query of row r + 1 also
attends to the never-written (zero) cache slots of row r's tail and keeps the placeholder token's KV in
slot (r, W - 1) until it is overwritten; specvis masks both. Rows 0 and 1 cannot differ (row 1 starts
once row 0 is complete); rows >= 2 may.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

import specvis as sv
from specvis.io import write_text


def official_model(root: Path, grid: int, seed: int):
    sys.path.insert(0, str(root / "LlamaGen-ZipAR"))
    from autoregressive.models.gpt import ModelArgs, Transformer

    torch.manual_seed(seed)
    args = ModelArgs(dim=64, n_layer=2, n_head=4, vocab_size=50, block_size=grid * grid, num_classes=10,
                     cls_token_num=1, model_type="c2i", token_dropout_p=0.0, resid_dropout_p=0.0,
                     ffn_dropout_p=0.0, attn_dropout_p=0.0, class_dropout_prob=0.1)
    model = Transformer(args).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


def count_forwards(model) -> list[int]:
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("zipar", type=Path, help="local checkout of ThisisBillhe/ZipAR")
    ap.add_argument("--windows", type=int, nargs="+", default=[2, 3, 4, 8])
    ap.add_argument("--grid", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write OUT.json and OUT.md")
    a = ap.parse_args()
    if not (a.zipar / "LlamaGen-ZipAR" / "autoregressive" / "models" / "generate_zipar.py").is_file():
        ap.error(f"{a.zipar} is not a ZipAR checkout (no LlamaGen-ZipAR/autoregressive/models/generate_zipar.py)")
    torch.set_num_threads(1)
    model = official_model(a.zipar, a.grid, a.seed)
    from autoregressive.models import generate as plain
    from autoregressive.models import generate_zipar as zipar

    calls = count_forwards(model)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny.pt"
        torch.save({"model": model.state_dict()}, path)
        ours = sv.models.LlamaGen.from_checkpoint(path, n_head=4, block_size=a.grid * a.grid).eval()
    classes = torch.arange(8)
    L, W = a.grid * a.grid, a.grid
    greedy = sv.Sampling(temperature=0.0, cfg_scale=2.0)
    kw = dict(cfg_scale=2.0, cfg_interval=-1, temperature=1.0, top_k=0, top_p=1.0, sample_logits=False)

    def compare(theirs: torch.Tensor, mine: torch.Tensor) -> dict:
        eq = (theirs.view(-1, W, W) == mine.view(-1, W, W)).float()
        return {"equal_tokens": float(eq.mean()), "equal_by_row": [round(float(x), 3) for x in eq.mean((0, 2))]}

    rows = []
    with torch.no_grad():
        calls[0] = 0
        theirs = plain.generate(model, classes, L, **kw)[:, -L:]
        mine = sv.generate(ours, classes, sv.AR(), greedy, seed=0)
        rows.append({"method": "ar", "official_forwards": calls[0], "specvis_forwards": mine.stats.target_forwards,
                     **compare(theirs, mine.tokens)})
        for s in a.windows:
            model.zipar_window_size = s
            model.reset_zipar()
            calls[0] = 0
            theirs = zipar.generate(model, classes, L, **kw)[:, -L:]
            model.reset_zipar()
            mine = sv.generate(ours, classes, sv.ZipAR(window=s), greedy, seed=0)
            rows.append({"method": f"zipar window={s}", "official_forwards": calls[0],
                         "specvis_forwards": mine.stats.target_forwards, **compare(theirs, mine.tokens)})
    for r in rows:
        print(r)
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        data = {"grid": a.grid, "seed": a.seed, "classes": classes.tolist(), "rows": rows}
        lines = [f"# ZipAR: specvis vs the official LlamaGen-ZipAR loop ({a.grid}x{a.grid}, greedy, CFG 2)", "",
                 f"Produced by `python docs/results/archive/faithfulness_zipar.py ZIPAR_CHECKOUT --grid {a.grid} --windows "
                 f"{' '.join(map(str, a.windows))}` (setting and expected differences in its docstring).", "",
                 "| method | official forwards | specvis forwards | equal tokens | equal by image row |",
                 "| --- | ---: | ---: | ---: | --- |"]
        lines += [f"| {r['method']} | {r['official_forwards']} | {r['specvis_forwards']} | {r['equal_tokens']:.3f} | "
                  f"{' '.join(f'{x:.2f}' for x in r['equal_by_row'])} |" for r in rows]
        for suffix, text in ((".json", json.dumps(data, indent=1)), (".md", "\n".join(lines) + "\n")):
            write_text(out.with_suffix(suffix), text)


if __name__ == "__main__":
    main()
