"""The Chameleon family in the transformers layout (``model_type: chameleon``): Anole and Lumina-mGPT.

A Llama-shaped decoder with per-head query/key LayerNorms (``qk_norm``) and, where the config says
``swin_norm``, output normalisation; image codes are ``IMGIMG<digits as letters>Z`` tokens of the text
vocabulary (code order from ``vocabulary_map``). transformers masks image logits in
``ChameleonForConditionalGeneration.forward``, so it cannot generate images; specvis reads the image
rows of ``lm_head`` directly. Two layouts, as their official inference code builds them:

- Anole (Meta's chameleon inference, ``text2image.py``): prompt = BOS, the text, end-of-turn
  ``<reserved08706>``, begin-image ``<racm3:break>``; a 32x32 grid, no structural tokens. CFG is
  InstructPix2Pix-style over three rows (full, image-only, unconditional = [BOS, begin-image]): for a
  text-only prompt the image-only row equals the unconditional one, so the guided logits are
  u + s_text (c - u), docs/design/api.md's formula with s = guidance_scale_text (official 3.0; temperature 0.7,
  top-p 0.9). Meta's code left-pads prompts of a batch with attended pad tokens; specvis gives every
  row its own length (the same law for batch 1).
- Lumina-mGPT (``ChameleonXLLMXForConditionalGeneration``, ``inference_solver.py``): the human turn
  "Generate an image of {w}x{h} according to the following prompt:\\n{text}" + ``<reserved08706>``,
  then begin-image and two grid-size tokens ``<reserved{8800 + n:05d}>`` (n = tokens / 2), which the
  official code lets the model sample and specvis fixes from height/width; each row of image tokens
  ends with ``<reserved08799>`` (forced: ``Layout.row_end = 1``). CFG starts at begin-image: the
  unconditional prompt is [begin-image, h, w] with no text and no BOS; guided = u + s (c - u) on raw
  logits (official cfg 4.0, top-k 2000). The default grid is the release's target size, which only its
  name tells (``native_grid``: 7B-512 32x32, 7B-768 48x48, 7B-1024 64x64; 768 px when no name tells).

The unconditional rows come from config.json's ids (``vocabulary_map``: ``<s>``, begin-image, the size
tokens), as a ``PromptDecoder`` rule, so token-id prompts under CFG need no tokenizer.

Query/key-norm layouts verified against the code that wrote them (``per_head_norm``): transformers'
Chameleon, one row per head (tests/test_chameleon.py, tiny ``ChameleonForConditionalGeneration``
models, logits equal); Lumina-mGPT's release layout, one row per model-parallel shard, with mp = 1 and
mp = 2 (checkpoints written by Lumina's own ``ChameleonXLLMXForConditionalGeneration``, logits equal to
its inference class's: tests/fixtures/lumina_mgpt).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from ..models.base import Layout
from ..models.decoder import MappedEmbedding, PromptDecoder
from ..models.loading import Piece, Route, rename_with
from .base import Family
from .hf import decoder_route, llama_config, rows_of

NAME = "chameleon"
PROMPT_PROCESSOR = "AutoTokenizer"  # prompts need only the tokenizer (no image processor in these releases)
DEFAULT_SAMPLING = {"cfg_scale": 3.0, "temperature": 0.7, "top_p": 0.9}  # Anole (Meta's Options.Image)
LUMINA_SAMPLING = {"cfg_scale": 4.0, "temperature": 1.0, "top_k": 2000}
EOT, BOI, ROW_END = "<reserved08706>", "<racm3:break>", "<reserved08799>"
RENAMES = [
    (r"^model\.embed_tokens\.", "tok_embeddings."),
    (r"^model\.norm\.", "norm."),
    (r"^model\.layers\.", "hf_layers."),
]
KEEP = ("tok_embeddings.", "norm.", "hf_layers.", "lm_head.")


def matches(config: dict) -> bool:
    return config.get("model_type") == NAME


def is_lumina(config: dict) -> bool:
    """Lumina-mGPT's releases: ChameleonXLLMXConfig (model_type still chameleon) adds z_loss_weight."""
    return "z_loss_weight" in config or any("XLLMX" in a for a in config.get("architectures") or [])


def image_ids(config: dict, where: str) -> list[int]:
    """Text-vocabulary ids of codes 0 .. V-1: ``IMGIMG`` + the code's digits written A-J + ``Z``."""
    vocab = config.get("vocabulary_map") or {}
    codes = {}
    for name, i in vocab.items():
        if name.startswith("IMGIMG") and name.endswith("Z"):
            digits = "".join(str(ord(c) - ord("A")) for c in name[6:-1])
            codes[int(digits)] = int(i)
    if not codes or sorted(codes) != list(range(len(codes))):
        raise ValueError(f"{where}: config.json vocabulary_map has no complete set of IMGIMG image tokens")
    return [codes[c] for c in range(len(codes))]


def special(config: dict, name: str, where: str) -> int:
    vocab = config.get("vocabulary_map") or {}
    if name not in vocab:
        raise ValueError(f"{where}: config.json vocabulary_map lacks {name}")
    return int(vocab[name])


RELEASE_SIZE = re.compile(r"lumina-mgpt-[0-9.]+b-([0-9]+)", re.IGNORECASE)
LUMINA_FALLBACK_PX = 768  # the official demo's --target_size default (demos/demo_image_generation.py line 254)


def native_grid(config: dict, directory: Path) -> tuple[int, int]:
    """The grid a checkpoint generates by default, in 16-px tokens.

    Anole: 32x32 (Meta's 512-px images). Lumina-mGPT: the official inference takes the image size as
    ``target_size`` "consistent with the checkpoint" (README; ``FlexARInferenceSolver(model_path,
    precision, target_size)``), and a release says it only in its name: Lumina-mGPT-7B-512 (32x32),
    -768 and -768-Omni (48x48), -1024 (64x64), -34B-512 (32x32); its config.json and
    generation_config.json do not hold it. So the size is read from the first directory, innermost
    first, whose name contains ``Lumina-mGPT-<n>B-<px>`` (a download named after the release, or the
    Hugging Face cache's ``models--Alpha-VLLM--Lumina-mGPT-7B-512/snapshots/<hash>``); when no name
    tells, 768 px (the official demo's default target size). ``height``/``width`` override either.
    """
    if not is_lumina(config):
        return 32, 32
    px = LUMINA_FALLBACK_PX
    for part in reversed(Path(directory).absolute().parts):
        found = RELEASE_SIZE.search(part)
        if found:
            px = int(found.group(1))
            break
    if px < 32 or px % 32:
        raise ValueError(f"{directory}: the release name says {px} px, not a multiple of Lumina-mGPT's 32-px "
                         "patches; pass height= and width= (--height/--width) in image tokens")
    return px // 16, px // 16


QK_NORM = re.compile(r"hf_layers\.\d+\.self_attn\.([qk])_norm\.(weight|bias)")


def per_head_norm(key: str, tensor: torch.Tensor, n_head: int, n_kv_head: int, head_dim: int,
                  where: str) -> torch.Tensor:
    """A query/key-norm affine tensor in transformers' per-head layout (heads, head_dim); other keys pass.

    Two release layouts hold these norms:

    - transformers' Chameleon (Anole, Meta's converted checkpoints): one row per head, (heads, head_dim).
    - Lumina-mGPT's ``ChameleonXLLMXForConditionalGeneration``: one row per model-parallel shard,
      (model_parallel_size, head_dim). Its ``ChameleonLayerNorm`` (lumina_mgpt/model/chameleon/
      modeling_chameleon.py lines 198-218) normalises each head over head_dim and applies
      ``weight.repeat_interleave(heads // mp, dim=0)`` (likewise the bias): head h takes the row of
      shard h // (heads // mp), the heads of a shard being consecutive. That is the expansion here.

    The layout is told by the row count (a flat tensor is read as rows of head_dim): rows == heads is
    per head (for mp == heads the two agree), rows dividing heads is per shard; anything else is a
    one-line error naming the tensor. The rotary pairing of head_dim is the same in both layouts. The
    per-head layout comes back as a view of ``tensor`` (a CPU load keeps it in the file's mapping).
    """
    found = QK_NORM.fullmatch(key)
    if found is None:
        return tensor
    heads = n_head if found.group(1) == "q" else n_kv_head
    rows = tensor.numel() // head_dim if tensor.numel() % head_dim == 0 else 0
    if rows == 0 or heads % rows:
        raise ValueError(f"{where}: {key} has shape {tuple(tensor.shape)}; expected ({heads}, {head_dim}) per head "
                         f"or (model_parallel_size, {head_dim}) with model_parallel_size dividing {heads} (Lumina-mGPT)")
    per_row = tensor.reshape(rows, head_dim)
    return per_row if rows == heads else per_row.repeat_interleave(heads // rows, dim=0)


class ChameleonDecoder(PromptDecoder):
    """The shared decoder with the checkpoint's structural ids declared: ``chameleon_ids`` ("eot", "boi",
    "bos", "sizes": Lumina-mGPT's size tokens, "lumina": the layout), which the prompt template
    (``encode``, ``negative``) reads; its unconditional rule is built from them."""

    def __init__(self, config, layout: Layout, head: nn.Module, ids: dict) -> None:
        super().__init__(config, layout, None, head, unconditional_rule(ids))
        self.chameleon_ids = ids


def build(directory: Path, config: dict, height: int | None = None, width: int | None = None):
    """(decoder, route): the model (``models.loading.skeleton`` builds it on meta) and where each
    checkpoint tensor goes; the head is the image-vocabulary rows of ``lm_head``."""
    where = str(directory)
    cfg = llama_config(config, where)
    cfg.qk_norm, cfg.swin_norm = True, bool(config.get("swin_norm", False))
    codes = image_ids(config, where)
    lumina = is_lumina(config)
    H, W = native_grid(config, directory) if height is None else (height, width)
    row_end = [special(config, ROW_END, where)] if lumina else []
    head = nn.Linear(cfg.dim, len(codes), bias=False)
    ids = {"eot": special(config, EOT, where), "boi": special(config, BOI, where), "lumina": lumina,
           "bos": bos_id(config), "sizes": size_tokens(config)}
    model = ChameleonDecoder(cfg, Layout(H, W, len(codes), row_end=len(row_end)), head, ids)
    model.image_embed = MappedEmbedding(model.tok_embeddings, torch.tensor(codes + row_end))
    return model, norms_per_head(decoder_route(RENAMES, KEEP, cfg, {"lm_head.weight": Piece("head.weight", None, rows_of(codes))}),
                                 cfg, where)


def norms_per_head(route: Route, cfg, where: str) -> Route:
    """``route`` with each query/key-norm tensor first brought to the per-head layout (``per_head_norm``:
    Lumina-mGPT's per-shard rows expanded), then placed as the base route places it."""
    rename = rename_with(RENAMES)

    def routed(key: str):
        pieces, name = route(key), rename(key)
        if not pieces or QK_NORM.fullmatch(name) is None:
            return pieces
        expand = lambda t: per_head_norm(name, t, cfg.n_head, cfg.n_kv_head, cfg.head_dim, where)
        return tuple(replace(p, transform=lambda t, f=p.transform: f(expand(t)) if f else expand(t)) for p in pieces)

    return routed


def bos_id(config: dict) -> int | None:
    """The tokenizer's BOS ``<s>`` as config.json's vocabulary_map (the tokenizer's vocabulary) has it, else
    config's ``bos_token_id``; None when neither is there."""
    vocab = config.get("vocabulary_map") or {}
    value = vocab.get("<s>", config.get("bos_token_id"))
    return None if value is None else int(value)


def size_tokens(config: dict) -> dict[int, int]:
    """Lumina-mGPT's size tokens n -> id of ``<reserved{8800 + n:05d}>`` (n patches of 32 px), from vocabulary_map."""
    out = {}
    for name, i in (config.get("vocabulary_map") or {}).items():
        found = re.fullmatch(r"<reserved(\d{5})>", name)
        if found and int(found.group(1)) >= 8800:
            out[int(found.group(1)) - 8800] = int(i)
    return out


def unconditional_rule(ids: dict) -> tuple | None:
    """The official unconditional prompt as a ``PromptDecoder`` rule, from config ids alone (so token-id
    prompts need no tokenizer): Lumina-mGPT guides from begin-image on (its CFG processor feeds the
    unconditional branch the tokens from the image start, i.e. [begin-image, h, w]: the conditional
    prompt's tail); Anole's is the fixed [BOS, begin-image]."""
    if ids["lumina"]:
        return ("from", ids["boi"])
    return None if ids["bos"] is None else ("fixed", (ids["bos"], ids["boi"]))


def _tokenizer(processor):
    return getattr(processor, "tokenizer", processor)


def encode(processor, texts: list[str], height: int, width: int, model: PromptDecoder) -> list[list[int]]:
    """The official prompt of the checkpoint's layout (module docstring), tokenised by its tokenizer."""
    tok = _tokenizer(processor)
    ids = model.chameleon_ids
    out = []
    for t in texts:
        if ids["lumina"]:
            q = f"Generate an image of {width * 16}x{height * 16} according to the following prompt:\n{t}"
            body = tok(q)["input_ids"] + [ids["eot"], ids["boi"]] + grid_tokens(model, height, width)
        else:
            body = tok(t)["input_ids"] + [ids["eot"], ids["boi"]]
        out.append([int(i) for i in body])
    return out


def grid_tokens(model: PromptDecoder, height: int, width: int) -> list[int]:
    """Lumina-mGPT's size tokens <reserved{8800 + n:05d}>, n = grid / 2 (32-px patches of 16-px tokens)."""
    if height % 2 or width % 2:
        raise ValueError(f"Lumina-mGPT grids are in 32-px patches: height and width must be even, got {height}x{width}")
    sizes = model.chameleon_ids["sizes"]
    for n in (height // 2, width // 2):
        if n not in sizes:
            raise ValueError(f"config.json vocabulary_map lacks <reserved{8800 + n:05d}>, Lumina-mGPT's size token "
                             f"for {n} patches: the grid {height}x{width} cannot be prompted")
    return [sizes[height // 2], sizes[width // 2]]


def negative(processor, count: int, height: int, width: int, model: PromptDecoder) -> list[list[int]]:
    """The unconditional prompt of a text prompt on this grid: [BOS, begin-image] (Anole); [begin-image,
    h, w] (Lumina-mGPT). From config ids; the processor serves only a config without a BOS id."""
    ids = model.chameleon_ids
    if ids["lumina"]:
        row = [ids["boi"]] + grid_tokens(model, height, width)
    else:
        bos = ids["bos"] if ids["bos"] is not None else int(_tokenizer(processor).bos_token_id)
        row = [bos, ids["boi"]]
    return [row] * count


def load_vq(directory: Path, device: str | torch.device = "cpu"):
    """The image decoder of this checkpoint (``decode(codes, height, width)``, ``codebook``)."""
    from ..models.chameleon_vq import load_chameleon_vq

    return load_chameleon_vq(directory, device=device)


def sampling(directory: Path, config: dict) -> dict:
    """The official defaults of the checkpoint's layout: Lumina-mGPT's or Anole's."""
    return dict(LUMINA_SAMPLING if is_lumina(config) else DEFAULT_SAMPLING)


class Chameleon(Family):
    """Anole and Lumina-mGPT: prompts need only the tokenizer; CFG rows from the model's unconditional
    rule, built from config.json's ids."""

    name = NAME
    conditioning = "text"
    prompt_processor = PROMPT_PROCESSOR
    default_sampling = DEFAULT_SAMPLING
    matches = staticmethod(matches)
    build = staticmethod(build)
    sampling = staticmethod(sampling)
    encode = staticmethod(encode)
    negative = staticmethod(negative)
    image_decoder = staticmethod(load_vq)

    def native_grid(self, directory: Path, config: dict | None) -> tuple[int, int]:
        return native_grid(config or {}, directory)


FAMILY = Chameleon()
