"""ZipAR (He et al., ICML 2025, arXiv 2412.04062): next-set decoding of several image rows at once.

The official code (ThisisBillhe/ZipAR @ 2a5695c) implements the fixed-window scheme of the paper's v1:
every target forward feeds one token per active row, that row's last committed token, and commits the
token it predicts, sampled from the target's law (no drafts, no verification:
``LlamaGen-ZipAR/autoregressive/models/generate_zipar.py:154-194``). Row r + 1 starts once row r has
``window`` committed image tokens (generate_zipar.py:199-206, ``zipar_window_size``), so several rows
advance per forward. Row 0 and, without row ends, row 1 are plain AR (row 1 starts when row 0 is
complete, generate_zipar.py:270-279).

``window`` counts image tokens of the row above, the LlamaGen code's meaning (its default 8:
``sample_c2i_ddp_zipar.py:197``, ``gpt.py:302``). The Lumina-mGPT code counts a row's leading token too:
its default 16 entries (``generate_examples/generate.py:31``, ``modeling_chameleon.py:1582``) is
``window=15`` here (modeling_chameleon.py:2055-2061). Default 8: the LlamaGen code's, the same start lag
as PJD's (8 image tokens), and one value that means the same on every family.

Steps: with H rows of W tokens and no row ends, 1 (prefill) + (W - 1) + (H - 2) * window + W forwards
(8x8, window 3: 34 forwards instead of AR's 64; checked by running the official loop,
pjd_zipar_brief D1). Row-end layouts feed each row's forced row end as the next row's lead (the
official Lumina code appends the EOL when the next row starts).

The law (not AR's): a token (r, c) is drawn from the target's law given the rows above up to their
committed prefixes (row r - 1 up to at least column c + window - 1) and its own row's prefix; a
committed token's KV is never recomputed, so later tokens also read states computed from partial
contexts. Rows 0 (and 1 without row ends) are exact; a grid whose rows never overlap (window >= width)
is AR. Measured TV to AR's law on tiny models: docs/results/archive/rows2d-tv.md (design: docs/guide/rows2d.md). Differences from the
official loop: the placeholder of a row start without row ends is not kept in the cache (the official
code attends to it and to never-written zero slots, generate_zipar.py; ``methods/rows2d.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..options import Options, option
from ..sampling import sample
from .base import DecodeContext
from .proposer import RowProposer, decode_rows
from .rows2d import MAX_ROWS, Rows


@dataclass(frozen=True)
class ZipAR(Options):
    """ZipAR's next-set decoding: row r + 1 starts once row r has ``window`` image tokens; one token per
    active row per target forward (module docstring). Lossy; batched with per-sample rows."""

    window: int = option(8, low=1, stream=True, help="image tokens of the row above before the next row "
                                                     "starts (official LlamaGen default 8; Lumina's 16 entries = 15)")
    name = "zipar"
    lossless = False
    acceptance = None
    pad = MAX_ROWS
    refills = True

    def decode(self, ctx: DecodeContext) -> None:
        decode_rows(ctx, Rows(ctx, lag=self.window, chain=1, rcm=False), NextSet())


class NextSet(RowProposer):
    """No drafts: every active row feeds its last committed token and commits a draw from the target's
    law of its next column."""

    def propose(self, ctx: DecodeContext, rows: Rows) -> tuple[torch.Tensor, None]:
        return rows.open.long(), None

    def settle(self, ctx: DecodeContext, rows: Rows, block, law) -> None:
        p = rows.chain_laws(block, law.probs)  # (B, H, 1, V): the law of column c of each row
        rows.commit(block, rows.open.long(), sample(p, ctx.generator))
