"""EAGLE draft head (Li et al. 2024) for image-token targets, as LANTERN trains it for LlamaGen.

The head predicts the target's next last-hidden-state ("feature") from the current token and the
current feature: ``fc(concat(embed(x_i), h_{i-1})) -> decoder layer(s) -> f_i``; the target's frozen
output head turns ``f_i`` into logits for token i+1. Here ``h_{i-1}`` is the target's (post-norm) last
hidden state that predicted ``x_i`` (the condition position for ``x_0``), so the drafter sequence is
exactly the image stream at positions 0, 1, ..., with no prefix.

What the head takes from its target is data, ``target.drafter_parts()`` (``models.decoder.DrafterParts``),
recorded in the head's config: LlamaGen targets lend their ``output`` head, the head keeps its own
copy of the token table (``embed_tokens``, saved) and places tokens by the 2D grid RoPE table
(``positions="grid"``); text-to-image targets (``PromptDecoder``) lend their ``head`` and their
``image_embed`` (frozen, never saved: ``own_embeddings=False``; it also embeds structural ids such
as Emu3's row ends) and tokens sit at their stream positions with 1D RoPE of the target's base
(``positions="stream"``).

Caching follows ``models.base``: a static per-row ``KVCache`` over the committed image tokens; a
forward writes a block after the committed slots at offset ``start`` and attends to the committed
slots plus the uncommitted block region as ``tree_mask`` says, so a tree can be drafted depth by
depth without committing anything; ``commit``/``keep_block`` then extend the committed prefix.

Files use the EAGLE/LANTERN layout: ``config.json`` (HF Llama fields) plus ``model.safetensors`` or
``pytorch_model.bin`` with ``embed_tokens.weight``, ``fc.weight``/``fc.bias`` and
``layers.N.self_attn.{q,k,v,o}_proj.weight``, ``layers.N.mlp.{gate,up,down}_proj.weight``,
``layers.N.input_layernorm.weight`` (absent for layer 0 in EAGLE: no norm there) and
``layers.N.post_attention_layernorm.weight``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn

from ..checks import config_sizes, one_line
from ..io import read_text
from .base import CacheGeometry, KVCache
from .checkpoint import CONFIG_NAME, WEIGHTS_NAME, check_tensors, read_state_dict
from .decoder import Float32Rope, rope_1d
from .loading import Piece
from .llamagen import LlamaGenConfig, TransformerBlock, rope_2d_table

BIN_NAME = "pytorch_model.bin"


@dataclass
class DrafterConfig:
    """Shapes of the head; HF Llama names, as EAGLE's config.json spells them."""

    vocab_size: int = 16384
    hidden_size: int = 768
    intermediate_size: int = 2048
    num_attention_heads: int = 12
    num_key_value_heads: int | None = None
    num_hidden_layers: int = 1
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    block_size: int = 256  # image tokens (square grid); stream positions for positions="stream"
    fc_bias: bool = True
    first_input_norm: bool = False  # EAGLE: layer 0 has no input_layernorm
    positions: str = "grid"  # "grid": LlamaGen 2D RoPE table; "stream": 1D RoPE of the stream position
    own_embeddings: bool = True  # False: stream ids are embedded by the target's module (not saved)

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"DrafterConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.positions not in ROPES:
            raise ValueError(f"DrafterConfig.positions must be one of {', '.join(ROPES)}, got {self.positions!r}")
        side = math.isqrt(self.block_size)
        if self.positions == "grid" and side * side != self.block_size:
            raise ValueError(f"DrafterConfig.block_size must be a square grid size, got {self.block_size}")

    def block_config(self) -> LlamaGenConfig:
        """A LlamaGenConfig whose TransformerBlock has exactly these widths."""
        base = int(2 * 4 * self.hidden_size / 3)
        cfg = LlamaGenConfig(vocab_size=self.vocab_size, dim=self.hidden_size, n_layer=self.num_hidden_layers,
                             n_head=self.num_attention_heads, n_kv_head=self.num_key_value_heads,
                             multiple_of=self.intermediate_size, ffn_dim_multiplier=self.intermediate_size / base,
                             rope_base=self.rope_theta, norm_eps=self.rms_norm_eps,
                             block_size=self.block_size if self.positions == "grid" else 1)  # the block never reads it
        if cfg.ffn_hidden != self.intermediate_size:
            raise ValueError(f"DrafterConfig.intermediate_size {self.intermediate_size} is not representable")
        return cfg

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(architectures=["EagleDrafter"], model_type="llama", hidden_act="silu",
                 max_position_embeddings=self.block_size, input_type="c2i" if self.positions == "grid" else "t2i")
        return d

    @classmethod
    def from_json(cls, d: dict, **overrides) -> DrafterConfig:
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if "block_size" not in d and d.get("input_type") == "c2i":
            kw["block_size"] = 576  # LANTERN's LlamaGen c2i drafters (24 x 24 grid)
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"drafter hidden_act {d['hidden_act']!r} is not supported (silu only)")
        kw.update(overrides)
        return cls(**kw)


def _grid_rope(cfg: DrafterConfig, head_dim: int) -> torch.Tensor:
    """LlamaGen's 2D table over the square grid (row i of the table: grid position i)."""
    return rope_2d_table(math.isqrt(cfg.block_size), head_dim, cfg.rope_theta, 0)


# positions -> a precomputed RoPE table (indexed by position), or None: computed per call (1D, any length)
ROPES = {"grid": _grid_rope, "stream": lambda cfg, head_dim: None}


class EagleDrafter(Float32Rope, nn.Module):
    """EAGLE feature-regression head with its own static KV cache (see module docstring)."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = cfg = config
        block = cfg.block_config()
        self.head_dim = block.head_dim
        if cfg.own_embeddings:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=cfg.fc_bias)
        self.layers = nn.ModuleList(TransformerBlock(block) for _ in range(cfg.num_hidden_layers))
        if not cfg.first_input_norm:
            self.layers[0].attention_norm = nn.Identity()
        self.register_buffer("rope", ROPES[cfg.positions](cfg, block.head_dim), persistent=False)
        self.cache: KVCache | None = None
        self.__dict__["head"] = None  # the target's output layer: used, never owned or saved
        self.__dict__["borrowed_embed"] = None  # the target's stream embedding (own_embeddings=False)
        self.__dict__["stream_len"] = cfg.block_size  # stream positions of the attached target

    # ---- construction ----
    @classmethod
    def from_target(cls, target: nn.Module, num_hidden_layers: int = 1, seed: int | None = None) -> EagleDrafter:
        """A fresh head shaped like one ``target`` layer, what it takes from the target as
        ``target.drafter_parts()`` says (an own embedding table starts as a copy of the target's)."""
        tc, parts = target.config, target.drafter_parts()
        cfg = DrafterConfig(vocab_size=target.layout.vocab_size, hidden_size=target.hidden_size,
                            intermediate_size=tc.ffn_hidden, num_attention_heads=tc.n_head,
                            num_key_value_heads=tc.n_kv_head, num_hidden_layers=num_hidden_layers,
                            rms_norm_eps=tc.norm_eps, rope_theta=parts.rope_theta, block_size=parts.block_size,
                            positions=parts.positions, own_embeddings=parts.own_embed)
        if seed is not None:
            torch.manual_seed(seed)
        model = cls(cfg)
        for m in model.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=getattr(tc, "initializer_range", 0.02))
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        p = next(target.parameters())
        model = model.to(device=p.device, dtype=p.dtype)
        if cfg.own_embeddings:
            with torch.no_grad():
                model.embed_tokens.weight.copy_(parts.embed.weight)
        return model.attach(target)

    def attach(self, target: nn.Module) -> EagleDrafter:
        """Use the target's output head (and, for ``own_embeddings=False``, its stream embedding) as
        ``target.drafter_parts()`` names them: frozen, not part of this module's state."""
        parts, cfg = target.drafter_parts(), self.config
        if parts.positions != cfg.positions or parts.own_embed != cfg.own_embeddings:
            raise ValueError(f"drafter made for {cfg.positions} positions ({'own' if cfg.own_embeddings else 'borrowed'} "
                             f"embeddings) does not fit a target with {parts.positions} positions "
                             f"({'own' if parts.own_embed else 'borrowed'} embeddings)")
        width, vocab = getattr(target, "hidden_size", None), target.layout.vocab_size
        if (vocab, width) != (cfg.vocab_size, cfg.hidden_size):
            raise ValueError(f"drafter (vocab {cfg.vocab_size}, width {cfg.hidden_size}) does not fit "
                             f"the target head {(vocab, width)}")
        if cfg.positions == "grid" and target.layout.num_tokens > cfg.block_size:
            raise ValueError(f"drafter grid {cfg.block_size} is smaller than the target's {target.layout.num_tokens}")
        self.__dict__["head"] = parts.head
        self.__dict__["borrowed_embed"] = None if cfg.own_embeddings else parts.embed
        self.__dict__["stream_len"] = max(cfg.block_size, target.layout.stream_len)
        return self

    # ---- teacher-forced (training, tests) ----
    def _layers(self, x: torch.Tensor, rope: torch.Tensor, mask: torch.Tensor | None, slots: torch.Tensor | None) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, mask, self.cache if slots is not None else None, i, slots)
        return x

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        if self.head is None:
            raise RuntimeError("attach(target) the drafter to its target before asking for logits")
        return self.head(features).float()

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Stream ids (codes, and structural ids where the target has them) -> (.., hidden_size)."""
        if self.config.own_embeddings:
            return self.embed_tokens(tokens)
        if self.borrowed_embed is None:
            raise RuntimeError("attach(target) the drafter to its target before feeding it tokens")
        with torch.no_grad():  # the target's module: frozen
            return self.borrowed_embed(tokens)

    def rope_at(self, positions: torch.Tensor) -> torch.Tensor:
        """RoPE (.., head_dim/2, 2) of stream positions: the grid table, or 1D RoPE at any position."""
        if self.rope is not None:
            return self.rope[positions.clamp(0, self.rope.shape[0] - 1)]
        return rope_1d(positions, self.head_dim, self.config.rope_theta)

    def _input(self, tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        dt = self.fc.weight.dtype
        return self.fc(torch.cat([self.embed(tokens).to(dt), hidden.to(dt)], dim=-1))

    def forward_train(self, tokens: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal forward over stream tokens 0..t-1 (B, t) with ``hidden[:, i]`` the target feature that
        predicted token i; returns (logits (B, t, V) for tokens 1..t, predicted features (B, t, D))."""
        x = self._input(tokens, hidden)
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        rope = self.rope_at(positions)[None].expand(tokens.shape[0], -1, -1, -1)
        f = self._layers(x, rope, None, None)
        return self.logits(f), f

    # ---- cached decoding ----
    def cache_geometry(self, rows: int, prefix: int, extra: int) -> CacheGeometry:
        """The cache ``setup_cache(rows, extra)`` allocates (no prefix: ``prefix`` unused)."""
        blk = self.layers[0].attention
        return CacheGeometry(len(self.layers), rows, blk.n_kv_head, self.stream_len + extra, blk.head_dim)

    def setup_cache(self, rows: int, extra: int) -> None:
        """Room for the whole stream plus ``extra`` uncommitted slots per row; committed length 0."""
        p = self.fc.weight
        self.cache = self.cache_geometry(rows, 0, extra).allocate(p.dtype, p.device)

    @property
    def length(self) -> torch.Tensor:
        """Committed stream tokens per row."""
        return self.cache.length

    @torch.no_grad()
    def forward_tokens(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                       tree_mask: torch.Tensor | None = None, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed n nodes per row (token, input feature, stream position) into slots ``length + start + j``.

        Node j attends to the committed slots and, inside the uncommitted region ``[length, length +
        start + n)``, to slot i where ``tree_mask[r, j, i]`` (default: causal within this block, nothing
        earlier). Returns (logits (rows, n, V), predicted features (rows, n, D)); nothing is committed.
        Attention reads the cache's live span (``KVCache.live``): a block at ``start > 0`` must follow,
        in the same round, blocks of ``start`` tokens in all since the last commit (the tree builders'
        levels do), so that the bound covers its slots.
        """
        cache = self.cache
        if cache is None:
            raise RuntimeError("call setup_cache(rows, extra) before cached decoding")
        n = tokens.shape[1]
        if tree_mask is None and start:
            j = torch.arange(n, device=tokens.device)
            tree_mask = torch.zeros(n, start + n, dtype=torch.bool, device=tokens.device)
            tree_mask[:, start:] = j[None, :] <= j[:, None]
            tree_mask = tree_mask[None].expand(tokens.shape[0], -1, -1)
        mask = cache.attention_mask(n, tree_mask, cache.live(n))
        slots = (cache.block_slots(n) + start).clamp_max(cache.slots - 1)
        x = self._input(tokens, hidden)
        f = self._layers(x, self.rope_at(positions), mask, slots)
        return self.logits(f), f

    def commit(self, count: torch.Tensor) -> None:
        """Keep the first ``count[r]`` slots of the last block written at start 0."""
        self.cache.length += count  # in place (captured rounds)

    def keep_block(self, index: torch.Tensor, count: torch.Tensor) -> None:
        """Tree compaction: uncommitted slot ``length + index[r, j]`` moves to ``length + j``, then commit ``count``."""
        self.cache.keep_block(index, count.to(self.cache.length))

    # ---- EAGLE / LANTERN files ----
    def eagle_state_dict(self) -> dict[str, torch.Tensor]:
        """Weights under the EAGLE key names (q/k/v split, Llama MLP names); ``embed_tokens`` only
        when the head owns its table."""
        sd = {"embed_tokens.weight": self.embed_tokens.weight} if self.config.own_embeddings else {}
        sd["fc.weight"] = self.fc.weight
        if self.fc.bias is not None:
            sd["fc.bias"] = self.fc.bias
        for i, layer in enumerate(self.layers):
            a, m = layer.attention, layer.feed_forward
            q, k, v = a.wqkv.weight.split([a.n_head * a.head_dim, a.n_kv_head * a.head_dim, a.n_kv_head * a.head_dim])
            pre = f"layers.{i}."
            sd.update({pre + "self_attn.q_proj.weight": q, pre + "self_attn.k_proj.weight": k,
                       pre + "self_attn.v_proj.weight": v, pre + "self_attn.o_proj.weight": a.wo.weight,
                       pre + "mlp.gate_proj.weight": m.w1.weight, pre + "mlp.up_proj.weight": m.w3.weight,
                       pre + "mlp.down_proj.weight": m.w2.weight,
                       pre + "post_attention_layernorm.weight": layer.ffn_norm.weight})
            if isinstance(layer.attention_norm, nn.Module) and hasattr(layer.attention_norm, "weight"):
                sd[pre + "input_layernorm.weight"] = layer.attention_norm.weight
        return {k: v.detach().cpu().contiguous() for k, v in sd.items()}

    def load_eagle_state_dict(self, sd: dict[str, torch.Tensor], where: str = "drafter") -> None:
        """Load EAGLE-named weights (strict: every tensor present, none unexpected, shapes equal)."""
        own = self.eagle_state_dict()
        check_tensors(own, sd, where)
        with torch.no_grad():
            if self.config.own_embeddings:
                self.embed_tokens.weight.copy_(sd["embed_tokens.weight"])
            self.fc.weight.copy_(sd["fc.weight"])
            if self.fc.bias is not None:
                self.fc.bias.copy_(sd["fc.bias"])
            for i, layer in enumerate(self.layers):
                pre = f"layers.{i}."
                a, m = layer.attention, layer.feed_forward
                a.wqkv.weight.copy_(torch.cat([sd[pre + f"self_attn.{p}_proj.weight"] for p in "qkv"]))
                a.wo.weight.copy_(sd[pre + "self_attn.o_proj.weight"])
                m.w1.weight.copy_(sd[pre + "mlp.gate_proj.weight"])
                m.w3.weight.copy_(sd[pre + "mlp.up_proj.weight"])
                m.w2.weight.copy_(sd[pre + "mlp.down_proj.weight"])
                layer.ffn_norm.weight.copy_(sd[pre + "post_attention_layernorm.weight"])
                if pre + "input_layernorm.weight" in own:
                    layer.attention_norm.weight.copy_(sd[pre + "input_layernorm.weight"])

    def save_pretrained(self, directory: str | Path, dtype: torch.dtype | None = None) -> None:
        """``config.json`` + ``model.safetensors`` in the EAGLE layout."""
        from safetensors.torch import save_file

        from ..io import atomic_write, write_text

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        sd = {k: (v.to(dtype) if dtype is not None else v) for k, v in self.eagle_state_dict().items()}
        atomic_write(out / WEIGHTS_NAME, lambda p: save_file(sd, p))
        write_text(out / CONFIG_NAME, json.dumps(self.config.to_json(), indent=2))

    def eagle_route(self):
        """EAGLE key -> our tensor (``load_eagle_state_dict``'s mapping, for ``models.loading``): q, k, v
        into the rows of the fused ``wqkv`` (EAGLE heads are trained in our pair order: no
        interleaving), Llama MLP and norm names onto ours; any other key is unexpected."""
        a = self.layers[0].attention
        q, kv = a.n_head * a.head_dim, a.n_kv_head * a.head_dim
        rows = {"q": slice(0, q), "k": slice(q, q + kv), "v": slice(q + kv, q + 2 * kv)}
        names = {"self_attn.o_proj.weight": "attention.wo.weight", "mlp.gate_proj.weight": "feed_forward.w1.weight",
                 "mlp.up_proj.weight": "feed_forward.w3.weight", "mlp.down_proj.weight": "feed_forward.w2.weight",
                 "post_attention_layernorm.weight": "ffn_norm.weight",
                 "input_layernorm.weight": "attention_norm.weight"}
        pattern = re.compile(r"layers\.(\d+)\.(.+)$")

        def route(key: str):
            m = pattern.match(key)
            if m is None:
                return (Piece(key),) if key in ("embed_tokens.weight", "fc.weight", "fc.bias") else None
            dst, rest = f"layers.{m.group(1)}.", m.group(2)
            proj = re.fullmatch(r"self_attn\.([qkv])_proj\.weight", rest)
            if proj:
                return (Piece(dst + "attention.wqkv.weight", rows[proj.group(1)]),)
            return (Piece(dst + names[rest]),) if rest in names else None

        return route

    @classmethod
    def from_pretrained(cls, directory: str | Path, target: nn.Module | None = None, **overrides) -> EagleDrafter:
        """Load an EAGLE/LANTERN drafter directory (``config.json`` + ``model.safetensors`` or
        ``pytorch_model.bin``), streamed without initialisation (``models.loading``) into the target's
        dtype and device when ``target`` is given (fp32 on the CPU otherwise); attach ``target``'s
        output head when given."""
        from .loading import load_safetensors, load_state_dict_file, safetensors_keys, skeleton

        d = Path(directory)
        try:
            raw = json.loads(read_text(d / CONFIG_NAME, "drafter config"))
        except Exception as exc:  # noqa: BLE001 - any unreadable config is the same user error
            raise ValueError(f"cannot read drafter config {d / CONFIG_NAME}: {one_line(exc)}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{d / CONFIG_NAME} must hold a JSON object")
        config_sizes(raw, str(d / CONFIG_NAME))  # zero or huge sizes: one line before building
        sd = None
        if (d / WEIGHTS_NAME).exists():
            keys = set(safetensors_keys(d / WEIGHTS_NAME))
        elif (d / BIN_NAME).exists():
            sd = read_state_dict(d / BIN_NAME)
            keys = set(sd)
        else:
            raise ValueError(f"{d}: no {WEIGHTS_NAME} or {BIN_NAME}")
        if target is not None and "block_size" not in raw and "block_size" not in overrides and raw.get("input_type") != "c2i":
            overrides["block_size"] = target.drafter_parts().block_size
        if "own_embeddings" not in raw:  # EAGLE/LANTERN files: the table is there or it is not
            overrides.setdefault("own_embeddings", "embed_tokens.weight" in keys)
        overrides.setdefault("fc_bias", "fc.bias" in keys)
        overrides.setdefault("first_input_norm", "layers.0.input_layernorm.weight" in keys)
        config = DrafterConfig.from_json(raw, **overrides)
        model = skeleton(lambda: cls(config))
        p = next(target.parameters()) if target is not None else torch.empty(0)
        where = d / (WEIGHTS_NAME if sd is None else BIN_NAME)
        if sd is None:
            load_safetensors(model, [where], model.eagle_route(), p.dtype, p.device, str(where))
        else:
            load_state_dict_file(model, sd, model.eagle_route(), p.dtype, p.device, str(where))
        if target is not None:
            model = model.attach(target)
        return model.eval()


def load_drafter(directory: str | Path, target: nn.Module) -> EagleDrafter:
    """``EagleDrafter.from_pretrained(directory, target)``; a training run directory (``train-drafter
    --out``) stands for its ``final/`` head."""
    d = Path(directory)
    if not (d / CONFIG_NAME).exists() and (d / "final" / CONFIG_NAME).exists():
        d = d / "final"
    return EagleDrafter.from_pretrained(d, target)

