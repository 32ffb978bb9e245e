"""LlamaGen text-to-image (FoundationVision/LlamaGen t2i) from its official release files.

The release has no ``config.json``: a GPT checkpoint (``t2i_XL_stage1_256.pt``: GPT-XL at 256 px, a
16x16 grid; ``t2i_XL_stage2_512.pt``: 512 px, 32x32), a VQ tokenizer (``vq_ds16_t2i.pt``) and the
text encoder, ``google/flan-t5-xl`` in the Hugging Face layout. A directory loads when it holds:

    DIR/
      t2i_<anything>_<image size>.pt   the GPT, ``{"model": state dict}`` (exactly one ``t2i_*.pt``)
      vq_ds16_t2i.pt                   the VQ (else exactly one ``vq_*.pt``)
      t5-ckpt/flan-t5-xl/              flan-t5 (config.json, tokenizer, weights); also ``flan-t5-xl/``
                                       or ``t5-ckpt/`` itself, the official scripts' ``--t5-path``
      specvis.json                     optional: {"gpt": "file.pt", "vq": "file.pt", "t5": "dir",
                                       "image_size": 256, "downsample": 16}, paths relative to DIR

i.e. the official ``pretrained_models/`` folder with one t2i GPT in it (or a specvis.json naming
one). The grid is image_size / downsample: ``image_size`` from specvis.json, else the number that
ends the GPT's file name; ``downsample`` 16 (the ds16 VQ) unless specvis.json says otherwise. A draft
directory (``sv.load(dir, draft=...)``) needs only its GPT file: captions are encoded once, by the
target's flan-t5 (the draft must take the same caption width and length), and each model's
unconditional rows are its own null caption.

Prompts follow ``language/t5.py`` and ``autoregressive/sample/sample_t2i.py``: the text is cleaned,
tokenised to at most ``cls_token_num`` (120) tokens with ``</s>``, padded to 120, and the last hidden
state of ``T5EncoderModel`` is the caption; its valid tokens condition the GPT (``LlamaGenT2I``
explains why specvis's valid-first prefix gives the official left-padded logits). A ``list[int]``
prompt is flan-t5 input ids (``</s>`` included), encoded the same way. Text cleaning: the official
``clean_caption`` applied twice (ftfy, BeautifulSoup, ~40 regular expressions for URLs, HTML, ids, file
names, sizes; ``specvis.families.llamagen_caption``, which needs ftfy and beautifulsoup4). CFG: the unconditional row is the model's ``uncond_embedding`` under the caption's mask, guided =
u + s (c - u) on raw logits (docs/design/api.md's formula); official defaults cfg 7.5, top-k 1000, temperature 1.
The text encoder is loaded in the GPT's dtype, on its device (the official script runs both in bf16).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ..checks import one_line
from ..models.base import Captions
from .base import OwnFormatFamily, display_name
from .hf import read_json
from .llamagen_caption import clean_caption
from ..sampling import Sampling

NAME = "llamagen-t2i"
DEFAULT_SAMPLING = {"cfg_scale": 7.5, "top_k": 1000, "temperature": 1.0}  # sample_t2i.py
MANIFEST = "specvis.json"
VQ_NAME = "vq_ds16_t2i.pt"
T5_DIRS = ("t5-ckpt/flan-t5-xl", "flan-t5-xl", "t5-ckpt")
DOWNSAMPLE = 16


def matches(config: dict) -> bool:
    return False  # no config.json: recognised by its files (matches_dir)


def matches_dir(directory: Path) -> bool:
    """A specvis.json naming this family or a GPT file, or a ``t2i_*.pt`` file with no config.json."""
    if (directory / MANIFEST).is_file():
        m = _manifest(directory)
        return m.get("family", NAME) == NAME and ("gpt" in m or bool(_gpt_candidates(directory)))
    return not (directory / "config.json").exists() and bool(_gpt_candidates(directory))


def _manifest(directory: Path) -> dict:
    path = directory / MANIFEST
    return read_json(path) if path.is_file() else {}


def _gpt_candidates(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("t2i_*.pt") if p.is_file())


def _named(directory: Path, manifest: dict, key: str) -> Path | None:
    if key not in manifest:
        return None
    if not isinstance(manifest[key], str) or not manifest[key]:
        raise ValueError(f"{directory / MANIFEST}: {key!r} must be a path relative to {directory}")
    path = directory / manifest[key]
    if not path.exists():
        raise ValueError(f"{directory / MANIFEST} names {key} {manifest[key]!r}, which does not exist in {directory}")
    return path


def gpt_file(directory: Path) -> Path:
    """The GPT checkpoint: specvis.json's ``gpt``, else the one ``t2i_*.pt`` file."""
    named = _named(directory, _manifest(directory), "gpt")
    if named is not None:
        return named
    found = _gpt_candidates(directory)
    if len(found) != 1:
        what = "no t2i_*.pt GPT file" if not found else f"{len(found)} t2i GPT files ({', '.join(p.name for p in found)})"
        raise ValueError(f"{directory}: {what}; name the one to load in {MANIFEST}: {{\"gpt\": \"t2i_XL_stage1_256.pt\"}}")
    return found[0]


def vq_file(directory: Path) -> Path:
    """The VQ checkpoint: specvis.json's ``vq``, else ``vq_ds16_t2i.pt``, else the one ``vq_*.pt`` file."""
    named = _named(directory, _manifest(directory), "vq")
    if named is not None:
        return named
    if (directory / VQ_NAME).is_file():
        return directory / VQ_NAME
    found = sorted(directory.glob("vq_*.pt"))
    if len(found) != 1:
        raise ValueError(f"{directory}: missing the VQ tokenizer {VQ_NAME} (or name it in {MANIFEST}: {{\"vq\": \"file.pt\"}})")
    return found[0]


def t5_dir(directory: Path) -> Path:
    """The flan-t5 directory (Hugging Face layout): specvis.json's ``t5``, else t5-ckpt/flan-t5-xl,
    flan-t5-xl or t5-ckpt."""
    named = _named(directory, _manifest(directory), "t5")
    candidates = [named] if named is not None else [directory / d for d in T5_DIRS]
    for d in candidates:
        if (d / "config.json").is_file():
            return d
    where = named if named is not None else directory / T5_DIRS[0]
    raise ValueError(f"{directory}: missing the flan-t5 text encoder ({where}/config.json); put google/flan-t5-xl "
                     f"there in the Hugging Face layout (or name its directory in {MANIFEST}: {{\"t5\": \"dir\"}})")


def native_grid(directory: Path, gpt: Path) -> tuple[int, int]:
    m = _manifest(directory)
    size = m.get("image_size")
    if size is None:
        found = re.search(r"_(\d+)\.pt$", gpt.name)
        if not found:
            raise ValueError(f"{gpt}: cannot tell the image size (official names end in _256.pt or _512.pt); "
                             f"give it in {directory / MANIFEST}: {{\"image_size\": 256}}")
        size = int(found.group(1))
    down = m.get("downsample", DOWNSAMPLE)
    for key, v in (("image_size", size), ("downsample", down)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{directory}: {key} must be a positive integer, got {v!r}")
    if size % down:
        raise ValueError(f"{directory}: image size {size} is not a multiple of the VQ downsampling {down}")
    return size // down, size // down


def load_decoder(directory: Path, height: int | None = None, width: int | None = None, *,
                 device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None):
    """The t2i GPT of ``directory`` (``LlamaGenT2I``, eval) on its native grid, memory-mapped and
    streamed into ``dtype`` (None: ``models.loading.default_dtype`` of the stored one) on ``device``."""
    from ..models.checkpoint import read_state_dict
    from ..models.llamagen import LlamaGenT2I
    from ..models.loading import resolve, state_dict_dtype

    gpt = gpt_file(directory)
    H, W = native_grid(directory, gpt)
    if (height is not None and height != H) or (width is not None and width != W):
        raise ValueError(f"{directory}: LlamaGen t2i has a fixed {H}x{W} grid (its 2D RoPE table), got {height}x{width}")
    dt, why = resolve(dtype, state_dict_dtype(read_state_dict(gpt)), device)
    model = LlamaGenT2I.from_checkpoint(gpt, block_size=H * W, device=device, dtype=dt)
    model.dtype_source = why
    return model


def pipeline_fields(name, directory: Path, draft=None, drafter=None, *, device: str | torch.device = "cpu",
                    dtype: str | torch.dtype | None = None) -> dict:
    """The ``Pipeline`` fields (its keyword arguments) of captions: the target's GPT now (and the draft's, in the target's dtype); flan-t5
    and the VQ checked now, loaded on first use (flan-t5 in the GPT's dtype, on its device)."""
    from ..hub import resolve_model_dir

    directory = Path(directory)
    target = load_decoder(directory, device=device, dtype=dtype)
    t5_dir(directory)  # flan-t5 and the VQ present, or a one-line error before any generation
    vq_file(directory)
    draft_model = draft_dir = None
    if draft is not None:
        draft_dir = Path(resolve_model_dir(str(draft)))
        ours, config = FAMILY.recognise(draft_dir)
        if not ours:
            raise ValueError(f"draft {draft_dir} (model_type {config.get('model_type')!r}) is not of the family of "
                             f"{directory} ({NAME}): the draft must be a LlamaGen t2i checkpoint")
        draft_model = load_decoder(draft_dir, device=device, dtype=next(target.parameters()).dtype)
        check_draft(draft_model, target, draft_dir, directory)
    drafter_model = None
    if drafter is not None:
        from ..models.drafter import load_drafter

        drafter_model = load_drafter(resolve_model_dir(str(drafter)), target)
    grid = (target.layout.height, target.layout.width)
    extras = {"grid": grid, "family": NAME, "directory": str(directory), "dtype_source": target.dtype_source}
    if draft is not None:
        extras["draft"] = display_name(draft, draft_dir)
    return dict(name=display_name(name, directory), target=target, tokenizer=None, draft=draft_model,
                drafter=drafter_model, directory=directory, family=FAMILY,
                default_sampling=Sampling(**DEFAULT_SAMPLING), extras=extras)


def check_draft(draft, target, draft_dir, directory) -> None:
    """The draft reads the target's captions and proposes its image tokens: same caption width and
    length, same codebook, same grid."""
    d, t = draft.config, target.config
    if (d.caption_dim, d.cls_token_num) != (t.caption_dim, t.cls_token_num):
        raise ValueError(f"draft {draft_dir}: captions of {d.cls_token_num} x {d.caption_dim} differ from {directory}'s "
                         f"{t.cls_token_num} x {t.caption_dim}: the draft must take the same text encoder's states")
    if draft.layout != target.layout:
        raise ValueError(f"draft {draft_dir}: {draft.layout.height}x{draft.layout.width} grid of {draft.layout.vocab_size} "
                         f"codes differs from {directory}'s {target.layout.height}x{target.layout.width} of {target.layout.vocab_size}")


def load_vq(directory: Path, device: str | torch.device = "cpu"):
    """The t2i VQ (``VQModel.from_checkpoint``: LlamaGen's VQ file format)."""
    from ..models.vq import VQModel

    return VQModel.from_checkpoint(vq_file(Path(directory)), device=device)


def clean_text(text: str) -> str:
    """The caption as the official ``T5Embedder.text_preprocessing`` cleans it (``llamagen_caption``)."""
    return clean_caption(text)


class CaptionEncoder:
    """The flan-t5 tokenizer and encoder (transformers, imported here) turning prompts into ``Captions``
    as ``language/t5.py`` does: at most ``max_length`` tokens with ``</s>``, padded to ``max_length``,
    attention mask over the valid tokens, last hidden state."""

    def __init__(self, directory: Path, max_length: int, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        try:
            from transformers import AutoTokenizer, T5EncoderModel
        except ImportError:
            raise ValueError("text prompts need transformers: pip install specvis[hf]") from None
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(directory))
            # transformers builds it on the meta device and streams the weights into ``dtype``
            self.model = T5EncoderModel.from_pretrained(str(directory), dtype=dtype).to(device).eval()
        except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, KeyError ...
            raise ValueError(f"{directory}: cannot load the flan-t5 text encoder ({one_line(exc)})") from None
        self.max_length = max_length
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    def ids(self, texts: list[str]) -> list[list[int]]:
        out = self.tokenizer([clean_text(t) for t in texts], max_length=self.max_length, truncation=True,
                             add_special_tokens=True)["input_ids"]
        return [list(map(int, r)) for r in out]

    @torch.no_grad()
    def encode(self, rows: list[list[int]], device: torch.device, dtype: torch.dtype) -> Captions:
        R, T = len(rows), self.max_length
        ids = torch.full((R, T), self.pad_id, dtype=torch.long)
        mask = torch.zeros(R, T, dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, : len(row)] = torch.tensor(row)
            mask[r, : len(row)] = 1
        self.model.to(device=device, dtype=dtype)
        h = self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
        return Captions.of([h[r, : len(row)] for r, row in enumerate(rows)])


class LlamaGenT2IFamily(OwnFormatFamily):
    """LlamaGen t2i: prompts become captions, the states of its flan-t5 (``CaptionEncoder``); its own
    file format (``.pt`` files, no config.json); a fixed grid (its 2D RoPE table). sample_t2i.py adds
    no suffix to its prompts; the CFG rows are the negative prompts' captions or the model's null
    caption of the same valid length (each model uses its own table)."""

    name = NAME
    conditioning = "caption"
    fixed_grid = True
    default_sampling = DEFAULT_SAMPLING
    matches_dir = staticmethod(matches_dir)
    check_draft = staticmethod(check_draft)
    image_decoder = staticmethod(load_vq)

    read_model = staticmethod(load_decoder)
    read_fields = staticmethod(pipeline_fields)

    def native_grid(self, directory: Path, config: dict | None) -> tuple[int, int]:
        return native_grid(Path(directory), gpt_file(Path(directory)))

    def processor(self, directory: Path, target, device: torch.device, dtype: torch.dtype) -> CaptionEncoder:
        """The checkpoint's flan-t5 (in the GPT's dtype, on its device), captions of ``cls_token_num`` tokens."""
        return CaptionEncoder(t5_dir(Path(directory)), target.config.cls_token_num, device, dtype)

    def encode(self, processor: CaptionEncoder, texts: list[str], height: int, width: int, model=None) -> list[list[int]]:
        """flan-t5 input ids of the cleaned texts (``CaptionEncoder.ids``)."""
        return processor.ids(texts)

    def check_ids(self, pipe, rows: list[list[int]], what: str) -> None:
        """At most ``cls_token_num`` flan-t5 ids per row, each in flan-t5's vocabulary."""
        enc = pipe.processor
        for i, row in enumerate(rows):
            if len(row) > enc.max_length:
                raise ValueError(f"{what}[{i}] is {len(row)} flan-t5 tokens; the model takes at most {enc.max_length}")
            if not all(0 <= t < enc.vocab_size for t in row):
                raise ValueError(f"{what}[{i}]: token ids must be in 0..{enc.vocab_size - 1}")

    def prefix(self, pipe, rows: list[list[int]]) -> Captions:
        """``Captions`` of flan-t5 ids: the encoder's last hidden states of each row's valid tokens."""
        return pipe.processor.encode(rows, pipe.device, pipe.dtype)

    def unconditional(self, pipe, cond: Captions, height: int, width: int) -> Captions:
        """The official null caption, same valid length (each model uses its own table)."""
        return pipe.target.unconditional(cond)

    def decode_images(self, decoder, codes: torch.Tensor, height: int, width: int) -> torch.Tensor:
        return decoder.decode(codes, (height, width))  # VQModel.decode(codes, size)


FAMILY = LlamaGenT2IFamily()
