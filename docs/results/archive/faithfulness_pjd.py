"""Faithfulness of ``sv.PJD`` to the official PJD loop (Lumina-mGPT), greedily, on a tiny random Lumina-mGPT.

    python docs/results/archive/faithfulness_pjd.py PATH/TO/PJD_CHECKOUT [--grid 8] [--settings 8:8 4:4 4:2]
        [--prompts 4] [--sharp 1e6] [--sweep 10] [--out docs/results/archive/pjd-faithfulness]

It needs transformers 4.44-4.46 (the official ``_sample`` override takes ``logits_warper`` and reads
``DynamicCache.key_cache``), so it runs in its own environment, with specvis from the working tree::

    python3 -m venv /tmp/pjd-venv
    /tmp/pjd-venv/bin/pip install torch==2.13.0 transformers==4.44.2 accelerate sentencepiece absl-py \\
        numpy Pillow safetensors tqdm einops pyyaml
    OMP_NUM_THREADS=1 PYTHONPATH=$PWD /tmp/pjd-venv/bin/python docs/results/archive/faithfulness_pjd.py /tmp/pjd-official

The checkout (nothing of it is copied here). PJD (boyaliao/PJD) is an overlay on Lumina-mGPT and has no
git snapshot to clone; PATH is assembled by hand: the Alpha-VLLM/Lumina-mGPT tree (commit 104abe4, its
``lumina_mgpt/`` and ``xllmx/``) with three files of boyaliao/PJD written over it, byte for byte:
``scheduler/jacobi_iteration_lumina_mgpt.py`` and ``scheduler/logit_processor_3dim.py`` (commit e7b93ad,
78,722 and 27,788 characters) and ``lumina_mgpt/model/chameleon/modeling_chameleon.py`` (commit 187f1bf,
83,062 characters, replacing Lumina-mGPT's). PJD's ``inference_solver.py`` is not needed: the script calls
the model's ``generate`` the way PJD's ``renew_pipeline_sampler`` sets it up.

Run on CPU by substitutions applied at import, in memory (the files are not edited): in the three PJD
modules and Lumina-mGPT's ``inference_solver.py`` the device literals ``device='cuda'`` / ``device="cuda"``
become ``'cpu'``; while the official loop runs, ``torch.cuda.Event`` is a wall-clock stand-in and
``torch.cuda.synchronize`` does nothing (the loop always times itself with CUDA events, sched:1070-1075).
Diagnostic variants of the official loop (reported separately, never the headline) change one line of
its scheduler each, the same way, to test an explanation of a difference:

- ``rcm-fixed``: the running query offset of the Row-Causal Mask advances by the row's own length
  (``cur_loc = seq_len`` for ``cur_loc += seq_len``, sched:546-550): as run, rows past the second of the
  active list are not masked (pjd_zipar_brief A6-1);
- ``uncond-pos``: the unconditional half's Jacobi positions are ``global - P + 1`` (sched:568-569), as its
  prefix steps count them (the attention-mask cumsum puts the prompt's last token at 0): as run, every
  Jacobi-phase unconditional query and key sits one position lower than the prefix's keys (A6-4);
- ``prepend-aligned``: in the step after a row completes, the official loop feeds that row's last token
  first and drops its logits (sched:1150-1153) but not its input id and score, so the verification
  (``SpeculativeSampler``, sched:249-329) reads every draft and its q one slot early: the fed token
  before it. The variant drops them too (found by this script's step traces; not in the brief);
- ``all``: the three together.

Setting. A tiny Lumina-mGPT in the official layout, built by the official ``ChameleonForConditionalGeneration``
(PJD's modeling file, ``ChameleonXLLMXConfig``: hidden 64, 2 layers, 4 heads / 2 KV heads, vocabulary 8832
with Lumina's ids: image codes 0..8191 at ids 4..8195, end-of-image 8196, begin-image 8197, ``<reserved08706>``
8710, row end 8803, size tokens 8804 + n), every weight re-drawn at unit scale (``lm_head`` then multiplied
by ``--sharp``, see below), saved with ``save_pretrained`` and loaded by specvis from that directory.
Prompts: ``[<s>, 8 random text ids, 8710]``. Official: ``generate(..., do_sample=False)`` with PJD's
processors (``MultiModalLogitsProcessor_JACOBI``, top-k 2000) and a forcer of begin-image, h, w on the first
three steps (a random model does not emit them; the loop expects them generated after the prompt), CFG 3.0
in PJD's doubled batch, ``window_size``/``long_size`` set on the model (``long_size = lag + 1`` entries),
``seed`` passed (the acceptance uniforms use it) and ``torch.manual_seed`` (random drafts use the global RNG).
specvis: ``PJD(window, lag)`` under ``Sampling(temperature=0, cfg_scale=3.0)`` with the prompt followed by
[begin-image, h, w], batch 1, once with the family's unconditional rows [begin-image, h, w] (Lumina-mGPT's
own CFG) and once with PJD's, [8710, begin-image, h, w] (its doubled batch masks the prompt but its last
token, sched:597 and its prefix steps).
Plain AR, the check that both run the same model: Lumina-mGPT's own ``generate`` (``inference_solver.py``'s
CFG, image and top-k processors, greedy) vs ``sv.AR``.

Greedy. The official ``do_sample=False`` still runs the probabilistic test r < min(1, p/q) on the softmax of
the guided logits and draws residuals from it (pjd_zipar_brief A6-5): at unit scale it is not greedy. With
``--sharp`` s the logits are s times larger, the softmax is one-hot in float32 and the official loop
becomes deterministic greedy Jacobi decoding, which is what specvis's temperature 0 runs (at 1e3 a near
tie in the raw logits still left a p of 0.59); the unit-scale model (``--sharp 1``) shows the stochastic case.

Reported per setting (window:lag): equal image tokens overall and per image row, and forwards: the
official model's forward calls (a hook; Lumina-mGPT's AR also calls the model for its unconditional
branch: not counted) and specvis's ``target_forwards``. specvis prefills [begin-image, h, w] with the
prompt; the official loop spends three more forwards generating them, so "forwards equal" compares the
official count minus 3. From a mask dump of every official Jacobi step, the steps whose Row-Causal Mask
leaves a draft of an active row above visible to a query of a lower row (A6-1). Each loop against itself at
seed + 1 (the official's random first drafts come from the global RNG, specvis's from its generator: the
noise floor of a comparison). And a seed sweep (``--sweep`` seeds per prompt, each official loop and
specvis): the share of official runs whose grid, and whose forward count minus 3, specvis also produced
for that prompt under some seed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

import specvis as sv
from specvis.families import load_decoder
from specvis.io import write_text
from specvis.models.base import Condition, Prompts

BOI, EOI, EOT, EOL, SIZE0 = 8197, 8196, 8710, 8803, 8804
CODES, FIRST_CODE, VOCAB = 8192, 4, 8832
CFG = 3.0
DEVICE_LITERALS = (("device='cuda'", "device='cpu'"), ('device="cuda"', 'device="cpu"'))
FIXES = {"rcm-fixed": ("cur_loc += seq_len", "cur_loc = seq_len"),
         "uncond-pos": ("position_ids[batch_size:, :] - self.prompt_len",
                        "position_ids[batch_size:, :] - self.prompt_len + 1"),
         "prepend-aligned": ("logits = logits[:, 1:]\n", "logits = logits[:, 1:]; model_input_ids = model_input_ids[:, 1:]; "
                             "input_token_scores = input_token_scores[:, 1:]\n")}
VARIANTS = {**{k: (v,) for k, v in FIXES.items()}, "all": tuple(FIXES.values())}


def load_source(name: str, path: Path, package: str | None = None, fixes=()) -> types.ModuleType:
    """Import ``path`` as module ``name`` from its source with the CUDA device literals made CPU ones
    (at least one must be there) and each (old, new) of ``fixes`` (exactly one occurrence) applied, in memory."""
    text = path.read_text()
    if not any(old in text for old, _ in DEVICE_LITERALS):
        raise SystemExit(f"{path}: no device='cuda' literal (not the checkout the module docstring describes)")
    for old, new in DEVICE_LITERALS:
        text = text.replace(old, new)
    for old, new in fixes:
        if text.count(old) != 1:
            raise SystemExit(f"{path}: {old!r} is not there exactly once (not the checkout the docstring describes)")
        text = text.replace(old, new)
    spec = importlib.util.spec_from_loader(name, loader=None, origin=str(path))
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)
    if package is not None:
        module.__package__ = package
    sys.modules[name] = module
    exec(compile(text, str(path), "exec"), module.__dict__)
    return module


class Official:
    """The official modules of a checkout: PJD's model and scheduler, Lumina-mGPT's inference processors."""

    def __init__(self, root: Path, variant: str | None = None):
        for p in (root / "lumina_mgpt", root):
            if str(p) not in sys.path:
                sys.path.insert(0, str(p))
        from model.chameleon import modeling_chameleon  # PJD's file, written over Lumina-mGPT's
        from model.configuration_xllmx_chameleon import ChameleonXLLMXConfig

        self.modeling, self.Config = modeling_chameleon, ChameleonXLLMXConfig
        pkg = "pjd_scheduler" + ("" if variant is None else "_" + variant.replace("-", "_"))
        sys.modules[pkg] = types.ModuleType(pkg)
        sys.modules[pkg].__path__ = [str(root / "scheduler")]
        self.processors = load_source(pkg + ".logit_processor_3dim", root / "scheduler" / "logit_processor_3dim.py", pkg)
        self.sched = load_source(pkg + ".jacobi_iteration_lumina_mgpt", root / "scheduler" / "jacobi_iteration_lumina_mgpt.py",
                                 pkg, VARIANTS[variant] if variant else ())
        self.solver = load_source("lumina_inference_solver", root / "lumina_mgpt" / "inference_solver.py")


class _CpuEvent:
    """A stand-in for ``torch.cuda.Event(enable_timing=True)``: record() and elapsed_time() in ms."""

    def __init__(self, enable_timing: bool = False):
        self.t = 0.0

    def record(self, *_):
        self.t = time.perf_counter()

    def elapsed_time(self, other: "_CpuEvent") -> float:
        return (other.t - self.t) * 1000.0


@contextlib.contextmanager
def cpu_cuda():
    saved = torch.cuda.Event, torch.cuda.synchronize
    torch.cuda.Event, torch.cuda.synchronize = _CpuEvent, lambda *a, **k: None
    try:
        with contextlib.redirect_stdout(sys.stderr):  # the official loop prints per-step diagnostics
            yield
    finally:
        torch.cuda.Event, torch.cuda.synchronize = saved


def vocabulary() -> dict[str, int]:
    names = {"<pad>": 0, "<s>": 1, "</s>": 2, "<reserved08707>": 3}
    for c in range(CODES):
        names["IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(c)) + "Z"] = FIRST_CODE + c
    names["<eoss>"], names["<racm3:break>"] = EOI, BOI
    for i in range(BOI + 1, VOCAB):
        names[f"<reserved{i - 4:05d}>"] = i  # Chameleon's <reservedNNNNN> sits at id NNNNN + 4 (8710, 8803, 8804 + n)
    return names


def tiny_model(off: Official, path: Path, seed: int, sharp: float):
    """The official model with unit-scale random weights (lm_head times ``sharp``), saved to ``path``."""
    torch.manual_seed(seed)
    cfg = off.Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, rope_theta=10000.0,
                     rms_norm_eps=1e-5, vocabulary_map=vocabulary(), mask_image_logits=False, model_parallel_size=1,
                     z_loss_weight=0.0, vq_config=dict(embed_dim=8, num_embeddings=16, base_channels=32,
                                                       channel_multiplier=[1, 1], num_res_blocks=1, attn_resolutions=[],
                                                       resolution=32, latent_channels=8))
    model = off.modeling.ChameleonForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "vqmodel" in name:
                continue
            if p.dim() > 1:
                p.normal_(0, p.shape[1] ** -0.5 if "embed" not in name else 1.0)
            else:
                p.copy_((1.0 if "weight" in name else 0.0) + 0.1 * torch.randn_like(p))
        model.lm_head.weight.mul_(sharp)
    model.config.architectures = ["ChameleonXLLMXForConditionalGeneration"]
    model.save_pretrained(path)
    return path


def load_official(off: Official, path: Path):
    return off.modeling.ChameleonForConditionalGeneration.from_pretrained(path).eval()


class ForceStructure:
    """Forces begin-image, h, w as the first three generated tokens (no-op afterwards)."""

    def __init__(self, prompt_len: int, grid: int):
        self.P, self.ids = prompt_len, [BOI, SIZE0 + grid // 2, SIZE0 + grid // 2]

    def __call__(self, input_ids, scores):
        k = input_ids.shape[1] - self.P
        if 0 <= k < 3:
            scores = torch.full_like(scores, float("-inf"))
            scores[..., self.ids[k]] = 0.0
        return scores


def count_forwards(model) -> list[int]:
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def image_codes(ids: list[int], grid: int) -> list[int]:
    """The H*W image codes of a Lumina stream [begin-image, h, w, (row, row end) * H, ...], checked."""
    assert ids[:3] == [BOI, SIZE0 + grid // 2, SIZE0 + grid // 2], ids[:3]
    rows = [ids[3 + r * (grid + 1): 3 + (r + 1) * (grid + 1)] for r in range(grid)]
    assert all(r[-1] == EOL for r in rows), "row ends not where the layout puts them"
    assert ids[3 + grid * (grid + 1)] == EOI, "no end-of-image after the last row"
    codes = [t - FIRST_CODE for r in rows for t in r[:-1]]
    assert all(0 <= c < CODES for c in codes)
    return codes


def official_ar(off: Official, path: Path, prompt: list[int], grid: int) -> tuple[list[int], int]:
    """Lumina-mGPT's greedy CFG generate: inference_solver's three processors (+ the structure forcer)."""
    from transformers import GenerationConfig
    from transformers.generation.logits_process import LogitsProcessorList

    model = load_official(off, path)
    s = off.solver
    cfg = s.LLMImageStartTriggeredUnbatchedClassifierFreeGuidanceLogitsProcessor(
        guidance_scale=CFG, model=model, image_start_token_id=BOI, image_end_token_id=EOI,
        image_next_line_token_id=EOL, patch_size=32)
    uncond = [0]
    inner = cfg.get_unconditional_logits
    cfg.get_unconditional_logits = lambda *a: (uncond.__setitem__(0, uncond[0] + 1), inner(*a))[1]
    procs = LogitsProcessorList([cfg, s.MultiModalLogitsProcessor(BOI, EOI, EOL, 32, VOCAB),
                                 s.InterleavedTopKLogitsWarper(2000, 10, BOI, EOI), ForceStructure(len(prompt), grid)])
    calls = count_forwards(model)
    n = 3 + grid * (grid + 1) + 1
    with torch.no_grad(), cpu_cuda():
        out = model.generate(torch.tensor([prompt]), GenerationConfig(max_new_tokens=n, do_sample=False,
                                                                     eos_token_id=[EOT]),
                             logits_processor=procs, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return image_codes(out[0, len(prompt):].tolist(), grid), calls[0] - uncond[0]


def rcm_leaks(sampler) -> tuple[list[int], list[int]]:
    """Wrap the official input preparation: per Jacobi step, 1 if some query of an active row is not masked
    from the drafts of an active row above it (the intended Row-Causal Mask, sched:582-597), else 0; and the
    number of active rows."""
    leaks, rows = [], []
    inner = sampler.prepare_inputs_for_generation_jacobi

    def wrapped(*a, **k):
        out = inner(*a, **k)
        mask, active = out["attention_mask"][0], list(sampler.ongoing_row_list)
        start = 1 if k.get("last_token_in_row_idx") is not None else 0
        spans = []
        for r in active:  # where each row's fed tokens sit in this step's input (the intended offsets)
            v = int(sampler.verify_num[r])
            spans.append((r, start, v))
            start += v
        leak = 0
        for r, s, v in spans:
            for r2 in active:
                if r2 >= r:
                    break
                c0, c1 = int(sampler.start_location_ids[r2]), int(sampler.end_location_ids[r2])
                if v and int(sampler.verify_num[r2]) > 1 and bool(mask[s:s + v, c0:c1].any()):
                    leak = 1
        leaks.append(leak)
        rows.append(len(active))
        return out

    sampler.prepare_inputs_for_generation_jacobi = wrapped
    return leaks, rows


def official_pjd(off: Official, path: Path, prompt: list[int], grid: int, window: int, lag: int,
                 seed: int) -> tuple[list[int], int, dict]:
    from transformers import GenerationConfig
    from transformers.generation.logits_process import LogitsProcessorList

    model = load_official(off, path)
    sched, procs = off.sched, off.processors
    model.__class__ = sched.renew_sampler(model.__class__)  # as renew_pipeline_sampler does (sched:1497-1503)
    model.img_vocab = torch.arange(FIRST_CODE, FIRST_CODE + CODES)
    model._init_new_params(use_chameleon_tokenizer=False, target_size=16 * grid, guidance_scale=CFG, seed=seed)
    model.model.__class__ = sched.renew_backbone(model.model.__class__)
    model.window_size, model.long_size = window, lag + 1
    leaks, active = rcm_leaks(model)
    calls = count_forwards(model)
    plist = LogitsProcessorList([procs.MultiModalLogitsProcessor_JACOBI(BOI, EOI, EOL, 32, VOCAB),
                                 procs.MultiTokensInterleavedTopKLogitsWarper(2000, 10, BOI, EOI),
                                 ForceStructure(len(prompt), grid)])
    torch.manual_seed(seed)
    with torch.no_grad(), cpu_cuda():
        out = model.generate(torch.tensor([prompt]), GenerationConfig(max_new_tokens=4 * grid * grid, do_sample=False,
                                                                     eos_token_id=[EOT]),
                             logits_processor=plist, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return image_codes(out[0, len(prompt):].tolist(), grid), calls[0], {
        "jacobi_steps": len(leaks), "rcm_leak_steps": sum(leaks), "max_active_rows": max(active, default=0),
        "steps_with_3plus_rows": sum(n >= 3 for n in active)}


def specvis_run(model, prompt: list[int], grid: int, method, uncond: list[int] | None, seed: int):
    structure = [BOI, SIZE0 + grid // 2, SIZE0 + grid // 2]
    cond = Prompts.of([prompt + structure])
    conditions = cond if uncond is None else Condition(cond, Prompts.of([uncond]))
    g = sv.generate(model, conditions, method, sv.Sampling(temperature=0.0, cfg_scale=CFG), seed=seed)
    return g.tokens[0].tolist(), g.stats.target_forwards


def compare(theirs: list[list[int]], mine: list[list[int]], grid: int) -> dict:
    eq = (torch.tensor(theirs).view(-1, grid, grid) == torch.tensor(mine).view(-1, grid, grid)).float()
    return {"equal_tokens": round(float(eq.mean()), 4), "equal_by_row": [round(float(x), 3) for x in eq.mean((0, 2))]}


def sweep(setting: str, name: str, theirs: list[list[tuple]], mine: list[list[tuple]]) -> dict:
    """Over seeds (runs per prompt: (tokens, forwards)): how often an official run's grid (its forward count
    minus the 3 structure steps) is one that specvis produced for that prompt under some seed, and the
    distinct grids each produced."""
    grid_hits = fwd_hits = runs = 0
    for t_runs, m_runs in zip(theirs, mine):
        grids, fwds = {tuple(t) for t, _ in m_runs}, {f for _, f in m_runs}
        grid_hits += sum(tuple(t) in grids for t, _ in t_runs)
        fwd_hits += sum(f - 3 in fwds for _, f in t_runs)
        runs += len(t_runs)
    return {"setting": setting, "official": name, "runs": runs,
            "grid_in_specvis_grids": round(grid_hits / runs, 3), "forwards_in_specvis_counts": round(fwd_hits / runs, 3),
            "official_distinct_grids": [len({tuple(t) for t, _ in r}) for r in theirs],
            "specvis_distinct_grids": [len({tuple(t) for t, _ in r}) for r in mine],
            "official_forwards_minus_3": [sorted({f - 3 for _, f in r}) for r in theirs],
            "specvis_forwards": [sorted({f for _, f in r}) for r in mine]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pjd", type=Path, help="the assembled checkout (module docstring)")
    ap.add_argument("--grid", type=int, default=8, help="image tokens per side (square: the official loop assumes H = W)")
    ap.add_argument("--settings", nargs="+", default=["8:8", "4:4", "4:2"], help="window:lag (official 8:8)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--sharp", type=float, default=1e6, help="lm_head scale (1: unit-scale logits)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", nargs="*", default=sorted(VARIANTS), choices=sorted(VARIANTS),
                    help="diagnostic variants of the official loop (module docstring)")
    ap.add_argument("--sweep", type=int, default=10, help="seeds per prompt of the seed sweep (0: none)")
    ap.add_argument("--out", help="write OUT.json and OUT.md")
    a = ap.parse_args()
    for f in ("scheduler/jacobi_iteration_lumina_mgpt.py", "scheduler/logit_processor_3dim.py",
              "lumina_mgpt/model/chameleon/modeling_chameleon.py", "lumina_mgpt/inference_solver.py"):
        if not (a.pjd / f).is_file():
            ap.error(f"{a.pjd} is not an assembled PJD checkout (no {f}; see the module docstring)")
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    if (major, minor) < (4, 44) or (major, minor) > (4, 46):
        ap.error(f"the official loop needs transformers 4.44-4.46, this environment has {transformers.__version__} "
                 "(set-up in the module docstring)")
    if a.prompts < 1 or a.sweep < 0 or not a.sharp > 0:
        ap.error(f"--prompts must be >= 1, --sweep >= 0 and --sharp > 0, got {a.prompts}, {a.sweep}, {a.sharp}")
    if a.grid < 2 or a.grid % 2:
        ap.error(f"--grid must be an even number >= 2 (Lumina-mGPT's 32-px size tokens), got {a.grid}")
    settings = []
    for s in a.settings:
        try:
            w, l = (int(x) for x in s.split(":"))
        except ValueError:
            ap.error(f"--settings: expected window:lag integers, got {s!r}")
        if w < 2 or l < 1:
            ap.error(f"--settings: window must be >= 2 and lag >= 1, got {s!r}")
        settings.append((w, l))
    torch.set_num_threads(1)
    off = Official(a.pjd)
    gen = torch.Generator().manual_seed(a.seed)
    prompts = [[1] + torch.randint(BOI + 1, EOT, (8,), generator=gen).tolist() + [EOT] for _ in range(a.prompts)]
    rows = []

    grid = a.grid
    sweeps = []

    def pair(setting: str, a: str, b: str, ra: list, rb: list, a_off: int = 0, b_off: int = 0) -> None:
        """One comparison: run ``a`` against run ``b``, per prompt (tokens, forwards[, mask dump]); their forward
        counts are compared after subtracting ``a_off`` / ``b_off`` (the official loops' structure steps)."""
        row = {"setting": setting, "a": a, "b": b, "a_forwards": [r[1] for r in ra], "b_forwards": [r[1] for r in rb],
               "forwards_equal": sum(x[1] - a_off == y[1] - b_off for x, y in zip(ra, rb)),
               **compare([r[0] for r in ra], [r[0] for r in rb], grid)}
        if len(ra[0]) > 2:
            row["a_mask"] = [r[2] for r in ra]
        rows.append(row)

    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_model(off, Path(tmp) / "tiny-lumina", a.seed, a.sharp)
        ours = load_decoder(path, grid, grid)
        pjd_uncond = [EOT, BOI, SIZE0 + grid // 2, SIZE0 + grid // 2]
        pair("ar", "official (Lumina-mGPT generate)", "specvis AR", [official_ar(off, path, p, grid) for p in prompts],
             [specvis_run(ours, p, grid, sv.AR(), None, a.seed) for p in prompts], a_off=4)
        variants = {v: Official(a.pjd, v) for v in a.variants}
        for w, l in settings:
            setting, method = f"pjd {w}:{l}", sv.PJD(window=w, lag=l)
            theirs = [official_pjd(off, path, p, grid, w, l, a.seed) for p in prompts]
            pjd = [specvis_run(ours, p, grid, method, pjd_uncond, a.seed) for p in prompts]
            pair(setting, "official", "specvis, PJD's uncond rows", theirs, pjd, a_off=3)
            pair(setting, "official", "specvis, Lumina-mGPT's uncond rows", theirs,
                 [specvis_run(ours, p, grid, method, None, a.seed) for p in prompts], a_off=3)
            pair(setting, f"official, seed {a.seed + 1}", "official",
                 [official_pjd(off, path, p, grid, w, l, a.seed + 1) for p in prompts], theirs)
            pair(setting, f"specvis, PJD's uncond rows, seed {a.seed + 1}", "specvis, PJD's uncond rows",
                 [specvis_run(ours, p, grid, method, pjd_uncond, a.seed + 1) for p in prompts], pjd)
            for v, o in variants.items():
                pair(setting, f"official ({v})", "specvis, PJD's uncond rows",
                     [official_pjd(o, path, p, grid, w, l, a.seed) for p in prompts], pjd, a_off=3)
            if a.sweep:
                seeds = range(a.seed, a.seed + a.sweep)
                mine = [[specvis_run(ours, p, grid, method, pjd_uncond, s) for s in seeds] for p in prompts]
                for name, o in [("official", off)] + [(f"official ({v})", o) for v, o in variants.items()]:
                    theirs = [[official_pjd(o, path, p, grid, w, l, s)[:2] for s in seeds] for p in prompts]
                    sweeps.append(sweep(setting, name, theirs, mine))
    for r in rows + sweeps:
        print(json.dumps(r))
    if a.out:
        out = Path(a.out)
        data = {"grid": grid, "seed": a.seed, "sharp": a.sharp, "cfg": CFG, "settings": a.settings,
                "prompts": prompts, "rows": rows, "sweep_seeds": a.sweep, "sweeps": sweeps}
        lines = [f"# PJD: specvis vs the official PJD loop (tiny Lumina-mGPT, {grid}x{grid}, greedy, CFG {CFG:g}, "
                 f"lm_head x{a.sharp:g})", "",
                 f"Produced by `python docs/results/archive/faithfulness_pjd.py PJD_CHECKOUT --grid {grid} --settings "
                 f"{' '.join(a.settings)} --prompts {a.prompts} --sharp {a.sharp:g} --seed {a.seed}` (checkout, "
                 "substitutions, setting and variants in its docstring). Forwards per prompt; an official count "
                 "includes the three steps generating begin-image, h, w, which specvis prefills, and, for plain AR, "
                 "the end-of-image step; \"equal\": prompts whose counts agree once those are subtracted. RCM "
                 "leaks: official Jacobi steps whose Row-Causal Mask leaves a draft of an active row above visible "
                 "to a lower row, per prompt.", "",
                 "| setting | A | B | A forwards | B forwards | forwards equal | equal tokens | equal by image row | "
                 "A's RCM leaks / steps |",
                 "| --- | --- | --- | --- | --- | ---: | ---: | --- | --- |"]
        for r in rows:
            mask = " ".join(f"{d['rcm_leak_steps']}/{d['jacobi_steps']}" for d in r.get("a_mask", [])) or "-"
            lines.append(f"| {r['setting']} | {r['a']} | {r['b']} | {' '.join(map(str, r['a_forwards']))} | "
                         f"{' '.join(map(str, r['b_forwards']))} | {r['forwards_equal']}/{len(prompts)} | "
                         f"{r['equal_tokens']:.3f} | "
                         f"{' '.join(f'{x:.2f}' for x in r['equal_by_row'])} | {mask} |")
        if sweeps:
            lines += ["", f"Seed sweep: each prompt decoded with seeds {a.seed}..{a.seed + a.sweep - 1} by each official "
                      "loop and by specvis (PJD's unconditional rows); share of official runs whose grid (forward count "
                      "minus 3) specvis also produced for that prompt, and distinct grids / forward counts per prompt.", "",
                      "| setting | official | runs | grid among specvis's | forwards among specvis's | official distinct "
                      "grids | specvis distinct grids | official forwards - 3 | specvis forwards |",
                      "| --- | --- | ---: | ---: | ---: | --- | --- | --- | --- |"]
            fmt = lambda xs: " ".join("/".join(map(str, x)) if isinstance(x, list) else str(x) for x in xs)
            lines += [f"| {r['setting']} | {r['official']} | {r['runs']} | {r['grid_in_specvis_grids']:.2f} | "
                      f"{r['forwards_in_specvis_counts']:.2f} | {fmt(r['official_distinct_grids'])} | "
                      f"{fmt(r['specvis_distinct_grids'])} | {fmt(r['official_forwards_minus_3'])} | "
                      f"{fmt(r['specvis_forwards'])} |" for r in sweeps]
        for suffix, text in ((".json", json.dumps(data, indent=1)), (".md", "\n".join(lines) + "\n")):
            write_text(out.with_suffix(suffix), text)


if __name__ == "__main__":
    main()
