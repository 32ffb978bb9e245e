"""Model bundles by name: the embedded ``emoji`` bundle (shipped under ``specvis/assets/emoji``)
and ``random-tiny`` (seeded random models, for smoke tests without any weights)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .models.drafter import EagleDrafter
from .models.llamagen import LlamaGen, LlamaGenConfig
from .pipeline import PaletteTokenizer, Pipeline
from .sampling import Sampling

ASSETS = Path(__file__).parent / "assets"


def _random_tiny() -> Pipeline:
    torch.manual_seed(0)
    base = dict(vocab_size=64, num_classes=4, block_size=64, multiple_of=32)
    target = LlamaGen(LlamaGenConfig(dim=64, n_layer=2, n_head=4, initializer_range=0.2, **base)).eval()
    draft = LlamaGen(LlamaGenConfig(dim=32, n_layer=1, n_head=2, initializer_range=0.2, **base)).eval()
    drafter = EagleDrafter.from_target(target, seed=1).eval()
    return Pipeline("random-tiny", target, PaletteTokenizer(64).eval(), draft=draft, drafter=drafter,
                    class_names=[f"class{i}" for i in range(4)])


def _emoji() -> Pipeline:
    root = ASSETS / "emoji"
    meta_path = root / "bundle.json"
    if not meta_path.exists():
        raise ValueError("the emoji bundle is not installed (specvis/assets/emoji/bundle.json missing); "
                         "use --model random-tiny")
    from .models.vq import VQModel

    meta = json.loads(meta_path.read_text())
    target = LlamaGen.from_pretrained(root / "target")
    pipe = Pipeline(
        "emoji",
        target,
        VQModel.from_pretrained(root / "vq"),
        draft=LlamaGen.from_pretrained(root / "draft") if (root / "draft").exists() else None,
        drafter=EagleDrafter.from_pretrained(root / "drafter", target) if (root / "drafter").exists() else None,
        class_names=meta["class_names"],
        default_sampling=Sampling(**meta.get("default_sampling", {})),
        extras={"meta": meta, "root": root},
    )
    return pipe.to("cpu")


BUNDLES = {
    "emoji": ("colour-emoji LlamaGen target + draft and VQ tokenizer trained for specvis (embedded)", _emoji),
    "random-tiny": ("seeded random tiny LlamaGen target + draft, palette images (smoke tests)", _random_tiny),
}


def load(name: str = "emoji", device: str | torch.device = "cpu") -> Pipeline:
    """Load a bundle by name, offline."""
    if name not in BUNDLES:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(BUNDLES)}")
    return BUNDLES[name][1]().to(device)


def installed(name: str) -> bool:
    return name != "emoji" or (ASSETS / "emoji" / "bundle.json").exists()
