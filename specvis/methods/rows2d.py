"""Several image rows in flight (ZipAR, PJD): the per-row state, the fed block with its mask, the commit.

A 2-D method decodes image row r + 1 while row r is still incomplete. The official codes (ZipAR:
``LlamaGen-ZipAR/autoregressive/models/generate_zipar.py``, ``Lumina-mGPT-ZipAR/.../modeling_chameleon.py``;
PJD: ``scheduler/jacobi_iteration_lumina_mgpt.py``) keep every row's committed prefix in the KV cache,
RoPE at the token's final raster position, attention causal in raster order. Here the cache stays
append-only and remembers each slot's stream position (``KVCache.track_positions``): a query at stream
position t sees a cached token iff its position is < t (rows above: their committed prefixes; its own
row: its prefix; rows below: never). RoPE comes from the stream position as for every method (LlamaGen's
2-D table by the cell, the 1-D families by the position), so no family code is involved.

Row r's *chain* in a round is ``[x, d_1, .., d_{v-1}]``: x its last committed token (not yet cached) at
stream position r*S + c_r - 1 (S = ``layout.stride``, c_r its committed image tokens), then drafts at
the next positions (PJD; ZipAR feeds x alone). The law after chain slot k is that of column c_r + k.
After the forward, row r keeps in the cache the first n_r slots of its chain when it commits n_r tokens
(official rollback: "keep the first count fed tokens", pjd_zipar_brief A1-6): every kept token saw only
committed tokens; the last committed one is fed next round.

Row starts and row ends (the lead token of row r + 1 is the stream token before its column 0):
- row-end layouts (Lumina-mGPT, Anole, Emu3: ``row_end`` forced tokens after each row): row r + 1 starts
  once row r has ``lag`` image tokens; row r's forced tail is committed then (the official codes append
  the EOL when the next row starts) and fed as row r + 1's lead (its last token is row r + 1's x at
  column 0). The forced tail of the last row is committed when that row completes. Row ends are forced,
  never drafted: every chain is clipped to its row's image tokens.
- no row end (LlamaGen, Janus): column 0 of row r + 1 is predicted by a query at cell (r, W - 1), which
  does not exist while row r is incomplete. As official LlamaGen-ZipAR (generate_zipar.py:199-206) a
  *placeholder* is fed there: the last committed token of row r - 1. Unlike the official code its KV is
  not kept (official: it stays in slot (r, W - 1) and is attended until overwritten), so no later
  query sees a token that is not in the image. Row 1 has no row r - 1: it starts once row 0 is complete
  (as official, where row 0 is plain AR: 34 forwards for 8x8 at window 3).
- a complete row whose last token is not cached feeds it once more ("finishing", official prepend
  of a finished row's last token, sched:486-507; generate_zipar.py:146-152); the last row never needs it.

Fed-to-fed mask (query i, key j of the same sample): i = j, or j a key at a smaller stream position of
the same row, or of another row when j is a committed token (x, a row end, a finishing token) or
``rcm`` is off. ``rcm`` on is PJD's Row-Causal Mask: drafts of other rows are never seen (the intended
rule, for every row; the official code's mask misses rows past the second, pjd_zipar_brief A6-1).
Samples of a batch keep their own rows (no lock-step); a block is padded to the longest sample with
dummy slots that see only themselves and are never kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import rows_at
from .base import DecodeContext


@dataclass
class RowStats:
    """What a 2-D decode reports (``Stats.extra``), summed over samples: image tokens committed by the top
    row (every row above complete) and by lower rows, the (sample, row, round) triples in which a lower
    row predicted, and the mean rows predicting per sample and round."""

    top_tokens: float
    lower_tokens: float
    lower_row_rounds: float
    mean_rows_in_flight: float


@dataclass(frozen=True)
class Block:
    """One round's fed block (compact, (B, F)) and where each row's slots sit in it."""

    tokens: torch.Tensor  # (B, F)
    positions: torch.Tensor  # (B, F) stream positions
    mask: torch.Tensor  # (B, F, F) query i sees fed key j
    index: torch.Tensor  # (B, H, G) block slot of each row's group slot (pre..., x, d_1, ...), -1 not fed
    keepable_x: torch.Tensor  # (B, H) x is a real committed token not yet cached
    c: torch.Tensor  # (B, H) committed image tokens per row when the block was built
    finishing: torch.Tensor  # (B, H) the row is complete and feeds its last token to cache it
    due_tail: torch.Tensor  # (B, H) the forced tail before the row (row r - 1's) is committed this round


def _compact(flags: torch.Tensor, *values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Per sample, the entries with ``flags`` first in their order: (order (B, m), count (B,), values (B, m)),
    m the largest count (one host read)."""
    order = torch.sort((~flags).to(torch.int8), dim=1, stable=True).indices
    count = flags.sum(1)
    m = max(int(count.max()), 1)
    order = order[:, :m]
    return order, count, [v.gather(1, order) for v in values]


MAX_ROWS = 256
"""Image rows a 2-D method supports; its ``pad`` (scratch cache slots). A round feeds tokens at distinct
uncached stream positions, except at most one per row (a placeholder at a drafted position, or the
token above column 0 re-fed while its row above caches it), so the cache needs the stream plus one
slot per row."""


class Rows:
    """Row state of a 2-D decode over the grid of ``ctx.layout``: per sample and image row, ``c`` the
    committed image tokens, ``started``, ``tail_cached`` (the forced tail before the row is cached) and
    ``last_cached`` (a complete row's last token is cached). ``lag``: row r + 1 starts once row r has
    ``lag`` image tokens (clipped to the width). ``chain``: the longest chain a row feeds (x + drafts).
    The grid's geometry: ``height``, ``width``, ``row_end`` (row-end ids after each row), ``stride``
    (stream positions per row); ``lead_tail`` (row-end ids a starting row feeds before x: all but the
    last) and ``group_slots`` (a row's slots in the fed block: lead_tail + chain)."""

    def __init__(self, ctx: DecodeContext, lag: int, chain: int, rcm: bool) -> None:
        lay = ctx.layout
        if lay.height > MAX_ROWS:
            raise ValueError(f"2-D decoding supports at most {MAX_ROWS} image rows, got {lay.height}")
        self.ctx, self.rcm = ctx, rcm
        self.height, self.width, self.row_end, self.stride = lay.height, lay.width, lay.row_end, lay.stride
        self.lag, self.chain = min(lag, self.width), chain
        self.lead_tail = max(self.row_end - 1, 0)  # tail tokens fed before x at a row start (all but the last)
        self.group_slots = self.lead_tail + chain
        B, dev = ctx.n.shape[0], ctx.device
        self.rid = torch.arange(self.height, device=dev)[None].expand(B, -1)
        self.c = torch.zeros(B, self.height, dtype=torch.long, device=dev)
        self.started = torch.zeros(B, self.height, dtype=torch.bool, device=dev)
        self.tail_cached = torch.zeros_like(self.started)
        self.last_cached = torch.zeros_like(self.started)
        self.due_tail = torch.zeros_like(self.started)
        self.tally = torch.zeros(4, dtype=torch.long, device=dev)  # top tokens, lower tokens, lower row-rounds, rows open
        self.sample_rounds = torch.zeros((), dtype=torch.long, device=dev)


    def start(self) -> None:
        """Token (0, 0) is committed (the prefill's law): row 0 runs, and the target cache tracks positions."""
        self.ctx.target.track_positions()
        self.started[:, 0] = True
        self.c[:, 0] = 1
        self._last_row_done()

    def restart(self, fresh: torch.Tensor) -> None:
        """Samples ``fresh`` (B,) bool start anew (continuous batching: their first token is committed)."""
        f = fresh[:, None]
        self.c = torch.where(f, 0, self.c)
        for flags in (self.started, self.tail_cached, self.last_cached, self.due_tail):
            flags.masked_fill_(f, False)
        self.started[:, 0] |= fresh
        self.c[:, 0] += fresh.long()
        self._last_row_done()

    # ------------------------------------------------------------------ row schedule
    @property
    def open(self) -> torch.Tensor:
        """(B, H) rows that predict tokens this round."""
        return self.started & (self.c < self.width)

    @property
    def finishing(self) -> torch.Tensor:
        return self.started & (self.c >= self.width) & ~self.last_cached

    @property
    def top(self) -> torch.Tensor:
        """(B, H) the first incomplete row: every row above it is complete (its context is AR's)."""
        complete = (self.c >= self.width).long()
        above = torch.nn.functional.pad(complete.cumprod(1), (1, 0), value=1)[:, :-1].bool()
        return self.open & above

    def above(self) -> torch.Tensor:
        """(B, H) committed image tokens of the row above (the width for row 0)."""
        return torch.nn.functional.pad(self.c, (1, 0), value=self.width)[:, :-1]

    def begin_round(self) -> None:
        """Start every row whose row above has ``lag`` image tokens (no row end: row 1 waits for row 0
        to complete, its placeholder would come from row -1)."""
        up = self.above()
        prev_started = torch.cat([torch.ones_like(self.started[:, :1]), self.started[:, :-1]], 1)
        can = ~self.started & (self.rid > 0) & prev_started & (up >= self.lag)
        if self.row_end == 0:
            can &= (self.rid >= 2) | (up >= self.width)
        self.started |= can
        self.due_tail = can if self.row_end > 0 else torch.zeros_like(can)

    def _last_row_done(self) -> None:
        """The last row never feeds its last token (nothing below needs it)."""
        self.last_cached[:, -1] |= self.c[:, -1] >= self.width

    # ------------------------------------------------------------------ the fed block
    def block(self, v: torch.Tensor, drafts: torch.Tensor | None) -> Block:
        """The round's fed block: row r feeds its chain of ``v[b, r]`` slots (x then ``drafts[b, r, :v-1]``
        at the next columns), a finishing row its last token, a starting row (row ends) its lead tail."""
        ctx, H, E, S, K, P = self.ctx, self.height, self.row_end, self.stride, self.chain, self.lead_tail
        B, dev = self.c.shape[0], self.c.device
        codes = ctx.layout.vocab_size
        c = self.c
        finishing = self.finishing
        v = torch.where(finishing, torch.ones_like(v), torch.where(self.open, v, torch.zeros_like(v)))
        base = self.rid * S
        L = ctx.tokens.shape[1]
        tok_at = lambda pos: ctx.tokens.gather(1, pos.clamp(0, L - 1).flatten(1)).view(pos.shape)
        # x: the last committed token, or the lead at column 0
        px = base + c - 1
        lead = c == 0
        if E > 0:
            x = torch.where(lead, torch.full_like(c, codes + E - 1), tok_at(px))
            key_x = ~(lead & self.tail_cached)
            real_x = key_x
        else:
            filled = ctx.filled.gather(1, px.clamp(0, L - 1))
            c2 = torch.nn.functional.pad(c, (2, 0))[:, :-2]  # row r - 2's committed tokens
            holder = tok_at((self.rid - 2) * S + c2 - 1)  # placeholder: row r - 2's last committed token
            x = torch.where(lead & ~filled, holder, tok_at(px))
            key_x = ~(lead & filled)  # a complete row above feeds (or has cached) that token itself
            real_x = key_x & ~lead
        # group slots: P tail tokens, x, K - 1 drafts
        k = torch.arange(K - 1, device=dev)
        d_pos = px[..., None] + 1 + k
        d_tok = drafts if drafts is not None else torch.zeros(B, H, K - 1, dtype=torch.long, device=dev)
        i = torch.arange(P, device=dev)
        t_pos = base[..., None] - E + i
        t_tok = (codes + i).expand(B, H, P)
        t_fed = (lead & ~self.tail_cached & (v > 0))[..., None].expand(-1, -1, P)
        tokens = torch.cat([t_tok, x[..., None], d_tok[..., : K - 1]], 2)
        pos = torch.cat([t_pos, px[..., None], d_pos], 2)
        fed = torch.cat([t_fed, (v > 0)[..., None], k[None, None] + 1 < v[..., None]], 2)
        key = torch.cat([torch.ones_like(t_fed), key_x[..., None], torch.ones_like(d_pos, dtype=torch.bool)], 2)
        committed = torch.cat([torch.ones_like(t_fed), real_x[..., None], torch.zeros_like(d_pos, dtype=torch.bool)], 2)
        row = self.rid[..., None].expand(-1, -1, self.group_slots)
        flat = lambda t: t.reshape(B, H * self.group_slots)
        order, count, (tok, ps, ky, cm, rw) = _compact(flat(fed), flat(tokens), flat(pos), flat(key), flat(committed), flat(row))
        F = order.shape[1]
        j = torch.arange(F, device=dev)
        valid = j[None] < count[:, None]
        tok, ps = torch.where(valid, tok, 0), torch.where(valid, ps, 0)
        index = torch.full((B, H * self.group_slots), -1, dtype=torch.long, device=dev)
        index.scatter_(1, order, torch.where(valid, j[None].expand(B, -1), -1))
        see = (valid & ky)[:, None, :] & (ps[:, None, :] < ps[:, :, None])
        if self.rcm:
            see &= (rw[:, None, :] == rw[:, :, None]) | cm[:, None, :]
        mask = see | torch.eye(F, dtype=torch.bool, device=dev)[None]
        return Block(tok, ps, mask, index.view(B, H, self.group_slots), real_x, c.clone(),
                     finishing, self.due_tail.clone())

    def chain_laws(self, block: Block, law: torch.Tensor) -> torch.Tensor:
        """(B, H, K, ...) the law after each chain slot (x: column c, d_k: column c + k) from the block's
        laws (B, F, ...); slots not fed get the block's first law (never used)."""
        B = law.shape[0]
        idx = block.index[:, :, self.lead_tail:].clamp_min(0).reshape(B, -1)
        return rows_at(law, idx).view(B, self.height, self.chain, *law.shape[2:])

    # ------------------------------------------------------------------ commit and cache
    def commit(self, block: Block, n: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Commit ``n[b, r]`` tokens ``values[b, r, :n]`` at row r's next columns (and the round's forced
        tails), keep in the target cache each row's first n chain slots (its tail with its x; a finishing
        row's last token), advance the rows. Returns the per-sample count committed."""
        ctx, H, W, E, S, K, P = self.ctx, self.height, self.width, self.row_end, self.stride, self.chain, self.lead_tail
        B, dev = n.shape[0], n.device
        codes = ctx.layout.vocab_size
        c = block.c
        open_, top = self.open, self.top
        n = torch.where(open_, n, torch.zeros_like(n))
        lower = open_ & ~top
        self.tally += torch.stack([(n * top).sum(), (n * lower).sum(), lower.sum(), open_.sum()])
        self.sample_rounds += open_.any(1).sum()
        base = self.rid * S
        e = torch.arange(E, device=dev)
        k = torch.arange(K, device=dev)
        done_after = c + n >= W
        last_tail = (self.rid == H - 1) & done_after & self.open  # the last row completes: its row end
        parts_tok = [(codes + e).expand(B, H, E), values[..., :K], (codes + e).expand(B, H, E)]
        parts_pos = [base[..., None] - E + e, base[..., None] + c[..., None] + k, base[..., None] + W + e]
        parts_ok = [block.due_tail[..., None].expand(-1, -1, E), k < n[..., None], last_tail[..., None].expand(-1, -1, E)]
        flat = lambda ts: torch.cat(ts, 2).reshape(B, -1)
        _, count, (tok, at) = _compact(flat(parts_ok), flat(parts_tok), flat(parts_pos))
        ctx.commit(tok, count, at)
        # the cache keeps: each row's first n chain slots (x only if real and uncached), its tail with x
        kx = block.keepable_x & (n >= 1) | block.finishing
        keep_chain = torch.cat([kx[..., None], (k[1:] < n[..., None])], 2)
        keep = torch.cat([(kx & (c == 0))[..., None].expand(-1, -1, P), keep_chain], 2) & (block.index >= 0)
        flat_keep = keep.reshape(B, -1)
        slot = block.index.reshape(B, -1)
        _, kept, (idx,) = _compact(flat_keep, slot)
        idx = torch.where(torch.arange(idx.shape[1], device=dev)[None] < kept[:, None], idx, 0)  # ascending
        ctx.target.keep_block(idx, kept)
        # advance
        if E > 0:
            self.tail_cached |= kx & (c == 0)
        self.last_cached |= block.finishing
        self.c = c + n
        self._last_row_done()
        return count

    def stats(self) -> RowStats:
        """The decode's ``RowStats`` (one host read)."""
        top, low, rounds, open_ = self.tally.tolist()
        return RowStats(float(top), float(low), float(rounds), open_ / max(int(self.sample_rounds), 1))
