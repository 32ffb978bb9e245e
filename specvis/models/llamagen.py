"""LlamaGen class-conditional GPT (Sun et al. 2024), compatible with the official c2i checkpoints.

Llama blocks (RMSNorm, fused wqkv, SwiGLU) with the official 2D RoPE: per head, the first half of
the rotary pairs rotates with the grid row, the second half with the column, pairs interleaved
(x[2i], x[2i+1]), frequencies base^(-4i/head_dim). The condition prefix has cos = sin = 0, so its
queries and keys are zeroed: official checkpoints were trained that way. The condition is a class
embedding; row ``num_classes`` of the table is the null class used for CFG.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn

from .base import Layout
from .checkpoint import load_strict, read_pretrained, read_state_dict, save_pretrained
from .decoder import CachedStack, RMSNorm, TransformerBlock, apply_rope  # noqa: F401 (re-exported)


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
        for name in ("vocab_size", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"LlamaGenConfig.{name} must be >= 1, got {getattr(self, name)}")
        side = math.isqrt(self.block_size)
        if side * side != self.block_size:
            raise ValueError(f"LlamaGenConfig.block_size must be a square grid size, got {self.block_size}")
        if self.cls_token_num != 1:
            raise ValueError(f"LlamaGenConfig.cls_token_num must be 1 for class conditioning, got {self.cls_token_num}")


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


class LlamaGen(CachedStack, nn.Module):
    """Class-conditional LlamaGen GPT implementing ``CachedTokenModel`` (see models/base.py)."""

    def __init__(self, config: LlamaGenConfig) -> None:
        super().__init__()
        self.config = cfg = config
        side = math.isqrt(cfg.block_size)
        self.layout = Layout(side, side, cfg.vocab_size)
        self.null_condition = cfg.num_classes
        self.num_conditions = cfg.num_classes
        self.prefix_len = self.max_prefix = cfg.cls_token_num
        self.cls_embedding = LabelEmbedder(cfg.num_classes, cfg.dim, cfg.class_dropout_prob)
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.tok_dropout = nn.Dropout(cfg.token_dropout_p)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.register_buffer("rope", rope_2d_table(side, cfg.head_dim, cfg.rope_base, self.prefix_len), persistent=False)
        self.apply(self._init_weights)

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
    def from_checkpoint(cls, path: str | Path, **overrides) -> "LlamaGen":
        """Load an official LlamaGen c2i checkpoint (``{"model": sd}``, ``{"ema": sd}`` or a bare state dict).

        The config is inferred from the weight shapes; ``n_head`` defaults to dim // 64 (all official
        sizes but GPT-3B, whose 3200-wide model has 32 heads) and ``block_size`` comes from a stored
        ``freqs_cis`` when present, else 256. Any field can be overridden by keyword.
        """
        sd = read_state_dict(path)
        try:
            vocab, dim = sd["tok_embeddings.weight"].shape
            n_layer = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("layers."))
            hidden = sd["layers.0.feed_forward.w1.weight"].shape[0]
            qkv = sd["layers.0.attention.wqkv.weight"].shape[0]
            table = sd["cls_embedding.embedding_table.weight"].shape[0]
        except (KeyError, ValueError) as e:
            raise ValueError(f"{path}: not a LlamaGen c2i checkpoint (missing or malformed key {e})") from None
        n_head = overrides.pop("n_head", 32 if dim == 3200 else max(dim // 64, 1))
        head_dim = dim // n_head
        block_size = 256
        if "freqs_cis" in sd:  # stale buffer: used only as a hint for the grid size
            block_size = sd["freqs_cis"].shape[0] - overrides.get("cls_token_num", 1)
        class_dropout = overrides.pop("class_dropout_prob", 0.1)
        num_classes = table - 1 if class_dropout > 0 else table
        kw = dict(vocab_size=vocab, dim=dim, n_layer=n_layer, n_head=n_head,
                  n_kv_head=(qkv // head_dim - n_head) // 2, num_classes=num_classes,
                  class_dropout_prob=class_dropout, block_size=block_size, multiple_of=hidden)
        kw.update(overrides)
        cfg = LlamaGenConfig(**kw)
        if cfg.ffn_hidden != hidden:
            raise ValueError(f"{path}: feed-forward width {hidden} does not follow from dim {dim}; pass multiple_of/ffn_dim_multiplier")
        model = cls(cfg)
        load_strict(model, {k: v for k, v in sd.items() if k != "freqs_cis"}, str(path))
        return model.eval()

    def config_dict(self) -> dict:
        return asdict(self.config)

    @classmethod
    def from_config_dict(cls, d: dict) -> "LlamaGen":
        names = {f.name for f in fields(LlamaGenConfig)}
        return cls(LlamaGenConfig(**{k: v for k, v in d.items() if k in names}))

    def save_pretrained(self, directory: str | Path, dtype: torch.dtype | None = None) -> None:
        """``config.json`` + ``model.safetensors`` (e.g. fp16 for the shipped bundle)."""
        save_pretrained(self, self.config_dict(), directory, dtype)

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> "LlamaGen":
        config, tensors = read_pretrained(directory)
        model = cls.from_config_dict(config)
        load_strict(model, tensors, str(directory))
        return model.eval()
