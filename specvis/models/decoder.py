"""The one Llama-shaped decoder behind every discrete family (gpt-fast style).

Blocks: pre-norm RMSNorm, attention (optional bias, grouped KV heads) with rotary embeddings,
SwiGLU feed-forward. Families differ only in data: the RoPE angles of a position (LlamaGen: the 2D
grid table; Llama text models: theta^(-2i/d) times the sequence position), the condition prefix (a
class embedding or a token prompt), how an image token is embedded and which head scores the next
one, and the attention's weight layout (``qkv_layout``, ``rope_pairs`` of the config):

- specvis's own format (LlamaGen's official files, the emoji bundles, drafters): one fused ``wqkv``
  projection, rotary on interleaved pairs (x[2i], x[2i+1]) (LlamaGen's ``apply_rotary_emb``);
- the Hugging Face Llama layout (Chameleon, Janus, Emu3: ``families.hf.llama_config``): separate
  ``wq``/``wk``/``wv`` in the file's own row order, rotary on rotate-half pairs (x[i], x[i + d/2])
  (transformers' ``rotate_half``), so that a CPU load keeps each projection in the file's mapping
  (``models.loading.maps_in_place``). The rotated q and k leave both rotaries in the interleaved
  order, so the attention scores of one model in the two layouts are the same products summed in
  the same order; only the projections' and Chameleon's q/k norms' rounding may differ.

``CachedStack`` is the cached half of ``CachedTokenModel`` (models/base.py) shared by the families: a
static per-row KV cache, per-row prefix lengths, tree masks, in-place commits (captured rounds).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .base import CacheGeometry, KVCache


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of x (B, T, H, D) by rope (B, T, D/2, 2) = (cos, sin): as complex
    numbers, (x0 + i x1)(cos + i sin) = (x0 cos - x1 sin) + i (x1 cos + x0 sin), one complex product
    (on CPU 2.5-3.5x faster than the four real products, same values)."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * torch.view_as_complex(rope.float().contiguous())[:, :, None])
    return out.flatten(3).type_as(x)


def apply_rope_half(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate the rotate-half pairs (x[i], x[i + D/2]) of x (B, T, H, D) by rope (B, T, D/2, 2):
    transformers' ``q * cos + rotate_half(q) * sin`` (models/llama/modeling_llama.py
    ``apply_rotary_pos_emb``), as ``apply_rope``'s complex product on those pairs. The rotated pair i
    comes back at dims (2i, 2i + 1), the order ``apply_rope`` leaves: q and k both get it, so q.k (and
    the KV cache) are what the interleaved layout computes from the same model, product for product."""
    pairs = x.float().unflatten(-1, (2, x.shape[-1] // 2)).transpose(-1, -2)  # (..., D/2, 2): (x[i], x[i + D/2])
    turn = torch.view_as_complex(rope.float().contiguous())[:, :, None]
    out = torch.view_as_real(torch.view_as_complex(pairs.contiguous()) * turn)
    return out.flatten(3).type_as(x)


ROPE_PAIRS = {"interleaved": apply_rope, "half": apply_rope_half}
"""``rope_pairs`` of a config -> the rotary that pairs a head's dimensions so."""
QKV_LAYOUTS = ("fused", "separate")
"""``qkv_layout`` of a config: one ``wqkv`` projection, or ``wq``, ``wk``, ``wv``."""


class Float32Rope:
    """Mixin for an ``nn.Module`` with a ``rope`` buffer (a cos/sin table): the table follows device
    moves but stays float32 when the module is cast to bf16 or fp16, as LlamaGen keeps its freqs_cis
    (a bf16 table would round every angle's cos and sin to 8 bits; ``apply_rope`` rotates in float32)."""

    def _apply(self, fn, recurse: bool = True):
        rope = self._buffers.get("rope")
        super()._apply(fn, recurse)
        moved = self._buffers.get("rope")
        if rope is not None and moved is not None and moved.dtype != rope.dtype:
            self._buffers["rope"] = rope.to(moved.device)
        return self


def rope_1d(positions: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """Llama RoPE (B, T, head_dim/2, 2) at integer ``positions`` (B, T): angle_i = p * theta^(-2i/d)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[..., None] * inv
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class HeadLayerNorm(nn.Module):
    """Chameleon's query/key norm: LayerNorm statistics over each head's vector (eps 1e-5, as the
    official code hard-codes), then an affine weight and bias of its own per head: (heads, head_dim)."""

    def __init__(self, heads: int, head_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(heads, head_dim))
        self.bias = nn.Parameter(torch.zeros(heads, head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, heads, head_dim)
        return F.layer_norm(x, x.shape[-1:], eps=1e-5) * self.weight + self.bias


class Attention(nn.Module):
    """Multi-head attention with grouped KV heads. ``cfg.qkv_layout`` (``QKV_LAYOUTS``, default
    ``"fused"``): the q/k/v projections as one ``wqkv`` Linear (rows q, k, v) or as ``wq``, ``wk``,
    ``wv``; ``cfg.rope_pairs`` (``ROPE_PAIRS``, default ``"interleaved"``): which dimensions of a head
    the rotary turns together."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        bias = getattr(cfg, "attention_bias", False)
        layout, pairs = getattr(cfg, "qkv_layout", "fused"), getattr(cfg, "rope_pairs", "interleaved")
        if layout not in QKV_LAYOUTS or pairs not in ROPE_PAIRS:
            raise ValueError(f"qkv_layout must be one of {', '.join(QKV_LAYOUTS)} and rope_pairs one of "
                             f"{', '.join(ROPE_PAIRS)}, got {layout!r} and {pairs!r}")
        self.rotate, self.fused = ROPE_PAIRS[pairs], layout == "fused"
        q, kv = cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim
        if self.fused:
            self.wqkv = nn.Linear(cfg.dim, q + 2 * kv, bias=bias)
        else:
            self.wq, self.wk, self.wv = (nn.Linear(cfg.dim, n, bias=bias) for n in (q, kv, kv))
        self.wo = nn.Linear(cfg.n_head * cfg.head_dim, cfg.dim, bias=bias)
        self.resid_dropout = nn.Dropout(cfg.resid_dropout_p)
        self.qk_norm = bool(getattr(cfg, "qk_norm", False))
        if self.qk_norm:
            self.q_norm, self.k_norm = HeadLayerNorm(cfg.n_head, cfg.head_dim), HeadLayerNorm(cfg.n_kv_head, cfg.head_dim)

    def projections(self) -> list[nn.Module]:
        """The q/k/v projection layers: ``[wqkv]`` (fused) or ``[wq, wk, wv]``."""
        return [self.wqkv] if self.fused else [self.wq, self.wk, self.wv]

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of x (B, T, dim), each (B, T, heads * head_dim)."""
        if self.fused:
            q_size, kv_size = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
            return self.wqkv(x).split([q_size, kv_size, kv_size], dim=-1)
        return self.wq(x), self.wk(x), self.wv(x)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, mask: torch.Tensor | None,
                cache: KVCache | None = None, layer: int = 0, slots: torch.Tensor | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x)
        q, k = q.view(B, T, self.n_head, self.head_dim), k.view(B, T, self.n_kv_head, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotate(q, rope).transpose(1, 2), self.rotate(k, rope).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        if cache is not None:
            cache.write(layer, k, v, slots)
            live = cache.slots if mask is None else mask.shape[-1]  # the live span: the mask's width
            k, v = cache.k[layer, :, :, :live], cache.v[layer, :, :, :live]
        gqa = self.n_kv_head != self.n_head
        out = F.scaled_dot_product_attention(q.to(k.dtype), k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=gqa)
        return self.resid_dropout(self.wo(out.to(x.dtype).transpose(1, 2).reshape(B, T, -1)))


class FeedForward(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.dim, bias=False)
        self.ffn_dropout = nn.Dropout(cfg.ffn_dropout_p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn_dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class TransformerBlock(nn.Module):
    """Pre-norm x + f(norm(x)); ``swin_norm`` (Chameleon 30B, Lumina-mGPT) normalises the output
    instead: x + norm(f(x))."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.attention = Attention(cfg)
        self.feed_forward = FeedForward(cfg)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.swin_norm = bool(getattr(cfg, "swin_norm", False))

    def forward(self, x, rope, mask, cache=None, layer=0, slots=None):
        if self.swin_norm:
            h = x + self.attention_norm(self.attention(x, rope, mask, cache, layer, slots))
            return h + self.ffn_norm(self.feed_forward(h))
        h = x + self.attention(self.attention_norm(x), rope, mask, cache, layer, slots)
        return h + self.feed_forward(self.ffn_norm(h))


@dataclass(frozen=True)
class DrafterParts:
    """What an EAGLE draft head (``models/drafter.py``) takes from its target, as data (no family
    names in the drafter): ``head`` scores the next image code from a feature (frozen, never saved
    with the head); ``embed`` embeds stream ids (image codes and structural ids); ``own_embed``: the
    head keeps a trainable copy of ``embed``'s table (EAGLE/LANTERN files carry ``embed_tokens``)
    instead of borrowing the module; ``positions``: ``"grid"`` (LlamaGen's 2D RoPE table indexed by
    grid position) or ``"stream"`` (Llama 1D RoPE of the stream position with base ``rope_theta``);
    ``block_size``: the stream positions a head must cover."""

    head: nn.Module
    embed: nn.Module
    own_embed: bool
    positions: str
    rope_theta: float
    block_size: int


@dataclass(frozen=True)
class Prefixes:
    """Condition prefixes computed apart (``CachedStack.prefill_prefixes``): keys and values (layers, rows,
    kv heads, slots, head dim) of the longest prefix's slots, each row's cache length and prefix length."""

    k: torch.Tensor
    v: torch.Tensor
    lengths: torch.Tensor
    prefix_lengths: torch.Tensor


class CachedStack:
    """Cached decoding over ``self.layers`` / ``self.norm`` (mixed into a family's ``nn.Module``).

    The family supplies ``head(h) -> logits``, ``rope_at(index) -> (R, n, d/2, 2)`` for absolute
    sequence indices, ``cache_shape() -> (layers, kv_heads, head_dim)`` and ``max_prefix`` (the
    longest prefix it accepts). Row r's
    condition prefix fills slots 0 .. prefix_lengths[r] - 1; stream position j of its image tokens
    sits at sequence index prefix_lengths[r] + j (its slot when committed, and its RoPE index unless
    the family overrides ``stream_rope_index``)."""

    cache: KVCache | None = None
    prefix_lengths: torch.Tensor | None = None

    def setup_cache(self, rows: int, extra: int) -> None:
        """Plan a cache for ``rows`` sequences with ``extra`` scratch slots; it is allocated by the
        prefill, sized to the longest prefix of that call (plus the stream and ``extra``)."""
        p = next(self.parameters())
        self._plan = (rows, extra)
        self.cache = None
        self.prefix_lengths = torch.zeros(rows, dtype=torch.long, device=p.device)

    def cache_geometry(self, rows: int, prefix: int, extra: int) -> CacheGeometry:
        """The cache a call of ``rows`` rows, a longest prefix of ``prefix`` tokens and ``extra``
        scratch slots allocates: prefix + stream + extra slots (``specvis.memory`` plans with it)."""
        layers, heads, head_dim = self.cache_shape()
        return CacheGeometry(layers, rows, heads, prefix + self.layout.stream_len + extra, head_dim)

    def _allocate(self, prefix: int) -> KVCache:
        rows, extra = self._plan
        p = next(self.parameters())
        self.cache = self.cache_geometry(rows, prefix, extra).allocate(p.dtype, p.device)
        return self.cache

    def _run_cached(self, x: torch.Tensor, rope: torch.Tensor, tree_mask: torch.Tensor | None,
                    positions: torch.Tensor | None = None):
        cache = self.cache
        if cache is None:
            raise RuntimeError("call setup_cache(rows, extra) before cached decoding")
        if cache.pos is None:
            positions = None
        return self._stack(x, rope, tree_mask, cache.live(x.shape[1]), positions)  # host bookkeeping stays outside

    def _stack(self, x: torch.Tensor, rope: torch.Tensor, tree_mask: torch.Tensor | None, live: int,
               positions: torch.Tensor | None = None):
        """The cached block stack over the first ``live`` cache slots (``KVCache.live``); ``positions``:
        the block's stream positions when the cache tracks them (``KVCache.track_positions``)."""
        cache = self.cache
        n = x.shape[1]
        slots = cache.block_slots(n)
        mask = cache.attention_mask(n, tree_mask, live, positions)
        if positions is not None:
            cache.write_positions(slots, positions)
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, mask, cache, i, slots)
        h = self.norm(x)
        return self.head(h).float(), h

    def _prefill_embedded(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write prefixes x (R, P, D) with ``lengths`` (R,) into the cache; (logits, hidden) after each
        row's last prefix token. Causal over each row's own prefix; padding is never attended later."""
        R, P = x.shape[:2]
        if P > self.max_prefix:
            raise ValueError(f"prompt of {P} tokens is longer than the context allows ({self.max_prefix} "
                             f"with a {self.layout.height}x{self.layout.width} image)")
        if R != self._plan[0]:
            raise ValueError(f"prefill of {R} rows into a cache planned for {self._plan[0]}")
        self._allocate(P)
        self.prefix_lengths.copy_(lengths)
        rope = self.rope_at(torch.arange(P, device=x.device)[None].expand(R, -1))
        logits, h = self._run_cached(x, rope, None)
        self.cache.length.copy_(lengths)
        last = (lengths - 1)[:, None, None]
        return logits.gather(1, last.expand(-1, 1, logits.shape[-1]))[:, 0], h.gather(1, last.expand(-1, 1, h.shape[-1]))[:, 0]

    def prefill_prefixes(self, conditions) -> tuple[torch.Tensor, Prefixes]:
        """``prefill`` of other rows than the cache's, into a cache of their own: the logits after each
        row's prefix and the prefixes' keys and values, to be loaded into rows of the running cache
        (``load_prefixes``; continuous batching, ``methods/slots.py``). The running cache is untouched."""
        running = self.cache, self._plan, self.prefix_lengths
        try:
            self.setup_cache(len(conditions), -self.layout.stream_len)  # the prefix's slots only: no stream is decoded here
            logits, _ = self.prefill(conditions)
            own = self.cache
            width = int(own.length.max())
            prefixes = Prefixes(own.k[:, :, :, :width].clone(), own.v[:, :, :, :width].clone(),
                                own.length.clone(), self.prefix_lengths.clone())
        finally:
            self.cache, self._plan, self.prefix_lengths = running
        return logits, prefixes

    def load_prefixes(self, rows: torch.Tensor, prefixes: Prefixes, which: torch.Tensor) -> None:
        """Cache rows ``rows`` restart from prefixes ``which`` (``prefill_prefixes``): their keys and values,
        lengths and prefix lengths; nothing of the stream is committed and no slot holds a position."""
        width = prefixes.k.shape[3]
        if width > self.cache.slots - self.layout.stream_len - self._plan[1]:
            raise ValueError(f"a prefix of {width} tokens does not fit the cache ({self.cache.slots} slots): "
                             f"the first prefill's prompts must be padded to the longest")
        self.cache.k[:, rows, :, :width] = prefixes.k[:, which]
        self.cache.v[:, rows, :, :width] = prefixes.v[:, which]
        self.cache.length[rows] = prefixes.lengths[which]
        self.cache.bound = max(self.cache.bound, width)  # the live-span bound covers the new rows (host side)
        self.prefix_lengths[rows] = prefixes.prefix_lengths[which]
        if self.cache.pos is not None:
            self.cache.pos[rows] = -1

    def stream_rope_index(self, positions: torch.Tensor) -> torch.Tensor:
        """The ``rope_at`` index of stream positions (R, n): by default the sequence index, each row's
        prefix length + position. A family whose official table places the stream at a fixed offset
        whatever the row's prefix (LlamaGen t2i: cls_token_num + grid position) overrides this."""
        return self.prefix_lengths[:, None] + positions.clamp(0, self.layout.stream_len - 1)

    def _forward_embedded(self, x: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None):
        return self._run_cached(x, self.rope_at(self.stream_rope_index(positions)), tree_mask, positions)

    def track_positions(self) -> None:
        """Position-aware caching from now on (``KVCache.track_positions``): call after the prefill."""
        self.cache.track_positions()

    def set_committed(self, n_fed: torch.Tensor) -> None:
        self.cache.length.copy_(n_fed + self.prefix_lengths)  # in place (captured rounds)

    def keep_block(self, index: torch.Tensor, count: torch.Tensor) -> None:
        self.cache.keep_block(index, count)

    def compile_decoder(self) -> None:
        """``torch.compile`` the cached block stack (one graph per block size and live span; shapes are
        static)."""
        import torch._dynamo

        limit = torch._dynamo.config.recompile_limit  # a graph per (block size, live span)
        torch._dynamo.config.recompile_limit = max(limit, 512)
        self._stack = torch.compile(self._stack, dynamic=False)


# ---------------------------------------------------------------- the text-conditioned decoder
@dataclass
class DecoderConfig:
    """A Llama-shaped text decoder: what ``TransformerBlock`` needs plus the text vocabulary and RoPE."""

    dim: int
    n_layer: int
    n_head: int
    n_kv_head: int
    ffn_hidden: int
    text_vocab_size: int
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    qkv_layout: str = "fused"  # QKV_LAYOUTS: "separate" for the Hugging Face layout (families.hf.llama_config)
    rope_pairs: str = "interleaved"  # ROPE_PAIRS: "half" (rotate-half) for the Hugging Face layout
    qk_norm: bool = False  # Chameleon
    swin_norm: bool = False  # Chameleon 30B / Lumina-mGPT
    max_positions: int = 4096
    resid_dropout_p: float = 0.0
    ffn_dropout_p: float = 0.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head


class MappedEmbedding(nn.Module):
    """Image and structural ids embedded through the text table: row ``token_map[id]`` of ``table``
    (Emu3: visual tokens are text-vocabulary tokens)."""

    def __init__(self, table: nn.Embedding, token_map: torch.Tensor) -> None:
        super().__init__()
        self.table = [table]  # shared with the decoder, not a second parameter
        self.register_buffer("token_map", token_map.long(), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[0](self.token_map[ids])


class AlignedEmbedding(nn.Module):
    """Janus: a code embedding (V, e) lifted to the model width by an MLP (Linear, then act + Linear)."""

    def __init__(self, num_codes: int, code_dim: int, dim: int, depth: int, act: nn.Module) -> None:
        super().__init__()
        self.codes = nn.Embedding(num_codes, code_dim)
        self.fc1 = nn.Linear(code_dim, dim)
        self.hidden = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth - 1))
        self.act = act

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.fc1(self.codes(ids))
        for layer in self.hidden:
            x = layer(self.act(x))
        return x


class MLPHead(nn.Module):
    """Janus's generation head: Linear, act, Linear onto the codebook."""

    def __init__(self, dim: int, hidden: int, num_codes: int, act: nn.Module) -> None:
        super().__init__()
        self.proj_out = nn.Linear(dim, hidden)
        self.act = act
        self.vision_head = nn.Linear(hidden, num_codes)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.vision_head(self.act(self.proj_out(h)))


class PromptDecoder(CachedStack, nn.Module):
    """A text-to-image Llama-shaped decoder implementing ``CachedTokenModel`` with prompt conditions.

    The condition of a row is a token prompt (``Prompts``), embedded by the text table; the image
    stream (``layout``: codes and forced structural ids) is embedded by ``image_embed`` and scored by
    ``image_head`` over the image codes only (sampling is restricted to the image vocabulary).
    ``unconditional`` holds the family's CFG convention as data: ``("keep", keep_ids, pad_id)``
    replaces every prompt token not in ``keep_ids`` by ``pad_id`` (Janus), ``("fixed", ids)`` is one
    fixed negative prompt (Anole), ``("from", token_id)`` is each prompt from its last ``token_id`` on
    (Lumina-mGPT: guidance starts at begin-image)."""

    null_condition = None
    num_conditions = None

    def __init__(self, config: DecoderConfig, layout, image_embed: nn.Module, image_head: nn.Module,
                 unconditional: tuple | None = None) -> None:
        super().__init__()
        self.config = cfg = config
        self.layout = layout
        self.max_prefix = cfg.max_positions - layout.stream_len
        self.tok_embeddings = nn.Embedding(cfg.text_vocab_size, cfg.dim)
        self.image_embed = image_embed
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = image_head
        self.unconditional_rule = unconditional

    @property
    def hidden_size(self) -> int:
        return self.config.dim

    def set_grid(self, height: int, width: int) -> None:
        """Generate ``height x width`` image tokens from now on (1D RoPE: any grid that fits the context)."""
        from .base import Layout

        for name, v in (("height", height), ("width", width)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1 (image tokens), got {v!r}")
        layout = Layout(height, width, self.layout.vocab_size, self.layout.row_end)
        if layout.stream_len >= self.config.max_positions:
            raise ValueError(f"height x width = {height}x{width} does not fit the context of {self.config.max_positions} positions")
        self.layout, self.max_prefix = layout, self.config.max_positions - layout.stream_len

    def cache_shape(self) -> tuple[int, int, int]:
        cfg = self.config
        return cfg.n_layer, cfg.n_kv_head, cfg.head_dim

    def rope_at(self, index: torch.Tensor) -> torch.Tensor:
        return rope_1d(index, self.config.head_dim, self.config.rope_theta)

    def drafter_parts(self) -> DrafterParts:
        """An EAGLE head borrows the image embedding and head, and places stream tokens by 1D RoPE
        (row ends included: they are stream positions like any other)."""
        return DrafterParts(self.head, self.image_embed, False, "stream", self.config.rope_theta, self.layout.stream_len)

    def unconditional(self, prompts):
        """The family's unconditional prompts for CFG (see the class docstring)."""
        from .base import Prompts

        rule = self.unconditional_rule
        if rule is None:
            raise ValueError("this model has no default unconditional prompt: pass negative prompts")
        if rule[0] == "keep":
            keep = torch.isin(prompts.ids, torch.as_tensor(rule[1], device=prompts.ids.device))
            return Prompts(torch.where(keep, prompts.ids, torch.full_like(prompts.ids, rule[2])), prompts.lengths)
        if rule[0] == "from":
            rows = [prompts.ids[r, : int(prompts.lengths[r])].tolist() for r in range(len(prompts))]
            for r, row in enumerate(rows):
                if rule[1] not in row:
                    raise ValueError(f"prompt {r} lacks token {rule[1]}, where this model's unconditional prompt starts "
                                     "(the official template ends with it): pass negative prompts")
            return Prompts.of([row[len(row) - 1 - row[::-1].index(rule[1]):] for row in rows], prompts.ids.device)
        return Prompts.of([list(rule[1])] * len(prompts), prompts.ids.device)

    @torch.no_grad()
    def prefill(self, prompts) -> tuple[torch.Tensor, torch.Tensor]:
        return self._prefill_embedded(self.tok_embeddings(prompts.ids), prompts.lengths)

    @torch.no_grad()
    def forward_tokens(self, tokens: torch.Tensor, positions: torch.Tensor,
                       tree_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self._forward_embedded(self.image_embed(tokens), positions, tree_mask)

    def forward_train(self, prompt_ids: torch.Tensor, prompt_lengths: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Training forward: logits (B, L, V) for codes (B, L) given left-padded prompts (B, P) of
        ``prompt_lengths`` real tokens. Each row is its own causal sequence (prompt, codes): padding
        is never attended and RoPE positions start at the row's first real token, so row r computes
        exactly what ``logits`` computes for it. Logit j predicts code j."""
        B, P = prompt_ids.shape
        dev = prompt_ids.device
        pad = P - prompt_lengths.to(dev)  # (B,)
        x = torch.cat([self.tok_embeddings(prompt_ids), self.image_embed(codes[:, :-1])], dim=1)
        T = x.shape[1]
        idx = torch.arange(T, device=dev)
        real = idx[None] >= pad[:, None]  # (B, T) keys that exist
        mask = (idx[None, :, None] >= idx[None, None, :]) & (real[:, None, :] | torch.eye(T, dtype=torch.bool, device=dev))
        rope = self.rope_at((idx[None] - pad[:, None]).clamp_min(0))
        for layer in self.layers:
            x = layer(x, rope, mask[:, None])
        return self.head(self.norm(x[:, P - 1:]))

    def logits(self, prompts, tokens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced raw logits (B, t+1, V) after each row's prompt and each of its t stream
        tokens: a plain causal forward per row, no cache (the reference the cached path must match)."""
        out = []
        for r in range(tokens.shape[0]):
            p = prompts.ids[r, : int(prompts.lengths[r])]
            x = torch.cat([self.tok_embeddings(p), self.image_embed(tokens[r])])[None]
            rope = self.rope_at(torch.arange(x.shape[1], device=x.device)[None])
            for layer in self.layers:
                x = layer(x, rope, None)
            out.append(self.head(self.norm(x))[0, len(p) - 1:].float())
        return torch.stack(out)
