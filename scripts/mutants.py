"""Plant one-line bugs and check that the test suite catches each one.

Each mutant replaces one line of the library (the ``old`` text must occur exactly once, so a stale
mutant is an error, not a silent pass) in a scratch copy of the repository, then runs the tests that
guard that line; the mutant is caught when they fail. Prints a table and, with --out, writes it as
markdown. Run from the repository root: ``python scripts/mutants.py --out docs/mutants.md``
(one torch thread per test process; about 10-20 minutes on a 2-core machine).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ORACLE = "tests/test_oracle.py"
EXACT = "tests/test_exactness.py"
PROMPT = "tests/test_prompt_core.py"
HOSTILE = "tests/test_hostile_inputs.py"
ROWS2D = "tests/test_rows2d.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]  # pytest arguments, run in order with -x


MUTANTS = [
    Mutant("scale: KV plan counts keys but not values", "specvis/models/base.py",
           "return self.layers * 2 * self.heads", "return self.layers * self.heads",
           ("tests/test_memory.py", "-k", "planned")),
    Mutant("scale: a plan that does not fit is let through", "specvis/memory.py",
           "return self.free_bytes is None or self.needed_bytes <= self.free_bytes",
           "return self.free_bytes is None or self.needed_bytes >= self.free_bytes",
           ("tests/test_memory.py", "-k", "not_fit")),
    Mutant("scale: modules built with initialised parameters", "specvis/models/loading.py",
           "if param is not None and not param.is_meta:", "if False:",
           ("tests/test_loading.py", "-k", "initialises")),
    Mutant("scale: default dtype keeps bf16 on a CPU that cannot tell its features", "specvis/models/loading.py",
           "    if native:\n", "    if native is not False:\n", ("tests/test_loading.py", "-k", "default_dtype_rule")),
    Mutant("scale: pages of a read tensor not handed back", "specvis/models/loading.py",
           "    elif drop_pages(t):\n        _trace(\"drop\", key)",
           "    elif False:\n        _trace(\"drop\", key)",
           ("tests/test_loading.py", "-k", "one_shard")),
    Mutant("scale: a tensor the loader kept as a weight has its pages dropped", "specvis/models/loading.py",
           "    if kept(key):\n", "    if False:\n", ("tests/test_loading_paths.py", "-k", "mapping")),
    Mutant("scale: a file tensor of another dtype left mapped as the weight", "specvis/models/loading.py",
           "and dtype in MAPPED_DTYPES and dest.is_floating_point() and src.dtype == dtype",
           "and dtype in MAPPED_DTYPES and dest.is_floating_point()",
           ("tests/test_loading_paths.py", "-k", "converting")),
    Mutant("scale: a quantized load keeps float weights mapped", "specvis/models/loading.py",
           "if finish is None and len(pieces) == 1 and maps_in_place(", "if len(pieces) == 1 and maps_in_place(",
           ("tests/test_loading_paths.py", "-k", "converting")),
    Mutant("scale: mapped weights planned as free memory", "specvis/models/weight_layout.py",
           "return max(0, int(line.split()[1]) * 1024 - mapped_weight_bytes())",
           "return max(0, int(line.split()[1]) * 1024)", ("tests/test_loading_paths.py", "-k", "available")),
    Mutant("scale: rows filled twice not seen", "specvis/models/loading.py",
           "        overlap |= start < end\n", "        overlap |= False\n", ("tests/test_loading_paths.py", "-k", "routes")),
    Mutant("scale: rows missing at a destination's end not seen", "specvis/models/loading.py",
           "    return gap or end < n, overlap", "    return gap, overlap", ("tests/test_loading_paths.py", "-k", "routes")),
    Mutant("scale: every shard opened, wanted tensors or not", "specvis/models/loading.py",
           "return safetensors_tensors(needed, wanted, kept)", "return safetensors_tensors(files, wanted, kept)",
           ("tests/test_loading.py", "-k", "one_shard")),
    Mutant("scale: int8 product rows mixed across a block's positions", "specvis/models/quantize.py",
           "return y.view(*x.shape[:-1], self.out_features)",
           "return y.view(*reversed(x.shape[:-1]), self.out_features).transpose(0, 1)",
           ("tests/test_quantize.py", "-k", "exact")),
    Mutant("speculative: target positions shifted by one", "specvis/methods/speculative.py",
           "ctx.positions(n - 1, g + 1))", "ctx.positions(n, g + 1))", (ORACLE, "-k", "speculative", EXACT)),
    Mutant("accept: rejected drafts stay in the target cache (speculative keeps n + gamma)", "specvis/methods/base.py",
           "self.target.set_committed(self.n - 1)", "self.target.set_committed(self.n - 1 + verdict.block.shape[1] - count)",
           (ORACLE, "-k", "speculative", EXACT)),
    Mutant("accept: keep index off by one (the last committed token counted as cached)", "specvis/methods/base.py",
           "self.target.set_committed(self.n - 1)", "self.target.set_committed(self.n)",
           (ORACLE, "-k", "sjd or static", "tests/test_sjd.py", "tests/test_static_tree.py")),
    Mutant("accept: a tree's kept slots commit count + 1", "specvis/methods/base.py",
           "self.target.keep_block(verdict.keep, count)", "self.target.keep_block(verdict.keep, count + 1)",
           (ORACLE, "-k", "eagle or adt", "tests/test_tree.py")),
    Mutant("verify: a chain's block keeps the rejected draft (no residual token in its place)", "specvis/methods/round.py",
           "block = torch.cat([chain.tokens, nxt[:, None]], 1).scatter(1, accepted[:, None], nxt[:, None])",
           "block = torch.cat([chain.tokens, nxt[:, None]], 1)", (EXACT, "-k", "speculative", "tests/test_sjd.py")),
    Mutant("verify: a tree walked with the chain rule (q = p: the first candidate always accepted)", "specvis/methods/round.py",
           "alpha, residual = rule.sibling(p, c_tok[..., r], **kw)", "alpha, residual = rule(p, p, c_tok[..., r], **kw)",
           ("tests/test_tree.py", "-k", "exact")),
    Mutant("sjd: positions shifted by one", "specvis/methods/sjd.py",
           "p = target.forward(feed, ctx.positions(n - 1, W + 1))", "p = target.forward(feed, ctx.positions(n, W + 1))",
           (ORACLE, "-k", "sjd", "tests/test_sjd.py")),
    Mutant("trees: positions shifted by one", "specvis/methods/eagle.py",
           "positions = (n - 1)[:, None] + torch.cat", "positions = n[:, None] + torch.cat", (ORACLE, "-k", "eagle or adt", "tests/test_tree.py")),
    Mutant("cache: keep_block moves no slot", "specvis/models/base.py",
           "for t in (self.k, self.v):", "for t in ():", (ORACLE, "-k", "eagle or adt", "tests/test_tree.py")),
    Mutant("cache: keep_block copies the next row's slots", "specvis/models/base.py",
           "t[:, rows, :, dst] = t[:, rows, :, src]", "t[:, rows, :, dst] = t[:, rows.roll(1, 0), :, src]",
           (ORACLE, "-k", "eagle or adt", "tests/test_tree.py")),
    Mutant("trees: a branching tree's path taken as in place (no cache move)", "specvis/methods/round.py",
           "return Verdict(accepted, block, keep=torch.cat([torch.zeros_like(accepted)[:, None], path], 1))",
           "return Verdict(accepted, block)",
           (ORACLE, "-k", "eagle or adt or static", "tests/test_tree.py")),
    Mutant("cache: keep_block commits count + 1", "specvis/models/base.py",
           "self.length += count  #", "self.length += count + 1  #",
           (ORACLE, "-k", "eagle or adt", "tests/test_tree.py")),
    Mutant("cache: set_committed rebinds the length tensor (breaks captured rounds)", "specvis/models/decoder.py",
           "self.cache.length.copy_(n_fed + self.prefix_lengths)", "self.cache.length = n_fed + self.prefix_lengths",
           ("tests/test_rounds.py",)),
    Mutant("cache: a block token attends to the next draft", "specvis/models/base.py",
           "(offset[:, None, :] <= j[None, :, None])", "(offset[:, None, :] <= j[None, :, None] + 1)", (ORACLE, EXACT)),
    Mutant("exact: swapped residual max(0, q - p)", "specvis/accept.py",
           "return alpha, (p - q).clamp_min(0.0)", "return alpha, (q - p).clamp_min(0.0)", (EXACT, "tests/test_sjd.py")),
    Mutant("exact: acceptance q/p instead of p/q", "specvis/accept.py",
           "px / qx.clamp_min(1e-30)", "qx / px.clamp_min(1e-30)", (EXACT, "tests/test_sjd.py")),
    Mutant("chain: bonus token from the last draft's law", "specvis/accept.py",
           "law = torch.where((accepted < g)[:, None], rejected, p[:, g])",
           "law = torch.where((accepted < g)[:, None], rejected, p[:, g - 1])", (EXACT, "tests/test_sjd.py")),
    Mutant("exact sibling: rejected candidate kept in the residual", "specvis/accept.py",
           "return alpha, p.scatter(-1, x[..., None], 0.0)", "return alpha, p", ("tests/test_tree.py",)),
    Mutant("static tree: q not renormalised after removing the rejected sibling", "specvis/accept.py",
           "return alpha, residual, without(q, x)", "return alpha, residual, q.scatter(-1, x[..., None], 0.0)",
           ("tests/test_static_tree.py",)),
    Mutant("continuous law: log-ratio sign (log q_traj - log p_traj)", "specvis/methods/laws.py",
           "    return log_p - log_q\n", "    return log_q - log_p\n", ("tests/test_cspd.py", "-k", "exact_variants")),
    Mutant("continuous law: the paper ratio's target run ignores the draft's noise (align dropped)",
           "specvis/methods/laws.py",
           "p.run(generator, x_T=q_runs.states[:, 0], noise=q_runs.noise) if align else p.run(generator)",
           "p.run(generator)", ("tests/test_cspd.py", "-k", "sigma")),
    Mutant("accept: a block given stream positions written at the rows' next positions (at ignored)",
           "specvis/methods/base.py", "(self.n[:, None] + j if at is None else at).clamp_max", "(self.n[:, None] + j).clamp_max",
           ("tests/test_cspd_mar.py", "-k", "draw_for_draw")),
    Mutant("ordered: a step reveals the order's positions from its start, not its end", "specvis/methods/ordered.py",
           "return self.order[:, self.starts[s]:self.starts[s] + self.reveals[s]]",
           "return self.order.flip(1)[:, self.starts[s]:self.starts[s] + self.reveals[s]]",
           ("tests/test_cspd_mar.py", "-k", "draw_for_draw")),
    Mutant("static tree: siblings drawn with replacement", "specvis/methods/static_tree.py",
           "            q = without(q, x)\n", "            q = q\n", ("tests/test_static_tree.py",)),
    Mutant("static chain: verified against each node's own law, not its parent's", "specvis/methods/round.py",
           "Chain(tree.tokens[:, 1:], tree.laws[:, :D])", "Chain(tree.tokens[:, 1:], tree.laws[:, 1:])",
           ("tests/test_static_tree.py", "-k", "chain")),
    Mutant("trees: the drafter gets the kept states in reverse order", "specvis/methods/trees.py",
           "return count, rows_at(ctx.target.hidden, cfg_rows(ctx, verdict.slots(m)))",
           "return count, rows_at(ctx.target.hidden, cfg_rows(ctx, verdict.slots(m).flip(1)))",
           ("tests/test_tree.py", "-k", "teacher_forced")),
    Mutant("static chain: the path drops the last accepted node (the drafter gets the root's state)", "specvis/methods/round.py",
           "torch.where(j <= self.accepted[:, None], j,", "torch.where(j < self.accepted[:, None], j,",
           ("tests/test_tree.py", "-k", "teacher_forced", "tests/test_static_tree.py")),
    Mutant("sampling: wrong CFG formula c + s (c - u)", "specvis/sampling.py",
           "return uncond + self.cfg_scale * (cond - uncond)", "return cond + self.cfg_scale * (cond - uncond)",
           (EXACT, "-k", "ar_is_exact")),
    Mutant("sampling: top-k drops the k-th token", "specvis/sampling.py",
           "logits.masked_fill(logits < kth", "logits.masked_fill(logits <= kth", (EXACT, "-k", "ar_is_exact")),
    Mutant("sampling: top-p keeps one token too few", "specvis/sampling.py",
           "mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs",
           "mass_before = torch.cumsum(sorted_probs, dim=-1)", (EXACT, "-k", "ar_is_exact and topp")),
    Mutant("sampling: temperature multiplies", "specvis/sampling.py",
           "logits = logits / self.temperature", "logits = logits * self.temperature", (EXACT, "-k", "ar_is_exact")),
    Mutant("cfg: the unconditional half gets the condition", "specvis/models/base.py",
           "return cls(conditions, torch.full_like(conditions, model.null_condition))", "return cls(conditions, conditions.clone())",
           (ORACLE, "-k", "ar", EXACT, "-k", "ar_is_exact")),
    Mutant("adt: acceptance rate without the bonus token", "specvis/methods/adt.py",
           "tau = accepted + 1", "tau = accepted", ("tests/test_tree.py", "-k", "adt")),
    Mutant("greedy lantern: accepts on the hard law (never relaxes)", "specvis/lantern.py",
           "d = self.distorted(soft, x)", "d = self.distorted(p, x)", ("tests/test_lantern.py", "-k", "greedy")),
    Mutant("coupled sjd: maximal coupling without its residual", "specvis/methods/sjd.py",
           "return keep, normalise((p_new - p_old).clamp_min(0.0), p_new)", "return keep, p_new", ("tests/test_coupling.py",)),
    Mutant("coupled sjd: keep probability p_old / p_new", "specvis/methods/sjd.py",
           "keep = u * qx < px", "keep = u * px < qx", ("tests/test_coupling.py",)),
    Mutant("coupled sjd: Gumbel noise redrawn every round", "specvis/methods/sjd.py",
           "race = torch.where(had[..., None], rows_at(self.race, old), fresh)",
           "race = fresh", ("tests/test_coupling.py", "-k", "stays or emoji")),
    Mutant("lantern++: relative budget lam p(x) instead of (lam - 1) p(x)", "specvis/lantern.py",
           "in_a = moved <= (self.lam - 1.0) * px", "in_a = moved <= self.lam * px", ("tests/test_relaxed.py",)),
    Mutant("gsd: min-TV residual without the acceptance function", "specvis/gsd.py",
           "(p - q * f).clamp_min(0.0)", "(p - q).clamp_min(0.0)", ("tests/test_relaxed.py",)),
    Mutant("gsd: cluster window above and below swapped", "specvis/gsd.py",
           "torch.arange(-self.below, self.above + 1", "torch.arange(-self.above, self.below + 1", ("tests/test_relaxed.py",)),
    Mutant("gsd: a structural id joins a code's cluster", "specvis/gsd.py",
           "in_c &= (ids < codes) & (x[..., None] < codes)", "in_c &= in_c", ("tests/test_relaxed.py", "-k", "row_end")),
    Mutant("gsd: no structural ids on row-end layouts (the distance table is short)", "specvis/gsd.py",
           "return BoundGSD(self.spec, self.table, n)", "return self", ("tests/test_relaxed.py", "-k", "row_end")),
    Mutant("adt: vertical init reads n - width (row ends ignored)", "specvis/methods/adt.py",
           "stride = ctx.layout.stride", "stride = ctx.layout.width", ("tests/test_tree.py", "-k", "vertical_init")),
    Mutant("lantern: delta ignored (whole k-neighbourhood merged)", "specvis/lantern.py",
           "in_a = moved <= self.delta", "in_a = moved >= 0", ("tests/test_lantern.py",)),
    Mutant("prompts: every row's RoPE index counts the longest prompt", "specvis/models/decoder.py",
           "self.prefix_lengths.copy_(lengths)", "self.prefix_lengths.fill_(P)", (PROMPT, "-k", "cached or exactness")),
    Mutant("forced: a row-end law is not a point mass", "specvis/methods/views.py",
           "return torch.where((f >= 0)[..., None], point, law)", "return law", (PROMPT, "-k", "exactness and emu3")),
    Mutant("forced: SJD initialises row ends like image tokens", "specvis/methods/sjd.py",
           "draft, q = ctx.force(draft, pos), ctx.force_law(q, pos)", "draft, q = draft, q", (PROMPT, "-k", "never_drafts")),
    Mutant("janus: the unconditional prompt keeps every token", "specvis/models/decoder.py",
           "keep = torch.isin(prompts.ids, torch.as_tensor(rule[1], device=prompts.ids.device))",
           "keep = torch.ones_like(prompts.ids, dtype=torch.bool)", (PROMPT, "-k", "janus")),
    Mutant("import: Hugging Face q/k rows not re-paired for interleaved RoPE", "specvis/families/hf.py",
           "return w.view(heads, 2, d // 2, *w.shape[1:]).transpose(1, 2)", "return w.view(heads, d // 2, 2, *w.shape[1:])",
           ("tests/test_families.py", "-k", "logits")),
    Mutant("emu3: head rows are the first V text tokens, not the visual tokens", "specvis/families/emu3.py",
           'Piece("head.weight", None, rows_of(codes))', 'Piece("head.weight", None, lambda t: t[: len(codes)])',
           ("tests/test_families.py", "-k", "logits")),
    Mutant("chameleon: q/k norm affine not re-paired with the rotated rows", "specvis/families/hf.py",
           "return lambda w: interleave_rows(w.reshape(-1), heads).view(heads, -1)",
           "return lambda w: w.reshape(heads, -1)", ("tests/test_chameleon.py", "-k", "logits")),
    Mutant("t2i training: prompt padding attended", "specvis/models/decoder.py",
           "mask = (idx[None, :, None] >= idx[None, None, :]) & (real[:, None, :] | torch.eye(T, dtype=torch.bool, device=dev))",
           "mask = (idx[None, :, None] >= idx[None, None, :])",
           ("tests/test_train_t2i.py",)),
    Mutant("t2i training: caption dropout keeps the caption", "specvis/train/train_t2i.py",
           "ids = [t if t in self.keep else self.pad for t in ids]", "ids = list(ids)",
           ("tests/test_train_t2i.py",)),
    Mutant("janus export: q/k rows not de-interleaved", "specvis/train/janus_export.py",
           "    return w.reshape(heads, d, *w.shape[1:])[:, inv].reshape(w.shape)", "    return w",
           ("tests/test_janus_export.py",)),

    Mutant("distill: guided law with cond and uncond swapped", "specvis/train/distill.py",
           "sampling.guide(cond.float(), uncond.float())", "sampling.guide(uncond.float(), cond.float())",
           ("tests/test_distill.py",)),
    Mutant("emoji-mar: VQ decodes MAR tokens without the sphere projection", "specvis/families/mar.py",
           "return self.vq.decode_continuous(z.flatten(2).transpose(1, 2))", "return self.vq.decode_latents(z)",
           ("tests/test_emoji_mar.py",)),
    Mutant("grow: norm eps not rescaled with the width", "specvis/train/grow.py",
           ", norm_eps=cfg.norm_eps * cfg.dim / dim)", ")", ("tests/test_grow.py",)),
    Mutant("grow: a new head writes into the residual stream", "specvis/train/grow.py",
           "            w.zero_()\n", "", ("tests/test_grow.py",)),
    Mutant("bundle: a MAR part ships the raw weights, not the EMA", "specvis/train/bundle.py",
           'for k, v in ckpt["model_ema"].items()}', 'for k, v in ckpt["model"].items()}', ("tests/test_emoji_mar.py",)),
    Mutant("compile: CPU compiles anyway", "specvis/pipeline.py",
           'if compile is True and self.device.type == "cpu":', 'if compile is True and self.device.type == "cuda":',
           ("tests/test_compile_policy.py",)),
    Mutant("sampling: Exp(1) race as -log U", "specvis/sampling.py",
           "return u.neg_().log1p_().neg_().clamp_min_(1e-30)", "return u.log_().neg_()", ("tests/test_sampling.py",)),
    Mutant("sampling: float32 uniforms in the sampler (U = 0 draws code 0)", "specvis/sampling.py",
           "u = torch.rand(total.shape, device=probs.device, dtype=torch.float64, generator=generator)",
           "u = torch.rand(total.shape, device=probs.device, dtype=torch.float32, generator=generator)",
           ("tests/test_sampler_floor.py", "-k", "float32_uniform and speculative")),
    Mutant("sampling: the Gumbel race from float32 uniforms (a floor of (V - 1) 2^-24 a draw)", "specvis/sampling.py",
           "u = torch.rand(like.shape, device=like.device, dtype=torch.float64, generator=generator)",
           "u = torch.rand(like.shape, device=like.device, dtype=like.dtype, generator=generator)",
           ("tests/test_sampler_floor.py", "-k", "race_draws or sjd_gumbel")),
    Mutant("acceptance: float32 uniforms (u = 0 accepts any alpha > 0)", "specvis/sampling.py",
           "return torch.rand(shape, device=like.device, dtype=torch.float64, generator=generator)",
           "return torch.rand(shape, device=like.device, generator=generator)",
           ("tests/test_sampler_floor.py", "-k", "float32_uniform and speculative")),
    Mutant("kv cache: values written one slot late", "specvis/models/base.py",
           "self.v[layer][rows, :, slots] = v.transpose(1, 2)",
           "self.v[layer][rows, :, (slots + 1).clamp_max(self.slots - 1)] = v.transpose(1, 2)", (ORACLE,)),
    Mutant("rope: rotation by minus the angle", "specvis/models/decoder.py",
           "xc * torch.view_as_complex(rope.float().contiguous())",
           "xc * torch.view_as_complex(rope.float().contiguous()).conj()", ("tests/test_families.py",)),
    Mutant("auto: close candidates re-probe the first probe batch's classes", "specvis/tune.py",
           'r["runs"].append(probe(model, rows_of(j),', 'r["runs"].append(probe(model, rows_of(0),',
           ("tests/test_auto.py", "-k", "probe_classes")),
    Mutant("auto: close candidates' wall-clock counts their first (cold) run", "specvis/tune.py",
           'sum(st.wall_s for st in r["runs"][1:])', 'sum(st.wall_s for st in r["runs"])', ("tests/test_auto.py", "-k", "wall_clock")),
    Mutant("auto: runs a candidate that ran slower than AR in the probe", "specvis/tune.py",
           'elif best["measured_speedup"] < 1.0:', 'elif best["measured_speedup"] < 0.0:',
           ("tests/test_auto.py", "-k", "slower_than_ar")),
    Mutant("auto: measured speedup upside down", "specvis/tune.py",
           'out["ar_wall_per_image_s"] / r["wall_per_image_s"]', 'r["wall_per_image_s"] / out["ar_wall_per_image_s"]',
           ("tests/test_auto.py", "-k", "slower_than_ar")),
    Mutant("auto: the least probe wall-clock wins within the probe's noise", "specvis/tune.py",
           "if best is not by_curve and not significantly_faster(", "if best is not by_curve and not True or significantly_faster(",
           ("tests/test_auto.py", "-k", "noise")),
    Mutant("auto: the noise test's ratio inverted", "specvis/tune.py",
           "d = [math.log(y / x) for x, y in zip(a, b)]", "d = [math.log(x / y) for x, y in zip(a, b)]",
           ("tests/test_auto.py", "-k", "noise or paired")),
    Mutant("auto: times close candidates below the margin", "specvis/tune.py",
           'r["predicted_speedup"] >= max(margin, best / CLOSE)', 'r["predicted_speedup"] >= best / CLOSE',
           ("tests/test_auto.py", "-k", "margin_are_timed")),
    Mutant("auto: the timed round-robin keeps one order", "specvis/tune.py",
           "(close + [ar])[:: 1 if j % 2 else -1]", "(close + [ar])", ("tests/test_auto.py", "-k", "priced_on_all")),
    Mutant("auto: one timed probe batch at batch > 1", "specvis/tune.py",
           "runs = max(3, -(-PROBE_IMAGES // batch))", "runs = max(2, -(-PROBE_IMAGES // batch))",
           ("tests/test_auto.py", "-k", "probe_classes_spread")),
    Mutant("auto: the bench does not hand auto its workload", "specvis/bench/runner.py",
           'if getattr(m, "probe_classes", ()) is None else m', 'if getattr(m, "probe_classes", ()) is False else m',
           ("tests/test_auto.py", "-k", "workload")),
    Mutant("cpu linear: the packed weight is not repacked after an in-place update", "specvis/models/weight_layout.py",
           "key = (w.data_ptr(), w._version, w.dtype)", "key = (w.data_ptr(), w.dtype)", ("tests/test_weight_layout.py",)),
    Mutant("cpu linear: the packed kernel drops the bias", "specvis/models/weight_layout.py",
           "_linear_pointwise(x, self._packed, self.bias,", "_linear_pointwise(x, self._packed, None,",
           ("tests/test_weight_layout.py",)),
    Mutant("cpu linear: the packed kernel reads the rows in reverse order", "specvis/models/weight_layout.py",
           "return torch.ops.mkldnn._linear_pointwise(x, self._packed,", "return torch.ops.mkldnn._linear_pointwise(x.flip(0), self._packed,",
           ("tests/test_weight_layout.py", "-k", "harness")),
    Mutant("cpu linear: deepcopy and pickling carry the opaque packed copy", "specvis/models/weight_layout.py",
           'return {k: v for k, v in state.items() if k not in ("_packed", "_packed_key")}', "return state",
           ("tests/test_weight_layout.py",)),
    Mutant("cost curve: the warm-up forwards are timed too", "specvis/cost.py",
           "if r and i >= WARM_CALLS:", "if r:",
           ("tests/test_bench_predicted.py", "-k", "warm_calls")),
    Mutant("cpu linear: packed copies ignore the memory budget", "specvis/models/weight_layout.py",
           "if budget_bytes is not None and used + size > budget_bytes:", "if False:",
           ("tests/test_weight_layout.py",)),
    Mutant("live spans: the slots needed booked instead of the span", "specvis/models/base.py",
           "rec[1] += span", "rec[1] += need", ("tests/test_bench_predicted.py", "-k", "live_span")),
    Mutant("pricing: a run's live spans ignored", "specvis/cost.py",
           "return max(0.0, t0 + (t1 - t0) * (float(span) - l0) / (l1 - l0))", 'return float(row["median_s"])',
           ("tests/test_bench_predicted.py", "-k", "live_span")),
    Mutant("pricing: runs' spans merged unweighted", "specvis/cost.py",
           "w[1] += int(c) * float(mean[n])", "w[1] += float(mean[n])", ("tests/test_bench_predicted.py", "-k", "live_span")),
    Mutant("forward seconds: the drafter's not booked", "specvis/methods/views.py",
           "out = self.model.forward_tokens(tokens, *args, **kwargs)\n        self.seconds += time.perf_counter() - t0",
           "out = self.model.forward_tokens(tokens, *args, **kwargs)\n        self.seconds += 0.0",
           ("tests/test_bench_predicted.py", "-k", "forward_seconds")),
    Mutant("forward seconds: a view's forwards not booked", "specvis/methods/views.py",
           "        law = self._law(logits, positions + 1)\n        self.seconds += time.perf_counter() - t0",
           "        law = self._law(logits, positions + 1)\n        self.seconds += 0.0",
           ("tests/test_bench_predicted.py", "-k", "forward_seconds")),
    Mutant("round efficiency: AR's share of its rounds ignored", "specvis/bench/report.py",
           "statistics.median(s / a for s, a in zip(shares, ar_shares))", "statistics.median(shares)",
           ("tests/test_bench_predicted.py", "-k", "forward_seconds")),
    Mutant("forwards / curve: priced against AR's forwards", "specvis/bench/report.py",
           'statistics.median(r["forward_s_repeats"]) / t', 'statistics.median(r["forward_s_repeats"]) / t_ar',
           ("tests/test_bench_predicted.py", "-k", "forward_seconds")),
    Mutant("cost curve: every fill timed at the first one", "specvis/cost.py",
           "            commit(fill)", "            commit(fills[0])", ("tests/test_bench_predicted.py", "-k", "two_fills")),
    Mutant("cpu linear: the pipeline keeps nn.Linear on CPU", "specvis/pipeline.py",
           "            prepare_cpu_linears(*(m for m", "            (lambda *a: 0)(*(m for m", ("tests/test_weight_layout.py",)),
    Mutant("MAR respacing: kept steps at round(j * stride), not the accumulated stride", "specvis/diffusion.py",
           "kept.append(start + round(x))", "kept.append(start + round((len(kept) - start) * stride))",
           ("tests/test_mar.py", "-k", "respacing")),
    Mutant("MAR learned variance: v clamped to [-1, 1]", "specvis/diffusion.py",
           "frac = (out[..., C:] + 1) / 2", "frac = (out[..., C:].clamp(-1.0, 1.0) + 1) / 2",
           ("tests/test_mar.py", "-k", "learned_variance")),
    Mutant("Lumina-mGPT: shard norms tiled over the heads, not repeat-interleaved", "specvis/families/chameleon.py",
           "repeat_interleave(heads // rows, dim=0)", "repeat(heads // rows, 1)",
           ("tests/test_chameleon.py", "-k", "lumina_release")),
    Mutant("Lumina-mGPT: default grid ignores the release name", "specvis/families/chameleon.py",
           "            px = int(found.group(1))", "            px = LUMINA_FALLBACK_PX",
           ("tests/test_chameleon.py", "-k", "native_grid")),
    Mutant("Chameleon: no unconditional rule from config ids (token-id CFG needs the tokenizer)",
           "specvis/families/chameleon.py", '        return ("from", ids["boi"])', "        return None",
           ("tests/test_chameleon.py", "-k", "need_no_tokenizer")),
    Mutant("Emu3: the positive suffix is not appended", "specvis/pipeline.py",
           "return [p + suffix if isinstance(p, str) else p for p in prompts]", "return prompts",
           ("tests/test_cli_families.py", "-k", "positive_suffix")),
    Mutant("Emu3: the positive suffix without its final dot", "specvis/families/emu3.py",
           'POSITIVE_SUFFIX = " masterpiece, film grained, best quality."',
           'POSITIVE_SUFFIX = " masterpiece, film grained, best quality"',
           ("tests/test_cli_families.py", "-k", "positive_suffix")),
    Mutant("LlamaGen captions: clean_caption applied once", "specvis/families/llamagen_caption.py",
           "return clean_once(clean_once(text))", "return clean_once(text)",
           ("tests/test_llamagen_t2i.py", "-k", "clean_caption")),
    Mutant("LlamaGen captions: sizes with a Cyrillic x kept", "specvis/families/llamagen_caption.py",
           r'r"\b\d+\.?\d*[x\u0445\u00d7]\d+\.?\d*\b"', r'r"\b\d+\.?\d*[x\u00d7]\d+\.?\d*\b"',
           ("tests/test_llamagen_t2i.py", "-k", "clean_caption")),
    Mutant("LlamaGen captions: HTML markup kept", "specvis/families/llamagen_caption.py",
           '                text = soup(text, features="html.parser").text', "                pass",
           ("tests/test_llamagen_t2i.py", "-k", "clean_caption")),
    Mutant("gpu scale: norm scales drawn like matrices", "scripts/gpu_scale.py",
           "elif isinstance(module, (nn.Linear, nn.Embedding)):", "elif True:",
           ("tests/test_gpu_scale.py", "-k", "build_on_device")),
    Mutant("gpu scale: the floor counts the whole embedding table", "scripts/gpu_scale.py",
           "for p in model.parameters() if p is not skip)", "for p in model.parameters())",
           ("tests/test_gpu_scale.py", "-k", "read_bytes")),
    Mutant("gpu scale: rounds timed with the caches left at the prefill", "scripts/gpu_scale.py",
           "view.set_committed(ctx.n - 1)  #", "pass  #", ("tests/test_gpu_scale.py", "-k", "round_timer")),
    Mutant("gpu scale: the best lossless speedup counts lossy runs", "scripts/gpu_scale.py",
           'others = [r for r in runs if r["method"] != "ar" and r["lossless"]]',
           'others = [r for r in runs if r["method"] != "ar"]', ("tests/test_gpu_scale.py", "-k", "summarise")),
    Mutant("gpu scale: the transformers weights mapped without the family's renames", "scripts/gpu_scale.py",
           "decoder_route(janus.RENAMES, janus.KEEP, model.config)",
           "decoder_route([], janus.KEEP, model.config)",
           ("tests/test_gpu_scale.py", "-k", "transformers_weights")),
    Mutant("gpu scale: the AR step keyed b1, b4, b16", "scripts/gpu_scale.py",
           'out["ar_step_ms"][str(b)] = measure(sv.AR(), b)', 'out["ar_step_ms"][f"b{b}"] = measure(sv.AR(), b)',
           ("tests/test_gpu_scale.py", "-k", "pinned_key")),
    Mutant("input: load passes the device to torch unchecked", "specvis/zoo.py",
           "    device = checks.device(device)  #", "    pass  #", (HOSTILE, "-k", "device")),
    Mutant("input: an infinite number accepted", "specvis/checks.py",
           "    if not math.isfinite(value):\n", "    if math.isnan(value):\n", (HOSTILE, "-k", "numeric")),
    Mutant("input: a bool taken for an integer", "specvis/checks.py",
           "    if isinstance(value, bool) or not isinstance(value, numbers.Integral):\n        raise InputTypeError(f\"{what} must be an integer{span}",
           "    if not isinstance(value, numbers.Integral):\n        raise InputTypeError(f\"{what} must be an integer{span}",
           (HOSTILE, "-k", "numeric")),
    Mutant("input: a bench-spec value not read as its field's type (any word a bool)", "specvis/options.py",
           'return text.lower() in ("true", "false"), text.lower() == "true"', 'return True, text.lower() == "true"',
           (HOSTILE, "-k", "numeric")),
    Mutant("input: class ids converted, not checked", "specvis/checks.py",
           "        if isinstance(c, bool) or not isinstance(c, numbers.Integral):\n",
           "        if isinstance(c, str):\n", (HOSTILE, "-k", "argument_types")),
    Mutant("input: seed range unchecked", "specvis/checks.py",
           "    if not 0 <= int(value) < SEED_LIMIT:\n", "    if False:\n", (HOSTILE, "-k", "argument_types or numeric")),
    Mutant("input: a window beyond the stream kept", "specvis/generate.py",
           "value > stream_len:", "value > 10 * stream_len + 10**6:", (HOSTILE, "-k", "clamped")),
    Mutant("input: a round loop with no bound", "specvis/methods/rounds.py",
           "if not finished and max_rounds is not None and ran[0] >= max_rounds:",
           "if not finished and max_rounds is not None and ran[0] >= 10**9:", (HOSTILE, "-k", "progress")),
    Mutant("input: sample takes no lock", "specvis/sample.py",
           "        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)\n", "        pass\n", (HOSTILE, "-k", "concurrent")),
    Mutant("input: a damaged config.json taken for missing", "specvis/sample.py",
           "    if not isinstance(old, dict):\n", "    if old is None:\n        write_text(path, json.dumps(config, indent=1))\n        return\n    if False:\n",
           (HOSTILE, "-k", "damaged")),
    Mutant("input: a truncated PNG taken as complete", "specvis/sample.py",
           "            return f.read() == PNG_END\n", "            return True\n", (HOSTILE, "-k", "damaged")),
    Mutant("input: temporaries of live processes removed", "specvis/io.py",
           "not parts[-3].isdigit() or _alive(int(parts[-3])):", "not parts[-3].isdigit():", (HOSTILE, "-k", "damaged")),
    Mutant("input: the demo loads any path", "specvis/demo.py",
           "        if name not in self.offered:", "        if False:", (HOSTILE, "-k", "allow_list")),
    Mutant("input: torch's weights_only advice repeated", "specvis/models/checkpoint.py",
           "    if \"Weights only load failed\" in text:\n", "    if False:\n", (HOSTILE, "-k", "unsafe")),
    Mutant("input: config.json sizes unchecked", "specvis/families/base.py",
           "    config_sizes(config, str(directory / \"config.json\"))", "    pass", (HOSTILE, "-k", "config_json")),
    Mutant("input: stored layers beyond the config dropped", "specvis/families/base.py",
           "    if stored and len(stored) != model.config.n_layer:", "    if stored and len(stored) < model.config.n_layer:",
           (HOSTILE, "-k", "config_json")),
    Mutant("input: empty prompts accepted", "specvis/checks.py",
           "    if not allow_empty and not value.strip():", "    if False:", (HOSTILE, "-k", "prompts")),
    # the house (issue 51): option declarations, the rule protocol, generated flags, the choice above generate
    Mutant("options: a lower bound admits the value below it", "specvis/options.py",
           "else value >= info.low)", "else value >= info.low - 1)", ("tests/test_options.py", "-k", "bounds")),
    Mutant("options: a bool taken for an integer option", "specvis/options.py",
           "if isinstance(value, bool) or not isinstance(value, numbers.Integral if tp is int",
           "if not isinstance(value, numbers.Integral if tp is int", ("tests/test_options.py", "-k", "wrong_types")),
    Mutant("options: an infinite float accepted", "specvis/options.py",
           "if tp is float and not math.isfinite(value):", "if tp is float and math.isnan(value):",
           ("tests/test_options.py", "-k", "wrong_types")),
    Mutant("rules: a method built with a rule that lacks its walk", "specvis/accept.py",
           "        if self.walk not in rule.walks:", "        if False:",
           ("tests/test_options.py", "-k", "walk", "tests/test_relaxed.py", "-k", "gsd_binding")),
    Mutant("rules: the rule bound without the layout's structural ids", "specvis/generate.py",
           "RuleTables(codebook, embeddings, model.layout.row_end if model is not None else 0)",
           "RuleTables(codebook, embeddings, 0)", ("tests/test_relaxed.py", "-k", "row_end")),
    Mutant("rules: greedy LANTERN not given its soft laws (needs ignored)", "specvis/generate.py",
           'keep_soft = sampling.greedy and rule is not None and "soft" in rule.needs', "keep_soft = False",
           ("tests/test_lantern.py", "-k", "greedy")),
    Mutant("cli: a renamed flag sets the option of its flag's name, not its field", "specvis/registry.py",
           "key = ACCEPT if info.type is AcceptanceRule else info.name",
           'key = ACCEPT if info.type is AcceptanceRule else info.flag.replace("-", "_")',
           ("tests/test_registry.py", "-k", "generated_flag")),
    Mutant("tune: the calibration cache ignores captured rounds", "specvis/tune.py",
           'captured = device.type == "cuda" and graphs is not False', "captured = False",
           ("tests/test_auto.py", "-k", "cache_key")),
    Mutant("tune: the calibration cache keyed on id() of the draft and drafter", "specvis/tune.py",
           "ref = lambda m: None if m is None else weakref.ref(m)", "ref = lambda m: None if m is None else id(m)",
           ("tests/test_auto.py", "-k", "cache_key")),
    Mutant("docs: the headline shows the slowest lossless run", "scripts/results_tables.py",
           'key=lambda i: report["runs"][i]["speedup"])', 'key=lambda i: -report["runs"][i]["speedup"])',
           ("tests/test_docs.py", "-k", "headline")),
    Mutant("docs: the headline counts lossy runs", "scripts/results_tables.py",
           'if r["lossless"] and r["method"] not in ("ar", "auto")),', 'if r["method"] not in ("ar", "auto")),',
           ("tests/test_docs.py", "-k", "headline")),
    Mutant("docs: a flag renamed under the README's commands", "specvis/lantern.py",
           'flag="lantern-k"', 'flag="lantern-size"', ("tests/test_docs.py", "-k", "readme_command")),
    # the house, seam 5: what a family and a pipeline can do is declared, and callers ask it
    Mutant("families: Emu3 declares no positive suffix", "specvis/families/emu3.py",
           "    positive_suffix = POSITIVE_SUFFIX\n", "", ("tests/test_cli_families.py", "-k", "positive_suffix")),
    Mutant("families: a draft of another family accepted", "specvis/families/base.py",
           "        if not ours:\n", "        if False:\n", ("tests/test_cli_families.py", "-k", "checkpoint_errors")),
    Mutant("families: Janus ignores generation_config's guidance_scale", "specvis/families/janus.py",
           'return dict(DEFAULT_SAMPLING) if scale is None else {**DEFAULT_SAMPLING, "cfg_scale": float(scale)}',
           "return dict(DEFAULT_SAMPLING)", ("tests/test_families.py", "-k", "declared")),
    Mutant("families: Lumina-mGPT sampled with Anole's defaults", "specvis/families/chameleon.py",
           "return dict(LUMINA_SAMPLING if is_lumina(config) else DEFAULT_SAMPLING)", "return dict(DEFAULT_SAMPLING)",
           ("tests/test_families.py", "-k", "declared")),
    Mutant("families: LlamaGen t2i's fixed grid not declared", "specvis/families/llamagen_t2i.py",
           "    fixed_grid = True\n", "", ("tests/test_llamagen_t2i.py", "-k", "bad_directories")),
    Mutant("families: LlamaGen t2i captions longer than the model's 120 tokens let through to the encoder",
           "specvis/families/llamagen_t2i.py", "            if len(row) > enc.max_length:", "            if False:",
           ("tests/test_llamagen_t2i.py", "-k", "bad_directories")),
    Mutant("families: Emu3's CFG rows without its official negative prompt", "specvis/families/base.py",
           "        rows = self.negative(pipe.processor, len(cond), height, width, pipe.target)",
           "        rows = [[int(pipe.processor.tokenizer.bos_token_id)]] * len(cond)",
           ("tests/test_cli_families.py", "-k", "positive_suffix")),
    Mutant("pipeline kinds: the CLI takes a text model for a class model", "specvis/cli.py",
           '    text = pipe.conditioning != "class"', '    text = pipe.conditioning == "caption"',
           ("tests/test_cli_families.py", "-k", "usage_errors")),
    Mutant("pipeline kinds: continuous pipelines take discrete methods", "specvis/zoo.py",
           '    if pipe.tokens == "continuous":', "    if False:", ("tests/test_continuous_pipeline.py", "-k", "routes_cspd")),
    Mutant("pipeline kinds: --num-iter accepted by a model that has no sampler steps", "specvis/cli.py",
           "        if pipe.num_iter is None:", "        if False:", ("tests/test_emoji_mar.py", "-k", "num_iter")),
    Mutant("generate: classes accepted by a text-conditioned model", "specvis/generate.py",
           "    if n is None:\n        raise", "    if False:\n        raise", ("tests/test_prompt_core.py", "-k", "interchangeable")),
    # 2-D methods (rows in flight): the position-aware cache and the row schedule (tests/test_rows2d.py)
    Mutant("rows2d: cached slots seen whatever their stream position (lower rows visible above)", "specvis/models/base.py",
           "committed = committed & (self.pos[:, None, : ids.shape[0]] < query_pos[:, :, None])",
           "committed = committed & (self.pos[:, None, : ids.shape[0]] < query_pos[:, :, None] + 10**6)",
           (ROWS2D, "-k", "rows_zero_and_one")),
    Mutant("rows2d: the next row starts one token late", "specvis/methods/rows2d.py",
           "can = ~self.started & (self.rid > 0) & prev_started & (up >= self.lag)",
           "can = ~self.started & (self.rid > 0) & prev_started & (up > self.lag)", (ROWS2D, "-k", "formula")),
    Mutant("rows2d: row 1 starts on a placeholder from row -1 (no row end)", "specvis/methods/rows2d.py",
           "can &= (self.rid >= 2) | (up >= self.W)", "can &= (self.rid >= 1) | (up >= self.W)",
           (ROWS2D, "-k", "formula or rows_zero_and_one")),
    Mutant("rows2d: a row keeps one chain slot too many (an unverified draft cached)", "specvis/methods/rows2d.py",
           "keep_chain = torch.cat([kx[..., None], (k[1:] < n[..., None])], 2)",
           "keep_chain = torch.cat([kx[..., None], (k[1:] <= n[..., None])], 2)", (ROWS2D, "-k", "never_overlap")),
    Mutant("rows2d: a row's lead fed as the first row-end id, not the last", "specvis/methods/rows2d.py",
           "x = torch.where(lead, torch.full_like(c, codes + E - 1), tok_at(px))",
           "x = torch.where(lead, torch.full_like(c, codes), tok_at(px))", (ROWS2D, "-k", "never_overlap")),
    Mutant("rows2d: no Row-Causal Mask (drafts of rows above attended)", "specvis/methods/rows2d.py",
           "        if self.rcm:\n", "        if False:\n", (ROWS2D, "-k", "mask")),
    Mutant("pjd: lower rows commit a residual or bonus token", "specvis/methods/pjd.py",
           "n = torch.where(open_, torch.where(top, a + 1, a), torch.zeros_like(a))",
           "n = torch.where(open_, a + 1, torch.zeros_like(a))", (ROWS2D, "-k", "lower_rows")),
    Mutant("pjd: the top row's rejected draft committed instead of its residual", "specvis/methods/pjd.py",
           "values = torch.where(at_a, nxt[..., None], torch.cat([D, D[..., :1]], 2))",
           "values = torch.cat([D, D[..., :1]], 2)", (ROWS2D, "-k", "harness or never_overlap")),
    Mutant("pjd: the top row's residual replaced by the target law (p, not max(0, p - q))", "specvis/methods/pjd.py",
           "nxt = sample(torch.where((a < m)[..., None], normalise(r_a, p_a), p_a), gen)",
           "nxt = sample(p_a, gen)", (ROWS2D, "-k", "harness")),
    Mutant("pjd: a copied first draft verified against the uniform law, not its point mass", "specvis/methods/pjd.py",
           'st["Q"] = torch.where(fresh[..., None], q0, st["Q"])',
           'st["Q"] = torch.where(fresh[..., None], uni.expand(B, H, g, V), st["Q"])', (ROWS2D, "-k", "harness and vertical")),

]


def scratch_copy(dest: Path, rev: str | None) -> None:
    """The working tree (tracked and untracked, not ignored files), or the commit ``rev``."""
    if rev is not None:
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\n")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)


def run_tests(where: Path, args: tuple[str, ...], timeout: int) -> tuple[bool, str]:
    """Run each test group (a path followed by its -k options) with -x; True when one fails."""
    groups: list[list[str]] = []
    for a in args:
        if a.startswith("tests/"):
            groups.append([a])
        else:
            groups[-1].append(a)
    env = {**os.environ, "PYTHONPATH": str(where), "OMP_NUM_THREADS": "1"}
    for g in groups:
        r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *g], cwd=where,
                           env=env, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            failed = [ln.split(" - ")[0].removeprefix("FAILED ") for ln in r.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
            return True, failed[0] if failed else f"exit {r.returncode}"
    return False, ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the markdown table here")
    ap.add_argument("--only", help="run the mutants whose name contains this text")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per test group")
    ap.add_argument("--rev", help="mutate this commit (git archive) instead of the working tree")
    a = ap.parse_args()
    mutants = [m for m in MUTANTS if a.only is None or a.only in m.name]
    rows = []
    with tempfile.TemporaryDirectory(prefix="specvis-mutants-") as tmp:
        where = Path(tmp)
        scratch_copy(where, a.rev)
        for m in mutants:
            path = where / m.file
            original = path.read_text()
            if original.count(m.old) != 1:
                raise SystemExit(f"mutant {m.name!r}: {m.old!r} occurs {original.count(m.old)} times in {m.file}")
            path.write_text(original.replace(m.old, m.new))
            t0 = time.time()
            try:
                caught, by = run_tests(where, m.tests, a.timeout)
            finally:
                path.write_text(original)
            rows.append((m, caught, by, time.time() - t0))
            print(f"{'caught' if caught else 'MISSED'}  {time.time() - t0:6.0f}s  {m.name}  {by}", flush=True)
    caught = sum(r[1] for r in rows)
    print(f"{caught} / {len(rows)} mutants caught")
    if a.out:
        lines = ["# Planted bugs (mutants) and the tests that catch them", "",
                 "Generated by `python scripts/mutants.py --out docs/mutants.md`: each row is a one-line change to the",
                 "library, applied alone to a scratch copy; 'caught by' is the first failing test.", "",
                 f"**{caught} / {len(rows)} caught.**", "",
                 "| mutant | file | line before | line after | caught by | s |", "| --- | --- | --- | --- | --- | ---: |"]
        for m, ok, by, secs in rows:
            cell = lambda t: "`" + t.strip().replace("\n", " ⏎ ").replace("|", "\\|") + "`"
            lines.append(f"| {m.name} | {m.file} | {cell(m.old)} | {cell(m.new)} | {by if ok else '**missed**'} | {secs:.0f} |")
        tmp_out = Path(a.out).with_suffix(".tmp")
        tmp_out.write_text("\n".join(lines) + "\n")
        tmp_out.replace(a.out)
    return 0 if caught == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
