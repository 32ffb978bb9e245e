"""The exactness harness: enumerate the exact law of docs/design/api.md on tiny models and test a method's
empirical law against it with a chi-square test. Later methods plug in through ``check_method``.

The joint law of a whole grid is the product over positions of the sampling law
(CFG -> temperature -> top-k -> top-p -> softmax) of the teacher-forced target logits, so it is
computed for all V**L grids by one batched ``logits`` call per condition, through the tests' own
implementation of the pipeline (tests/reference.py), never through ``specvis.sampling``. The tiny
models' laws depend on the whole prefix and on position (``dependence``), so a method that
conditions on the wrong context or position shifts the law, not only one that mis-samples.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from scipy import stats as sps

import specvis as sv
from specvis.generate import stream_order
from reference import sampling_law

N_SAMPLES = 20_000  # per configuration, split evenly over its conditions
BATCH = 10_000


def tiny_llamagen(seed: int, vocab: int = 4, grid: int = 2, dim: int = 32, n_layer: int = 2,
                  num_classes: int = 3, sharpness: float = 12.0, attention: float = 30.0,
                  value: float = 5.0, embed: float = 1.0) -> sv.models.LlamaGen:
    """A random LlamaGen whose next-token law depends on the whole prefix and on position.

    At its random initialisation attention is nearly uniform and the residual stream carries the
    current token only, so the law depends almost only on the previous token (measured: TV <= 0.03
    for any earlier token, <= 0.02 for a shift of position). Scaling the query/key projections by
    ``attention`` makes attention sharp and position-selective (2D RoPE), scaling values and the
    attention output by ``value`` lets what it reads dominate, and the output head scaled by
    ``sharpness`` keeps the laws far from uniform but spread enough for a chi-square test.
    ``dependence`` measures both effects; tests assert they are large."""
    torch.manual_seed(seed)
    cfg = sv.models.LlamaGenConfig(vocab_size=vocab, dim=dim, n_layer=n_layer, n_head=2,
                                   num_classes=num_classes, block_size=grid * grid, multiple_of=16)
    model = sv.models.LlamaGen(cfg).eval()
    with torch.no_grad():
        model.output.weight.mul_(sharpness)
        model.tok_embeddings.weight.mul_(embed)
        model.cls_embedding.embedding_table.weight.mul_(embed)
        sharpen_attention(model, attention, value)
    return model


# the methods and sampling run on ``cpu_models`` in other dtypes (bf16, int8): one of each walk and draft kind
CPU_SAMPLING = sv.Sampling(temperature=0.7, cfg_scale=2.5, noise="stream")
CPU_METHODS = {
    "ar": sv.AR(),
    "speculative": sv.Speculative(3),
    "sjd": sv.SJD(window=3, init="vertical-sample", coupling="gumbel"),
    "static-tree": sv.StaticTree(tree="chain"),
}


def cpu_models(dtype: torch.dtype = torch.float32):
    """The harness's (target, draft, EAGLE drafter) in ``dtype``, their linear layers prepared as
    ``sv.load`` prepares them on CPU (``models.weight_layout.prepare_cpu_linears``: packed kernels)."""
    from specvis.models.drafter import EagleDrafter
    from specvis.models.weight_layout import prepare_cpu_linears

    target = tiny_llamagen(0).to(dtype)
    draft = tiny_llamagen(1, dim=16, n_layer=1, sharpness=25.0).to(dtype)
    drafter = EagleDrafter.from_target(target, seed=1).eval().to(dtype)
    prepare_cpu_linears(target, draft, drafter)
    return target, draft, drafter


def sharpen_attention(model, attention: float, value: float) -> None:
    """Scale every layer's query/key rows by ``attention`` and its value rows and output by ``value``."""
    cfg = model.config
    q_size, kv_size = cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim
    for layer in model.layers:
        w = layer.attention.wqkv.weight
        w[: q_size + kv_size].mul_(attention)
        w[q_size + kv_size:].mul_(value)
        layer.attention.wo.weight.mul_(value)


def tiny_prompt_model(seed: int, vocab: int = 3, height: int = 2, width: int = 2, row_end: int = 0,
                      janus: bool = True, dim: int = 32, text_vocab: int = 12, sharpness: float = 12.0,
                      attention: float = 30.0, value: float = 5.0) -> sv.models.PromptDecoder:
    """A random text-conditioned decoder of either family's shape, sharpened like ``tiny_llamagen``:
    ``janus``: separate code embedding + MLP aligner + MLP head, the pad-prompt CFG rule; else Emu3's:
    codes (and ``row_end`` structural ids) embedded through the text table, a linear head over the
    codes. Three harness prompts of different lengths with their unconditional prompts are attached
    as ``harness_prompts`` [(cond ids, uncond ids)]; the harness's condition c is prompt c."""
    from torch import nn

    from specvis.models.base import Layout, Prompts
    from specvis.models.decoder import AlignedEmbedding, DecoderConfig, MappedEmbedding, MLPHead, PromptDecoder

    torch.manual_seed(seed)
    cfg = DecoderConfig(dim=dim, n_layer=2, n_head=2, n_kv_head=1, ffn_hidden=64, text_vocab_size=text_vocab,
                        max_positions=64)
    layout = Layout(height, width, vocab, row_end)
    if janus:
        embed, head, rule = AlignedEmbedding(vocab, 8, dim, 2, nn.GELU()), MLPHead(dim, dim, vocab, nn.GELU()), ("keep", (1, 2), 0)
    else:
        embed, head, rule = None, nn.Linear(dim, vocab, bias=False), None
    model = PromptDecoder(cfg, layout, embed, head, unconditional=rule).eval()
    if not janus:  # codes are the last text ids, row ends just before them
        ids = torch.arange(text_vocab - vocab - row_end, text_vocab)
        model.image_embed = MappedEmbedding(model.tok_embeddings, torch.cat([ids[row_end:], ids[:row_end]]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)  # LlamaGen's initializer_range, then tiny_llamagen's scalings
            elif name.endswith("bias"):
                nn.init.zeros_(p)  # a bias would swamp the code embeddings and make codes alike
        if janus:  # unit-scale code embeddings and head input, so both MLPs pass differences on
            embed.codes.weight.mul_(50.0)
            head.proj_out.weight.mul_(1.0 / (0.02 * dim ** 0.5))
        (head.vision_head if janus else head).weight.mul_(sharpness)
        sharpen_attention(model, attention, value)
    prompts = [[1, 5, 3, 2], [1, 4, 4, 6, 7, 2], [1, 8, 2]]
    if janus:
        uncond = [model.unconditional(Prompts.of([p])).ids[0].tolist() for p in prompts]
    else:
        uncond = [[1, 9, 2]] * 3  # one fixed negative prompt, as Emu3
    model.harness_prompts = list(zip(prompts, uncond))
    return model


def condition_rows(model, conditions: list[int], idx: torch.Tensor | None = None):
    """What ``sv.generate`` takes for harness conditions ``conditions[idx]``: class ids, or for a
    prompt model a ``Condition`` of its harness prompts and their unconditional prompts."""
    chosen = [conditions[i] for i in idx.tolist()] if idx is not None else list(conditions)
    pairs = getattr(model, "harness_prompts", None)
    if pairs is None:
        return torch.tensor(chosen)
    from specvis.models.base import Condition, Prompts

    return Condition(Prompts.of([pairs[c][0] for c in chosen]), Prompts.of([pairs[c][1] for c in chosen]))


def to_stream(grids: torch.Tensor, layout) -> torch.Tensor:
    """Image grids (G, H*W) -> token streams (G, stream_len) with the forced structural ids inserted."""
    stream = layout.forced().expand(grids.shape[0], -1).clone()
    stream[:, layout.image_index()] = grids
    return stream


def _tv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return 0.5 * (a - b).abs().sum(-1)


@torch.no_grad()
def dependence(model, condition: int = 0) -> tuple[float, float]:
    """(earlier, position): how much the next-token law depends on anything but the previous token.

    earlier: mean over every context x_<i (i >= 2) of the largest TV between p(. | x_<i) and the law
    after changing one token x_j, j < i - 1, to another code. position: mean TV between the laws of
    the cached forward at positions 0..L-2 and at the same tokens fed one position later."""
    V, L = model.layout.vocab_size, model.layout.num_tokens
    grids = all_grids(V, L - 1)
    c = torch.full((grids.shape[0],), condition)
    p = torch.softmax(model.logits(c, grids), -1)
    worst = torch.zeros(grids.shape[0], L)
    for j in range(L - 2):
        for d in range(1, V):
            changed = grids.clone()
            changed[:, j] = (changed[:, j] + d) % V
            tv = _tv(p, torch.softmax(model.logits(c, changed), -1))
            worst[:, j + 2:] = torch.maximum(worst[:, j + 2:], tv[:, j + 2:])
    earlier = float(worst[:, 2:].mean())
    pos = torch.arange(L - 1)[None].expand(grids.shape[0], -1)
    shifted = []
    for offset in (0, 1):
        model.setup_cache(grids.shape[0], 2)
        model.prefill(c)
        shifted.append(torch.softmax(model.forward_tokens(grids, pos + offset)[0], -1))
    model.cache = None
    position = float(_tv(*shifted)[:, :-1].mean())
    return earlier, position


@torch.no_grad()
def dependence_on_prompt(model) -> tuple[float, float]:
    """(prompt, earlier) for a prompt model: mean TV over image contexts between the laws under harness
    prompts 0 and 1; and mean over contexts of the largest TV after changing one earlier image token
    (not the previous one), as ``dependence`` measures it. Image positions only."""
    layout = model.layout
    V, L = layout.vocab_size, layout.num_tokens
    grids = all_grids(V, L - 1)
    image = layout.image_index()

    def laws(c: int, g: torch.Tensor) -> torch.Tensor:
        stream = to_stream(torch.cat([g, torch.zeros_like(g[:, :1])], 1), layout)[:, :-1]
        rows = condition_rows(model, [c] * g.shape[0])
        return torch.softmax(model.logits(rows.cond, stream)[:, image], -1)

    p0 = laws(0, grids)
    prompt = float(_tv(p0, laws(1, grids)).mean())
    worst = torch.zeros(grids.shape[0], L)
    for j in range(L - 2):
        for d in range(1, V):
            changed = grids.clone()
            changed[:, j] = (changed[:, j] + d) % V
            tv = _tv(p0, laws(0, changed))
            worst[:, j + 2:] = torch.maximum(worst[:, j + 2:], tv[:, j + 2:])
    return prompt, float(worst[:, 2:].mean())


def all_grids(vocab: int, length: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product(range(vocab), repeat=length)), dtype=torch.long)


@torch.no_grad()
def exact_law(model, conditions: list[int], sampling: sv.Sampling) -> torch.Tensor:
    """(len(conditions), V**L) exact probability of every image grid under ``sampling``; structural
    positions are forced, so only image positions carry probability."""
    layout = model.layout
    V, L = layout.vocab_size, layout.num_tokens
    device = next(model.parameters()).device
    grids = all_grids(V, L).to(device)
    stream, image = to_stream(grids, layout), layout.image_index()
    laws = []
    for c in conditions:
        rows = condition_rows(model, [c] * grids.shape[0])
        cond, uncond = (rows.cond, rows.uncond) if hasattr(rows, "cond") else (rows.to(device), None)
        p = sampling_law(model, cond, stream[:, :-1], sampling, uncond)[:, image]  # (G, L, V), tests/reference.py
        laws.append(p.gather(-1, grids.cpu()[..., None]).squeeze(-1).prod(-1))
    law = torch.stack(laws)
    assert torch.allclose(law.sum(-1), torch.ones(len(conditions), dtype=torch.float64), atol=1e-5)
    return law


def grid_index(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    weights = vocab ** torch.arange(tokens.shape[1] - 1, -1, -1)
    return (tokens * weights).sum(-1)


def sample_counts(model, conditions: list[int], method, sampling: sv.Sampling, n: int = N_SAMPLES,
                  batch: int = BATCH, **kw) -> np.ndarray:
    """Counts (len(conditions), V**L) of the grids that ``method`` produced in n samples in all,
    generated in batches that mix all conditions (so per-row independence is exercised). Under keyed noise
    image k of a call has seed s + k, so batch j starts at seed 1000 + (its first sample): every sample
    has a seed of its own."""
    V, L = model.layout.vocab_size, model.layout.num_tokens
    counts = np.zeros((len(conditions), V ** L))
    total = n
    keyed = sampling.resolved(stream_order(model, None)).keyed  # noise=None: the model's default, as generate runs it
    for seed, start in enumerate(range(0, total, batch)):
        rows = min(batch, total - start)
        idx = (torch.arange(start, start + rows) % len(conditions))
        first = 1000 + (start if keyed else seed)
        out = sv.generate(model, condition_rows(model, conditions, idx), method, sampling, seed=first, **kw)
        g = grid_index(out.tokens.cpu(), V)
        np.add.at(counts, (idx.numpy(), g.numpy()), 1)
    return counts


def chi_square_pvalue(counts: np.ndarray, law: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson chi-square of counts against the law; bins with expected < min_expected are pooled."""
    expected = law.numpy() * counts.sum(-1, keepdims=True)
    obs, exp = counts.ravel(), expected.ravel()
    big = exp >= min_expected
    o = np.append(obs[big], obs[~big].sum())
    e = np.append(exp[big], exp[~big].sum())
    if e[-1] < min_expected:  # pooled bin too small: fold it into the last big bin
        o[-2] += o[-1]
        e[-2] += e[-1]
        o, e = o[:-1], e[:-1]
    # impossible outcomes (exact law 0) observed at all are a failure on their own
    if obs[exp == 0].sum() > 0:
        return 0.0
    return float(sps.chisquare(o, e * o.sum() / e.sum()).pvalue)


def check_method(model, method, sampling: sv.Sampling, conditions=(0, 1, 2), **kw) -> float:
    """p-value of the chi-square test of ``method``'s output law against the exact law."""
    law = exact_law(model, list(conditions), sampling)
    return chi_square_pvalue(sample_counts(model, list(conditions), method, sampling, **kw), law)
