"""specvis next to Hugging Face transformers on tiny random Janus-Pro and Emu3 checkpoints, on CPU.

For each family (tests/hf_tiny.py checkpoints: a target with seed 0, and two drafts of the same
family for specvis's Speculative and transformers' ``assistant_model``: ``seed1``, another random
checkpoint of the same shape, and ``copy``, a second copy of the target, the ideal draft), with the
same 8 prompts and the same seeds for both libraries:

- greedy with CFG (temperature 0, cfg_scale 3), batch 1 (8 calls of one prompt) and batch 8 (one
  call): transformers' ``generate`` (Janus ``generation_mode="image"``; Emu3 with the row-end layout
  constraint ``prefix_allowed_tokens_fn`` and the official negative prompt through the image
  template), transformers' assisted generation (``assistant_model=`` each draft; its defaults, and
  a constant 2 or 4 candidates with the confidence early stop off), and specvis AR, SJD (window 4,
  8), Jacobi (window 4, 8), Speculative (gamma 2, 4; both drafts). Per row: images/s (wall clock of
  everything a user calls, prompt processing included; one untimed warm-up pass, median of the
  timed passes), decoder calls, mean accepted length, and whether the image tokens equal those of
  transformers' plain greedy ``generate`` at the same batch size; a refusal is recorded with its
  exact exception text instead.
- Emu3 greedy without CFG, batch 1: the one case where transformers' assisted generation runs and
  is exact, so its speed is comparable.
- sampled (temperature 1, cfg_scale 3), batch 8, specvis methods only: speed and forward counts.

Writes docs/results/data/families-cpu.json and docs/results/families-cpu.md (atomically). One torch thread.

    OMP_NUM_THREADS=1 python scripts/bench_families.py            # the committed numbers
    OMP_NUM_THREADS=1 python scripts/bench_families.py --quick    # smoke test: 2 prompts, 1 repeat

``--quick`` writes families-cpu-quick.{json,md} unless ``--out`` is given, so it never overwrites
the committed report.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import hf_tiny  # noqa: E402
import transformers  # noqa: E402

import specvis as sv  # noqa: E402
from specvis.bench.report import dumps  # noqa: E402
from specvis.families import emu3 as sv_emu3  # noqa: E402
from specvis.io import write_text  # noqa: E402

PROMPTS = [
    "a red apple on a wooden table",
    "a cat sleeping on a mat",
    "sunset over the sea",
    "two blue birds in a tree",
    "a lighthouse at night, stormy sky",
    "portrait of an old man with a beard",
    "a bowl of ramen, top view",
    "snowy mountains under a clear sky",
]
SEED = 0  # call i of a pass uses seed SEED + i (both libraries; greedy ignores it)
CFG = 3.0
TARGET_SEED, DRAFT_SEED = 0, 1
ASSISTED = {  # transformers' assisted-generation settings (on the assistant's generation_config)
    "defaults": {},  # transformers' own: 20 candidates, constant schedule, confidence stop at 0.4
    "n=2": {"num_assistant_tokens": 2, "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0},
    "n=4": {"num_assistant_tokens": 4, "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0},
}
ASSIST_FIELDS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ setup


def build_checkpoints(root: Path) -> dict[str, dict]:
    out = {}
    for family, make in (("janus", hf_tiny.make_janus), ("emu3", hf_tiny.make_emu3)):
        target = make(root / f"{family}-target", seed=TARGET_SEED)
        drafts = {"seed1": make(root / f"{family}-draft-seed1", seed=DRAFT_SEED),
                  "copy": make(root / f"{family}-draft-copy", seed=TARGET_SEED)}
        model = hf_tiny.load_hf_model(target)
        info = hf_tiny.read_fixture(target)
        out[family] = {"target": target, "drafts": drafts, "info": info,
                       "parameters": sum(p.numel() for p in model.parameters()),
                       "decoder_parameters": sum(p.numel() for p in decoder_of(model).parameters())}
    return out


def decoder_of(model):
    """The transformer stack every forward (prefill, step, CFG branch, verification) goes through."""
    return model.model.language_model if hasattr(model.model, "language_model") else model.model.text_model


class CallCounter:
    """Counts forward calls of a module (a forward hook) while active."""

    def __init__(self, module) -> None:
        self.module, self.calls, self.handle = module, 0, None

    def __enter__(self):
        self.calls = 0
        self.handle = self.module.register_forward_hook(self._hook)
        return self

    def _hook(self, *args) -> None:
        self.calls += 1

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version()}


# ------------------------------------------------------------------------------------------ one call


def hf_call(ckpt: dict, prompts: list[str], cfg: float, seed: int, assistant=None):
    """What a transformers user runs: the processor, then ``generate``; returns codes (B, H*W)."""
    d, info = ckpt["target"], ckpt["info"]
    model = hf_tiny.load_hf_model(d)
    negative = sv_emu3.NEGATIVE if info["family"] == "emu3" else ""
    rows = hf_tiny.prompt_ids(d, prompts, negative)
    kw = {} if assistant is None else {"assistant_model": assistant}
    torch.manual_seed(seed)
    if info["family"] == "janus":
        codes = model.generate(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"],
                               generation_mode="image", do_sample=False, guidance_scale=cfg, **kw)
        return codes.long()
    h, w = info["height"], info["width"]
    if cfg != 1:
        kw.update(guidance_scale=cfg, negative_prompt_ids=rows["uncond_input_ids"],
                  negative_prompt_attention_mask=rows["uncond_attention_mask"])

    def allowed(batch_id: int, row: torch.Tensor) -> list[int]:
        start = int(torch.nonzero(row == info["token_ids"]["wrapper"])[0, 0])
        return hf_tiny.emu3_allowed_tokens(info, row.shape[0] - start)

    seq = model.generate(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"], do_sample=False,
                         max_new_tokens=h * (w + 1) + 3, prefix_allowed_tokens_fn=allowed, **kw)
    return hf_tiny._emu3_codes(info, model, seq[:, rows["input_ids"].shape[1]:])


def sv_call(pipe, ckpt: dict, prompts: list[str], method, sampling, seed: int):
    """What a specvis user runs: ``pipe(prompts=...)`` (the family's template and, for Emu3, its
    official negative prompt, both applied by specvis)."""
    info = ckpt["info"]
    out = pipe(prompts=prompts, method=method, sampling=sampling, seed=seed, decode=False,
               height=info["height"], width=info["width"])
    return out.tokens, out.stats


# ------------------------------------------------------------------------------------------ timing


def passes(call, prompts: list[str], batch: int, repeats: int):
    """One untimed warm-up pass over ``prompts`` in calls of ``batch``, then ``repeats`` timed
    passes. Returns (wall_s of each timed pass, tokens of each pass, per-call results of the last)."""
    chunks = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]

    def one_pass():
        results = [call(chunk, SEED + i) for i, chunk in enumerate(chunks)]
        return results

    walls, tokens, last = [], [], None
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        last = one_pass()
        wall = time.perf_counter() - t0
        toks = torch.cat([x[0] if isinstance(x, tuple) else x for x in last]).cpu()
        if r > 0:
            walls.append(wall)
        tokens.append(toks)
    return walls, tokens, last


def timing_fields(walls: list[float], n_images: int) -> dict:
    med = statistics.median(walls)
    return {"wall_s": med, "wall_s_repeats": [round(w, 6) for w in walls], "images_per_s": n_images / med}


def same(a: torch.Tensor | None, b: torch.Tensor | None):
    if a is None or b is None:
        return None
    return bool(a.shape == b.shape and torch.equal(a, b))


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def run_hf(ckpt, prompts, batch, cfg, repeats, reference, assistant=None, assistant_name=None, setting=None):
    model = hf_tiny.load_hf_model(ckpt["target"])
    row = {"library": "transformers", "method": "generate" if assistant is None else "assisted",
           "config": {} if assistant is None else {"assistant": assistant_name, "setting": setting,
                                                   **ASSISTED[setting]}}
    saved = None
    if assistant is not None:
        gc = assistant.generation_config
        saved = {k: getattr(gc, k, None) for k in ASSIST_FIELDS}
        for k, v in ASSISTED[setting].items():
            setattr(gc, k, v)
    try:
        with CallCounter(decoder_of(model)) as tc, \
                CallCounter(decoder_of(assistant) if assistant is not None else torch.nn.Identity()) as dc:
            walls, tokens, _ = passes(lambda p, s: hf_call(ckpt, p, cfg, s, assistant), prompts, batch, repeats)
        n_passes = repeats + 1
        row.update(timing_fields(walls, len(prompts)))
        row["decoder_calls"] = tc.calls // n_passes
        if assistant is not None:
            row["assistant_decoder_calls"] = dc.calls // n_passes
        row["deterministic"] = all(torch.equal(t, tokens[0]) for t in tokens)
        row["equal_hf_greedy"] = same(tokens[-1], reference) if reference is not None else True
        row["_tokens"] = tokens[-1]
    except Exception as e:  # a refusal: its exact text is the result
        row["error"] = error_text(e)
    finally:
        if saved is not None:
            for k, v in saved.items():
                setattr(assistant.generation_config, k, v)
    return row


def run_sv(pipe, ckpt, prompts, batch, method, config: dict, sampling, repeats, reference, draft_name=None):
    row = {"library": "specvis", "method": method.name, "config": dict(config)}
    if draft_name is not None:
        row["config"]["draft"] = draft_name
    try:
        walls, tokens, last = passes(lambda p, s: sv_call(pipe, ckpt, p, method, sampling, s), prompts, batch,
                                     repeats)
    except Exception as e:
        row["error"] = error_text(e)
        log(f"  specvis {method.name} {config} FAILED: {row['error']}")
        return row
    stats = [st for _, st in last]
    row.update(timing_fields(walls, len(prompts)))
    row["target_forwards"] = sum(st.target_forwards for st in stats)
    row["draft_forwards"] = sum(st.draft_forwards for st in stats)
    row["mean_accepted_length"] = statistics.fmean(st.mean_accepted_length for st in stats)
    row["step_compression"] = statistics.fmean(st.step_compression for st in stats)
    row["loop_wall_s"] = sum(st.wall_s for st in stats)  # specvis's own timing of its decode loops
    row["deterministic"] = all(torch.equal(t, tokens[0]) for t in tokens)
    if reference is not None:
        row["equal_hf_greedy"] = same(tokens[-1], reference)
    return row


def specvis_methods(greedy: bool):
    """(method, config, draft name or None) in table order."""
    out = [(sv.AR(), {}, None)]
    for w in (4, 8):
        out.append((sv.SJD(window=w), {"window": w}, None))
    if greedy:
        for w in (4, 8):
            out.append((sv.Jacobi(window=w), {"window": w}, None))
    for draft in ("seed1", "copy"):
        for g in (2, 4):
            out.append((sv.Speculative(gamma=g), {"gamma": g}, draft))
    return out


def run_case(family, ckpt, pipes, prompts, batch, sampling, repeats, with_hf: bool) -> dict:
    label = (f"{family}, batch {batch}, " + ("greedy" if sampling.greedy else f"temperature {sampling.temperature:g}")
             + (f", cfg {sampling.cfg_scale:g}" if sampling.uses_cfg else ", no cfg"))
    log(f"== {label}")
    case = {"family": family, "batch": batch, "n_images": len(prompts), "temperature": sampling.temperature,
            "cfg_scale": sampling.cfg_scale, "top_k": sampling.top_k, "top_p": sampling.top_p, "runs": []}
    reference = None
    if with_hf:
        plain = run_hf(ckpt, prompts, batch, sampling.cfg_scale, repeats, None)
        reference = plain.get("_tokens")
        case["runs"].append(plain)
        log(f"  transformers generate: {fmt_row(plain)}")
        for name, model in pipes["assistants"].items():
            for setting in ASSISTED:
                row = run_hf(ckpt, prompts, batch, sampling.cfg_scale, repeats, reference, model, name, setting)
                case["runs"].append(row)
                log(f"  transformers assisted {name} {setting}: {fmt_row(row)}")
                if "error" in row:
                    break  # refused: the other settings are refused the same way (checked by the first)
    for method, config, draft in specvis_methods(sampling.greedy):
        pipe = pipes["plain"] if draft is None else pipes[draft]
        row = run_sv(pipe, ckpt, prompts, batch, method, config, sampling, repeats,
                     reference if sampling.greedy else None, draft)
        case["runs"].append(row)
        log(f"  specvis {method.name} {row['config']}: {fmt_row(row)}")
    hf_ips = next((r["images_per_s"] for r in case["runs"] if r["method"] == "generate" and "images_per_s" in r), None)
    ar_ips = next((r["images_per_s"] for r in case["runs"] if r["method"] == "ar" and "images_per_s" in r), None)
    for r in case["runs"]:
        if "images_per_s" in r:
            if hf_ips:
                r["vs_hf_generate"] = r["images_per_s"] / hf_ips
            if ar_ips:
                r["vs_specvis_ar"] = r["images_per_s"] / ar_ips
    case["reference_tokens"] = None if reference is None else reference.tolist()
    for r in case["runs"]:
        r.pop("_tokens", None)
    return case


def fmt_row(r: dict) -> str:
    if "error" in r:
        return f"refused/failed: {r['error'][:160]}"
    eq = r.get("equal_hf_greedy")
    return f"{r['images_per_s']:.2f} img/s" + ("" if eq is None else f", equal to greedy: {eq}")


# ------------------------------------------------------------------------------------------ report


def cell_method(r: dict) -> str:
    if r["library"] == "transformers":
        if r["method"] == "generate":
            return "`generate`"
        return f"`generate(assistant_model={r['config']['assistant']})`, {r['config']['setting']}"
    c = dict(r["config"])
    draft = c.pop("draft", None)
    name = {"ar": "AR", "sjd": "SJD", "jacobi": "Jacobi", "speculative": "Speculative"}.get(r["method"], r["method"])
    args = ", ".join(f"{k}={v}" for k, v in c.items())
    return f"{name}({args})" + (f", draft {draft}" if draft else "")


def markdown(report: dict) -> str:
    env = report["environment"]
    eh, ew = report["checkpoints"]["emu3"]["grid"]
    e_img, e_stream = eh * ew, eh * (ew + 1)
    lines = [
        "# specvis next to transformers: tiny Janus-Pro and Emu3, CPU",
        "",
        f"Generated by `scripts/bench_families.py` ({report['created']}). Machine: {env['cpu']}, "
        f"{env['logical_cpus']} logical CPUs; torch {env['torch']} with **{env['torch_threads']} thread** "
        f"(`torch.set_num_threads(1)`, OMP_NUM_THREADS={env['OMP_NUM_THREADS']}), transformers "
        f"{env['transformers']}, Python {env['python']}. {report['protocol']['n_prompts']} prompts, "
        f"seeds {SEED}.. (call i of a pass uses seed {SEED} + i, the same in both libraries); one untimed "
        f"warm-up pass, then the median of {report['protocol']['repeats']} timed passes. Load average "
        f"before / after: {env['loadavg_start']} / {env['loadavg_end']}.",
        "",
        "**What this is.** Tiny random checkpoints in the official transformers layout "
        "(`tests/hf_tiny.py`: hidden 64, 2 layers, codebook 32; Janus 4x4 image tokens, Emu3 3x4 plus row "
        "ends), float32, on CPU with one thread. The drafts are `seed1` (the same architecture, other "
        "random weights: it agrees with the target by chance only) and `copy` (a second copy of the "
        "target: every draft is accepted, the best case a draft can give). images/s is the wall clock "
        "of everything the user calls (prompt processing, generate or `pipe(...)`, no image decoding). "
        "\"decoder calls / target forwards\" count calls of the transformer stack for the whole pass "
        "(all images): for transformers, every call of the target's decoder (prefill, steps, and for "
        "Emu3 the separate negative-prompt calls of its CFG processor); for specvis, its batched "
        "target forwards (both CFG halves in one call). Mean accepted length is specvis's own statistic: "
        "image tokens committed per target forward, averaged over images; Emu3's forced row ends take "
        f"forwards but are not image tokens, so there AR shows {e_img}/{e_stream} = {e_img / e_stream:.2f}, not 1. \"= greedy\" "
        "compares the image tokens with transformers' plain greedy `generate` at the same batch size.",
        "",
        "**What it does not say.** These models are so small that a forward costs about as much as the "
        "framework's fixed per-call work, so the timings measure each library's per-step overhead "
        "(Python, logits processing, cache handling) more than model compute; on real 7B checkpoints a forward costs orders of magnitude more, its cost grows less "
        "than linearly with the number of tokens verified at once on a GPU, and the speed ratios here "
        "do not carry over. The acceptance of the `seed1` draft and of SJD/Jacobi is that of random "
        "models, not of real ones. Real Janus-Pro and Emu3 checkpoints were not run: no weights can be "
        "downloaded on this machine. What does carry over is the behaviour: which calls transformers "
        "refuses, and whether each method's tokens equal plain greedy decoding.",
        "",
    ]
    for fam in ("janus", "emu3"):
        ck = report["checkpoints"][fam]
        lines += [f"## {'Janus-Pro' if fam == 'janus' else 'Emu3'}", "",
                  f"Target: seed {ck['target_seed']}, {ck['parameters']:,} parameters "
                  f"({ck['decoder_parameters']:,} in the decoder), grid {ck['grid'][0]}x{ck['grid'][1]}, "
                  f"codebook {ck['codebook']}." + (" CFG for Emu3 uses the official negative prompt through "
                                                    "the image template, in both libraries." if fam == "emu3" else ""),
                  ""]
        notes: dict[str, int] = {}
        for case in (c for c in report["cases"] if c["family"] == fam):
            samp = ("greedy" if case["temperature"] == 0 else f"sampled, temperature {case['temperature']:g}")
            cfg = f"cfg {case['cfg_scale']:g}" if case["cfg_scale"] != 1 else "no CFG"
            lines += [f"### batch {case['batch']}, {samp}, {cfg}", "",
                      "| library | method | images/s | vs transformers generate | vs specvis AR "
                      "| decoder calls / target forwards | mean accepted length | = greedy |",
                      "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
            for r in case["runs"]:
                if "error" in r:
                    n = notes.setdefault(r["error"], len(notes) + 1)
                    lines.append(f"| {r['library']} | {cell_method(r)} | - | - | - | - | - | "
                                 f"**refused** [{n}] |" if r["library"] == "transformers" else
                                 f"| {r['library']} | {cell_method(r)} | - | - | - | - | - | **failed** [{n}] |")
                    continue
                calls = r.get("decoder_calls", r.get("target_forwards"))
                if "assistant_decoder_calls" in r:
                    calls = f"{calls} (+{r['assistant_decoder_calls']} assistant)"
                elif r.get("draft_forwards"):
                    calls = f"{calls} (+{r['draft_forwards']} draft)"
                mal = f"{r['mean_accepted_length']:.2f}" if "mean_accepted_length" in r else "-"
                eq = r.get("equal_hf_greedy")
                eq = "-" if eq is None else ("yes" if eq else "**no**")
                vs_hf = f"{r['vs_hf_generate']:.2f}x" if "vs_hf_generate" in r else "-"
                vs_ar = f"{r['vs_specvis_ar']:.2f}x" if "vs_specvis_ar" in r else "-"
                lines.append(f"| {r['library']} | {cell_method(r)} | {r['images_per_s']:.2f} | {vs_hf} | {vs_ar} "
                             f"| {calls} | {mal} | {eq} |")
            lines.append("")
        for text, n in notes.items():
            lines.append(f"[{n}] `{text}`")
        if notes:
            lines.append("")
    lines += ["## Findings", ""] + [f"- {f}" for f in findings(report)] + [""]
    return "\n".join(lines)


def findings(report: dict) -> list[str]:
    """Statements read off the measurements (nothing here is assumed)."""
    out = []
    for fam in ("janus", "emu3"):
        refs = {c["batch"]: c["reference_tokens"] for c in report["cases"]
                if c["family"] == fam and c["temperature"] == 0 and c["cfg_scale"] == CFG and c.get("reference_tokens")}
        if 1 in refs and len(refs) > 1:
            big = max(refs)
            out.append(f"{fam}: transformers' greedy generate with CFG gives the same tokens at batch {big} as at "
                       f"batch 1: {'yes' if refs[big] == refs[1] else 'NO'}.")
        for case in (c for c in report["cases"] if c["family"] == fam):
            tag = (f"{fam}, batch {case['batch']}, "
                   + ("greedy" if case["temperature"] == 0 else f"temperature {case['temperature']:g}")
                   + (f", cfg {case['cfg_scale']:g}" if case["cfg_scale"] != 1 else ", no CFG"))
            assisted = [r for r in case["runs"] if r["method"] == "assisted"]
            refused = sorted({r["error"] for r in assisted if "error" in r})
            for e in refused:
                out.append(f"{tag}: transformers' assisted generation refuses: `{e}`.")
            ran = [r for r in assisted if "error" not in r]
            if ran:
                eq = [f"{r['config']['assistant']}/{r['config']['setting']}: "
                      f"{'equal' if r['equal_hf_greedy'] else 'DIFFERENT'}" for r in ran]
                out.append(f"{tag}: transformers' assisted generation runs; tokens vs plain greedy: " + ", ".join(eq) + ".")
            sv_rows = [r for r in case["runs"] if r["library"] == "specvis"]
            failed = [r for r in sv_rows if "error" in r]
            for r in failed:
                out.append(f"{tag}: specvis {cell_method(r)} FAILED: `{r['error']}`.")
            if case["temperature"] == 0 and any("equal_hf_greedy" in r for r in sv_rows):
                bad = [cell_method(r) for r in sv_rows if r.get("equal_hf_greedy") is False]
                ok = [r for r in sv_rows if r.get("equal_hf_greedy")]
                out.append(f"{tag}: specvis {len(ok)} of {len(sv_rows)} runs give transformers' greedy tokens"
                           + (f"; DIFFERENT: {', '.join(bad)}" if bad else "") + ".")
            hf = next((r for r in case["runs"] if r["method"] == "generate" and "images_per_s" in r), None)
            ar = next((r for r in sv_rows if r["method"] == "ar" and "images_per_s" in r), None)
            if hf and ar:
                out.append(f"{tag}: specvis AR {ar['images_per_s']:.1f} images/s vs transformers generate "
                           f"{hf['images_per_s']:.1f} ({ar['images_per_s'] / hf['images_per_s']:.2f}x).")
    return out


# ------------------------------------------------------------------------------------------ main


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 prompts, 1 timed repeat")
    ap.add_argument("--repeats", type=int, default=None, help="timed passes per row (default 3; 1 with --quick)")
    ap.add_argument("--out", default=None, help="output stem: STEM.json and STEM.md (default docs/results/data/families-cpu[-quick].json, the page docs/results/families-cpu[-quick].md)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore")
    prompts = PROMPTS[:2] if args.quick else PROMPTS
    repeats = args.repeats or (1 if args.quick else 3)
    stem = Path(args.out) if args.out else ROOT / "docs" / "results" / "data" / ("families-cpu-quick" if args.quick else "families-cpu")
    t_start = time.perf_counter()
    env = {"torch": torch.__version__, "transformers": transformers.__version__, "specvis": getattr(sv, "__version__", None),
           "torch_threads": torch.get_num_threads(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
           **machine(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]}
    # transformers adapts the assistant's confidence threshold during generation only when sklearn is installed
    env["sklearn_available"] = importlib.util.find_spec("sklearn") is not None
    report = {"benchmark": "families-cpu", "created": datetime.datetime.now().isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
              "quick": args.quick, "environment": env,
              "protocol": {"n_prompts": len(prompts), "prompts": prompts, "seed": SEED, "repeats": repeats,
                           "warmup_passes": 1, "timing": "median wall clock of a pass over all prompts",
                           "cfg_scale": CFG, "assisted_settings": ASSISTED},
              "checkpoints": {}, "cases": []}
    with tempfile.TemporaryDirectory(prefix="bench_families_") as tmp:
        ckpts = build_checkpoints(Path(tmp))
        for fam, ck in ckpts.items():
            report["checkpoints"][fam] = {"target_seed": TARGET_SEED, "drafts": {"seed1": DRAFT_SEED, "copy": TARGET_SEED},
                                          "grid": [ck["info"]["height"], ck["info"]["width"]],
                                          "codebook": ck["info"]["codebook"], "parameters": ck["parameters"],
                                          "decoder_parameters": ck["decoder_parameters"]}
        for fam, ck in ckpts.items():
            pipes = {"plain": sv.load(str(ck["target"])),
                     "assistants": {k: hf_tiny.load_hf_model(d) for k, d in ck["drafts"].items()}}
            for k, d in ck["drafts"].items():
                pipes[k] = sv.load(str(ck["target"]), draft=str(d))
            greedy = sv.Sampling(temperature=0.0, cfg_scale=CFG)
            for batch in (1, len(prompts)):
                report["cases"].append(run_case(fam, ck, pipes, prompts, batch, greedy, repeats, with_hf=True))
            if fam == "emu3":  # the one case where transformers' assisted generation is exact
                report["cases"].append(run_case(fam, ck, pipes, prompts, 1, sv.Sampling(temperature=0.0, cfg_scale=1.0),
                                                repeats, with_hf=True))
            report["cases"].append(run_case(fam, ck, pipes, prompts, len(prompts),
                                            sv.Sampling(temperature=1.0, cfg_scale=CFG), repeats, with_hf=False))
    env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report["total_s"] = round(time.perf_counter() - t_start, 1)
    report["findings"] = findings(report)
    stem.parent.mkdir(parents=True, exist_ok=True)
    write_text(stem.with_suffix(".json"), dumps(report) + "\n")
    md = stem.with_suffix(".md") if args.out else ROOT / "docs" / "results" / f"{stem.name}.md"  # the current page
    write_text(md, markdown(report))
    log(f"wrote {stem.with_suffix('.json')} and {md} in {report['total_s']} s")
    for f in report["findings"]:
        log(f"- {f}")


if __name__ == "__main__":
    main()
