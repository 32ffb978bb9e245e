"""LlamaGen GPT (Sun et al. 2024), compatible with the official c2i and t2i checkpoints.

Llama blocks (RMSNorm, fused wqkv, SwiGLU) with the official 2D RoPE: per head, the first half of
the rotary pairs rotates with the grid row, the second half with the column, pairs interleaved
(x[2i], x[2i+1]), frequencies base^(-4i/head_dim). The condition prefix has cos = sin = 0, so its
queries and keys are zeroed: official checkpoints were trained that way.

- ``LlamaGen`` (c2i): the condition is a class embedding; row ``num_classes`` of the table is the
  null class used for CFG.
- ``LlamaGenT2I`` (t2i): the condition is a caption of up to ``cls_token_num`` (120) flan-t5 encoder
  states projected by an MLP; the learnt ``uncond_embedding`` is the null caption (see its docstring
  for the official layout and why specvis's per-row prefix computes the same logits).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn

from .base import Captions, Layout
from .checkpoint import build_from_state_dict, load_pretrained, read_state_dict, save_pretrained
from .decoder import CachedStack, DrafterParts, Float32Rope, RMSNorm, TransformerBlock, apply_rope  # noqa: F401 (re-exported)


@dataclass
class TransformerConfig:
    """The class-conditional LlamaGen block stack, shared by ``LlamaGenConfig`` and the continuous-token
    ``ContinuousARConfig``. Field names follow the official ``ModelArgs`` (gpt.py)."""

    dim: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int | None = None
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    initializer_range: float = 0.02
    num_classes: int = 1000
    class_dropout_prob: float = 0.1
    token_dropout_p: float = 0.0
    resid_dropout_p: float = 0.0
    ffn_dropout_p: float = 0.0

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        for field_name in ("dim", "n_layer", "n_head", "n_kv_head", "num_classes"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}.{field_name} must be an integer >= 1, got {value!r}")
        if self.dim % self.n_head or (self.dim // self.n_head) % 4:
            raise ValueError(f"{name}.dim / n_head must be a multiple of 4, got {self.dim}/{self.n_head}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"{name}.n_head must be a multiple of n_kv_head, got {self.n_head}/{self.n_kv_head}")
        if not 0.0 <= self.class_dropout_prob < 1.0:
            raise ValueError(f"{name}.class_dropout_prob must be in [0, 1), got {self.class_dropout_prob}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def ffn_hidden(self) -> int:
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return -(-hidden // self.multiple_of) * self.multiple_of


@dataclass
class LlamaGenConfig(TransformerConfig):
    """LlamaGen c2i: the transformer plus the image vocabulary and the (square) token grid."""

    vocab_size: int = 16384
    cls_token_num: int = 1
    block_size: int = 256

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_stream()
        if self.cls_token_num != 1:
            raise ValueError(f"LlamaGenConfig.cls_token_num must be 1 for class conditioning, got {self.cls_token_num}")


    def _check_stream(self) -> None:
        name = type(self).__name__
        for field_name in ("vocab_size", "block_size"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"{name}.{field_name} must be >= 1, got {getattr(self, field_name)}")
        side = math.isqrt(self.block_size)
        if side * side != self.block_size:
            raise ValueError(f"{name}.block_size must be a square grid size, got {self.block_size}")


@dataclass
class LlamaGenT2IConfig(LlamaGenConfig):
    """LlamaGen t2i: a caption prefix of up to ``cls_token_num`` text-encoder states of width
    ``caption_dim`` (flan-t5-xl: 120 x 2048). ``num_classes``/``class_dropout_prob`` are unused."""

    caption_dim: int = 2048
    cls_token_num: int = 120

    def __post_init__(self) -> None:
        TransformerConfig.__post_init__(self)
        self._check_stream()
        for field_name in ("caption_dim", "cls_token_num"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LlamaGenT2IConfig.{field_name} must be an integer >= 1, got {value!r}")


def rope_2d_table(grid: int, head_dim: int, base: float, prefix: int) -> torch.Tensor:
    """(prefix + grid*grid, head_dim/2, 2) cos/sin table; prefix rows are zero (official quirk)."""
    quarter = head_dim // 4
    freqs = 1.0 / (base ** (torch.arange(0, 2 * quarter, 2).float() / (head_dim // 2)))
    t = torch.arange(grid).float()
    f = torch.outer(t, freqs)  # (grid, quarter)
    rows = f[:, None, :].expand(grid, grid, quarter)
    cols = f[None, :, :].expand(grid, grid, quarter)
    angles = torch.cat([rows, cols], dim=-1).reshape(grid * grid, 2 * quarter)
    table = torch.stack([angles.cos(), angles.sin()], dim=-1)
    return torch.cat([torch.zeros(prefix, 2 * quarter, 2), table])


class LabelEmbedder(nn.Module):
    """Class embedding; the extra last row is the null class (CFG)."""

    def __init__(self, num_classes: int, dim: int, dropout_prob: float) -> None:
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), dim)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        return self.embedding_table(labels)


class CaptionEmbedder(nn.Module):
    """LlamaGen t2i's condition: ``cap_proj`` (Linear, tanh-GELU, Linear; no biases) from the text
    encoder's width to the model's, and ``uncond_embedding`` (cls_token_num, caption_dim), the learnt
    null caption (a persistent buffer in the official files)."""

    def __init__(self, caption_dim: int, dim: int, token_num: int) -> None:
        super().__init__()
        self.cap_proj = nn.Sequential()
        self.cap_proj.add_module("fc1", nn.Linear(caption_dim, dim, bias=False))
        self.cap_proj.add_module("act", nn.GELU(approximate="tanh"))
        self.cap_proj.add_module("fc2", nn.Linear(dim, dim, bias=False))
        self.register_buffer("uncond_embedding", torch.randn(token_num, caption_dim) / caption_dim ** 0.5)

    def forward(self, captions: torch.Tensor) -> torch.Tensor:
        return self.cap_proj(captions)


class LlamaGen(Float32Rope, CachedStack, nn.Module):
    """Class-conditional LlamaGen GPT implementing ``CachedTokenModel`` (see models/base.py)."""

    config_class = LlamaGenConfig

    def __init__(self, config: LlamaGenConfig) -> None:
        super().__init__()
        self.config = cfg = config
        side = math.isqrt(cfg.block_size)
        self.layout = Layout(side, side, cfg.vocab_size)
        self.null_condition = cfg.num_classes
        self.num_conditions = cfg.num_classes
        self.prefix_len = self.max_prefix = cfg.cls_token_num
        self.cls_embedding = self.make_condition_embedder(cfg)
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.tok_dropout = nn.Dropout(cfg.token_dropout_p)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.register_buffer("rope", rope_2d_table(side, cfg.head_dim, cfg.rope_base, self.prefix_len), persistent=False)
        self.apply(self._init_weights)

    def make_condition_embedder(self, cfg: LlamaGenConfig) -> nn.Module:
        """``cls_embedding``: the class table (c2i)."""
        return LabelEmbedder(cfg.num_classes, cfg.dim, cfg.class_dropout_prob)

    def _init_weights(self, m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=self.config.initializer_range)

    @property
    def hidden_size(self) -> int:
        return self.config.dim

    # ---- teacher-forced (training, exactness enumeration) ----
    def logits(self, conditions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Raw logits (B, t+1, V): position 0 follows the condition, position i+1 follows token i."""
        logits, _ = self.forward_train(conditions, tokens)
        return logits

    def forward_train(self, conditions: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal forward over [condition, tokens]; returns (logits (B, t+1, V), hidden (B, t+1, D))."""
        x = torch.cat([self.cls_embedding(conditions)[:, None], self.tok_embeddings(tokens)], dim=1)
        x = self.tok_dropout(x)
        rope = self.rope[: x.shape[1]][None].expand(x.shape[0], -1, -1, -1)
        for layer in self.layers:
            x = layer(x, rope, None)
        h = self.norm(x)
        return self.output(h).float(), h

    # ---- cached decoding (CachedTokenModel, via CachedStack) ----
    def cache_shape(self) -> tuple[int, int, int]:
        return self.config.n_layer, self.config.n_kv_head, self.config.head_dim

    def rope_at(self, index: torch.Tensor) -> torch.Tensor:
        return self.rope[index]

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.output(h)

    def drafter_parts(self) -> DrafterParts:
        """An EAGLE head scores with ``output``, keeps its own copy of the token table (EAGLE/LANTERN
        files carry it) and places tokens on the 2D grid table."""
        cfg = self.config
        return DrafterParts(self.output, self.tok_embeddings, True, "grid", cfg.rope_base, cfg.block_size)

    @torch.no_grad()
    def prefill(self, conditions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = torch.full_like(conditions, self.prefix_len)
        return self._prefill_embedded(self.cls_embedding(conditions)[:, None], lengths)

    @torch.no_grad()
    def forward_tokens(self, tokens: torch.Tensor, positions: torch.Tensor,
                       tree_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self._forward_embedded(self.tok_embeddings(tokens), positions, tree_mask)

    # ---- official checkpoints ----
    @classmethod
    def from_checkpoint(cls, path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                        **overrides) -> "LlamaGen":
        """Load an official LlamaGen c2i checkpoint (``{"model": sd}``, ``{"ema": sd}`` or a bare state
        dict), memory-mapped and streamed into ``dtype`` on ``device`` (``models.loading``).

        The config is inferred from the weight shapes; ``n_head`` defaults to dim // 64 (all official
        sizes but GPT-3B, whose 3200-wide model has 32 heads) and ``block_size`` comes from a stored
        ``freqs_cis`` when present, else 256. Any field can be overridden by keyword.
        """
        sd = read_state_dict(path)
        try:
            shapes = trunk_shapes(sd)
            table = sd["cls_embedding.embedding_table.weight"].shape[0]
        except (KeyError, ValueError) as e:
            if "cls_embedding.cap_proj.fc1.weight" in sd:
                raise ValueError(f"{path}: a LlamaGen t2i checkpoint, not c2i: load it with LlamaGenT2I.from_checkpoint "
                                 "or sv.load(its directory)") from None
            raise ValueError(f"{path}: not a LlamaGen c2i checkpoint (missing or malformed key {e})") from None
        class_dropout = overrides.pop("class_dropout_prob", 0.1)
        return _load_official(cls, LlamaGenConfig, sd, path, shapes, overrides, 1, (device, dtype),
                              num_classes=table - 1 if class_dropout > 0 else table, class_dropout_prob=class_dropout)

    def config_dict(self) -> dict:
        return asdict(self.config)

    @classmethod
    def from_config_dict(cls, d: dict) -> "LlamaGen":
        names = {f.name for f in fields(cls.config_class)}
        return cls(cls.config_class(**{k: v for k, v in d.items() if k in names}))

    def save_pretrained(self, directory: str | Path, dtype: torch.dtype | None = None) -> None:
        """``config.json`` + ``model.safetensors`` (e.g. fp16 for the shipped bundle)."""
        save_pretrained(self, self.config_dict(), directory, dtype)

    @classmethod
    def from_pretrained(cls, directory: str | Path, *, device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32) -> "LlamaGen":
        """A ``save_pretrained`` directory, streamed into ``dtype`` on ``device`` (``models.loading``)."""
        return load_pretrained(cls.from_config_dict, directory, dtype=dtype, device=device)


class LlamaGenT2I(LlamaGen):
    """Text-conditioned LlamaGen (official t2i checkpoints: GPT-XL stage I at 256 px, stage II at 512 px)
    implementing ``CachedTokenModel`` with ``Captions`` conditions (flan-t5 encoder states).

    The official layout (``sample_t2i.py`` and ``generate.py``): a caption of n valid T5 states out of
    T = ``cls_token_num`` (120) is moved to the end of the prefix (sequence positions T-n .. T-1, zeros
    before), and the mask is causal AND "key is a valid caption token", with the diagonal forced on (a
    padding query sees only itself). Image token j sits at sequence position T + j with RoPE row T + j
    of the table (grid position j). The unconditional row is ``uncond_embedding`` (T, C) under the
    same mask, so its last n rows are attended.

    specvis puts the n valid states first, in slots 0 .. n-1 of its per-row cache (prefix length n),
    and image token j in slot n + j, but keeps RoPE index T + j (``stream_rope_index``). The logits are
    the official ones because:

    1. Prefix rows of the RoPE table are cos = sin = 0, so every caption query and key is the zero
       vector: the score between any query and a caption key is 0 whatever their positions, and a
       caption token's slot carries no information except through the mask.
    2. Under both masks the k-th valid caption token attends to exactly caption tokens 0..k, and image
       token j to all n caption tokens and image tokens 0..j, with the same scores (image RoPE index
       T + j in both). Attention is a softmax over a set of (score, value) pairs, blind to where the
       pairs sit, and every other step is per token, so by induction over layers every hidden state
       is the same. Image token 0 follows the last valid caption token: official position T-1,
       specvis slot n-1.
    3. Padding is never attended: official padding keys are masked for every other query; specvis's
       padding slots lie past the row's committed length (and image tokens overwrite them).

    Unconditional rows (``Captions.null``) take the last n rows of this model's own
    ``uncond_embedding``, n being the conditional row's length, as the official CFG does."""

    config_class = LlamaGenT2IConfig
    null_condition = None
    num_conditions = None

    def __init__(self, config: LlamaGenT2IConfig) -> None:
        super().__init__(config)
        self.null_condition = self.num_conditions = None  # text-conditioned: no class ids

    def make_condition_embedder(self, cfg: LlamaGenT2IConfig) -> nn.Module:
        """``cls_embedding``: the caption projection and the null caption (t2i)."""
        return CaptionEmbedder(cfg.caption_dim, cfg.dim, cfg.cls_token_num)

    def _check_captions(self, captions) -> None:
        if not isinstance(captions, Captions):
            raise ValueError(f"LlamaGen t2i is conditioned on Captions (text-encoder states), got {type(captions).__name__}")
        C = captions.embeddings.shape[-1]
        if C != self.config.caption_dim:
            raise ValueError(f"caption embeddings are {C} wide; this model takes {self.config.caption_dim} (its text encoder's width)")
        if captions.embeddings.shape[1] > self.config.cls_token_num:
            raise ValueError(f"captions of {captions.embeddings.shape[1]} tokens; this model takes at most {self.config.cls_token_num}")

    def embed_captions(self, captions: Captions) -> torch.Tensor:
        """(R, P, dim): ``cap_proj`` of each row's states; null rows use the last ``lengths[r]`` rows of
        ``uncond_embedding`` (the rows the official left-padded mask keeps)."""
        self._check_captions(captions)
        table = self.cls_embedding.uncond_embedding
        T, P = table.shape[0], captions.embeddings.shape[1]
        lengths = captions.lengths.to(table.device)
        idx = (T - lengths[:, None] + torch.arange(P, device=table.device)).clamp(0, T - 1)
        null = captions.null_mask().to(table.device)[:, None, None]
        emb = torch.where(null, table[idx], captions.embeddings.to(device=table.device, dtype=table.dtype))
        return self.cls_embedding(emb.to(self.cls_embedding.cap_proj.fc1.weight.dtype))

    def unconditional(self, captions: Captions) -> Captions:
        """The official CFG row of each caption: the null caption with the caption's valid length."""
        return Captions.null_rows(captions.lengths, self.config.caption_dim)

    def stream_rope_index(self, positions: torch.Tensor) -> torch.Tensor:
        """The official table row of image token j: cls_token_num + j, whatever the caption length."""
        return self.prefix_len + positions.clamp(0, self.layout.stream_len - 1)

    @torch.no_grad()
    def prefill(self, captions: Captions) -> tuple[torch.Tensor, torch.Tensor]:
        return self._prefill_embedded(self.embed_captions(captions), captions.lengths.to(self.prefix_lengths.device))

    def forward_train(self, captions: Captions, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal forward of each row over [its n valid caption states, tokens] (no cache): logits
        (B, t+1, V) and hidden (B, t+1, D) after the last caption state and after each token."""
        x_all = self.embed_captions(captions)
        logits, hidden = [], []
        t = tokens.shape[1]
        for r in range(tokens.shape[0]):
            n = int(captions.lengths[r])
            x = torch.cat([x_all[r, :n], self.tok_embeddings(tokens[r])])[None]
            x = self.tok_dropout(x)
            rope = torch.cat([self.rope.new_zeros(n, *self.rope.shape[1:]), self.rope[self.prefix_len: self.prefix_len + t]])
            for layer in self.layers:
                x = layer(x, rope[None], None)
            h = self.norm(x)[0, n - 1:]
            logits.append(self.output(h).float())
            hidden.append(h)
        return torch.stack(logits), torch.stack(hidden)

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                        **overrides) -> "LlamaGenT2I":
        """Load an official LlamaGen t2i checkpoint (``{"model": sd}`` as released, ``{"ema": sd}`` or a
        bare state dict). Sizes come from the weight shapes (``caption_dim`` from ``cap_proj.fc1``,
        ``cls_token_num`` from ``uncond_embedding``); ``n_head`` defaults to dim // 64 (GPT-XL: 20).
        The file does not say the grid: pass ``block_size`` (256 px: 16x16 = 256; 512 px: 1024); a
        stored ``freqs_cis`` is used as a hint, else 256."""
        sd = read_state_dict(path)
        try:
            shapes = trunk_shapes(sd)
            proj_dim, caption_dim = sd["cls_embedding.cap_proj.fc1.weight"].shape
            token_num = sd["cls_embedding.uncond_embedding"].shape[0]
        except (KeyError, ValueError) as e:
            if "cls_embedding.embedding_table.weight" in sd:
                raise ValueError(f"{path}: a LlamaGen c2i (class-conditional) checkpoint, not t2i") from None
            raise ValueError(f"{path}: not a LlamaGen t2i checkpoint (missing or malformed key {e})") from None
        if proj_dim != shapes[1]:
            raise ValueError(f"{path}: cls_embedding.cap_proj.fc1 maps to {proj_dim}, not the model width {shapes[1]}")
        return _load_official(cls, LlamaGenT2IConfig, sd, path, shapes, overrides, token_num, (device, dtype),
                              caption_dim=caption_dim, cls_token_num=token_num)


def trunk_shapes(sd: dict[str, torch.Tensor]) -> tuple[int, int, int, int, int]:
    """(vocab, dim, layers, feed-forward width, wqkv rows) read from an official LlamaGen state dict
    (KeyError or ValueError when it is not one)."""
    vocab, dim = sd["tok_embeddings.weight"].shape
    n_layer = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("layers."))
    return (vocab, dim, n_layer, sd["layers.0.feed_forward.w1.weight"].shape[0],
            sd["layers.0.attention.wqkv.weight"].shape[0])


def _load_official(cls, config_cls, sd: dict[str, torch.Tensor], path, shapes: tuple[int, int, int, int, int],
                   overrides: dict, token_num: int, where_to: tuple, **family):
    """``cls`` with the config the trunk shapes imply, the family's fields and the caller's overrides,
    its weights streamed strictly into ``where_to`` = (device, dtype). ``n_head`` defaults to dim // 64 (GPT-3B, 3200 wide: 32); the grid
    (``block_size``) to 256, or a stored ``freqs_cis`` (not saved by the official code) minus the
    prefix tokens; the feed-forward width must follow from dim and ``multiple_of``."""
    vocab, dim, n_layer, hidden, qkv = shapes
    n_head = overrides.pop("n_head", 32 if dim == 3200 else max(dim // 64, 1))
    block_size = 256
    if "freqs_cis" in sd:
        block_size = sd["freqs_cis"].shape[0] - overrides.get("cls_token_num", token_num)
    cfg = config_cls(**{"vocab_size": vocab, "dim": dim, "n_layer": n_layer, "n_head": n_head,
                        "n_kv_head": (qkv // (dim // n_head) - n_head) // 2, "block_size": block_size,
                        "multiple_of": hidden, **family, **overrides})
    if cfg.ffn_hidden != hidden:
        raise ValueError(f"{path}: feed-forward width {hidden} does not follow from dim {dim}; pass multiple_of/ffn_dim_multiplier")
    device, dtype = where_to
    return build_from_state_dict(lambda: cls(cfg), sd, str(path), dtype=dtype, device=device,
                                 skip=lambda k: k == "freqs_cis")
