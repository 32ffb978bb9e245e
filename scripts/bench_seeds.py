"""One picture per seed on the embedded models: what keyed noise and ``sv.Coupled`` cost and give.

    python scripts/bench_seeds.py [--parts default,accept,cost,figure,bf16] [--num 64] [--seed 777]
                                  [--models emoji,emoji-t2i] [--batch-sizes 1,8]
                                  [--out docs/results/data/seeds-cpu.json] [--page docs/results/seeds-cpu.md]

Work list as the bench's (``specvis.shards.batches``): image i has class i mod the classes (``emoji``) or prompt
i mod the 64 of docs/results/data/emoji-t2i-prompts.txt (``emoji-t2i``), at the model's sampling with T = 1.
Stream noise runs batch j with seed + j; keyed noise (the default for these models) gives image i seed + i.
Every run pins its noise and rule. Parts:

- ``default``: the default method's mean accepted length at batch 1 under stream noise with ``Exact`` (the
  former default) and under keyed noise with ``Coupled``, and their ratio: keyed noise is the default where it
  is >= 0.95 on both models (counts only, no time);
- ``accept``: every lossless method (AR, Speculative, SJD, EagleTree, ADTTree, StaticTree) under stream + Exact
  and keyed + Coupled, at each batch size: mean accepted length, images/s (decode wall, after an untimed
  one-batch warm-up) and, under keyed noise, how many images equal keyed AR's token for token (seeds
  seed .. seed + num - 1);
- ``cost``: the keyed noise's share of a round: SJD (the default) under keyed noise at batch 8 on
  ``emoji-t2i``, with every call of ``noise.exponentials`` timed (CPU: synchronous), against the decode's wall
  and its target forwards' seconds (goal: <= 5% of a round);
- ``figure``: one seed's image under AR, SJD and a sampled tree (StaticTree) side by side:
  docs/img/seeds-same-picture.png, and whether the three are identical;
- ``bf16``: the models in bf16: how often SJD's and EagleTree's tokens flip away from bf16 AR's (a 1-token and a
  17-token forward round differently, so a near-tie in the race may flip): first flips per million tokens.

Timed parts need the machine alone (one thread; the lead runs them). ``--page`` writes the markdown page from
the JSON (``--parts none --page ...`` rewrites the page alone). Parts already in ``--out`` are kept unless rerun.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch
from PIL import Image

import specvis as sv
import specvis.methods.keyed as keyed_module
from specvis.cli import default_method_spec, read_prompts
from specvis.io import write_text
from specvis.registry import describe, method_from_spec
from specvis.shards import batches
from specvis.viz import contact_sheet

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "docs" / "results" / "data" / "emoji-t2i-prompts.txt"
METHODS = ["ar", "speculative:gamma=4", "sjd:window=16:init=vertical-sample:coupling=gumbel", "eagle:total_tokens=16",
           "adt:total_tokens=16", "static-tree"]
FIGURE = ["ar", "sjd:window=16:init=vertical-sample:coupling=gumbel", "static-tree"]
BF16 = ["sjd:window=16:init=vertical-sample:coupling=gumbel", "eagle:total_tokens=16"]
MODES = {"stream+exact": ("stream", "exact"), "keyed+coupled": ("keyed", "coupled")}


def conditions(pipe, name: str) -> list:
    return read_prompts(str(PROMPTS)) if name == "emoji-t2i" else list(range(pipe.num_classes))


def call(pipe, conds: list, method, sampling, seed: int, decode: bool = False):
    kw = {"prompts": conds} if pipe.num_classes == 0 else {"classes": conds}
    return pipe(method=method, sampling=sampling, seed=seed, decode=decode, **kw)


def run(pipe, name: str, spec: str, mode: str, num: int, batch: int, seed: int, warm: bool = True) -> dict:
    """One method over the work list: counts, decode wall and the tokens (CPU) of every image."""
    noise, rule = MODES[mode]
    sampling = dataclasses.replace(pipe.default_sampling, temperature=1.0, noise=noise)
    method = method_from_spec(spec if spec == "ar" else f"{spec}:accept={rule}")
    conds = conditions(pipe, name)
    work = [([conds[c] for c in cs], s) for cs, s in batches(num, batch, len(conds), seed, keyed=noise == "keyed")]
    if warm:
        call(pipe, work[0][0], method, sampling, work[0][1])  # untimed: one-time costs
    tokens, wall, mal, forwards, per_call = [], 0.0, 0.0, 0, []
    for cs, s in work:
        out = call(pipe, cs, method, sampling, s)
        tokens.append(out.tokens.cpu())
        wall += out.stats.wall_s
        mal += out.stats.mean_accepted_length * len(cs)
        per_call.append(out.stats.mean_accepted_length)
        forwards += out.stats.target_forwards
    _, config, used = describe(out.method)
    return {"model": name, "method": out.method.name, "spec": spec, "config": config, "acceptance": used,
            "noise": noise, "batch_size": batch, "n_images": num, "seed": seed, "mean_accepted_length": mal / num,
            "target_forwards": forwards, "wall_s": wall, "images_per_s": num / wall if wall > 0 else None,
            "per_call_mean_accepted_length": per_call, "tokens": torch.cat(tokens)}


def part_default(pipes: dict, a) -> list[dict]:
    rows = []
    for name, pipe in pipes.items():
        spec = default_method_spec(pipe)
        got = {mode: run(pipe, name, spec, mode, a.num, 1, a.seed, warm=False) for mode in MODES}
        means = {m: got[m]["mean_accepted_length"] for m in MODES}
        ratio = means["keyed+coupled"] / means["stream+exact"]
        # batch 1: one image a call; the ratio's standard error by the delta method (independent runs)
        se = {m: statistics.stdev(got[m]["per_call_mean_accepted_length"]) / a.num ** 0.5 if a.num > 1 else 0.0
              for m in MODES}
        ratio_se = ratio * ((se["keyed+coupled"] / means["keyed+coupled"]) ** 2
                            + (se["stream+exact"] / means["stream+exact"]) ** 2) ** 0.5
        rows.append({"model": name, "spec": spec, "n_images": a.num, "batch_size": 1, "seed": a.seed,
                     **{f"mal_{m}": means[m] for m in MODES}, **{f"se_{m}": se[m] for m in MODES},
                     "ratio": ratio, "ratio_se": ratio_se,
                     **{f"per_image_{m}": got[m]["per_call_mean_accepted_length"] for m in MODES}})
        print(f"default {name} {spec}: {rows[-1]}", flush=True)
    return rows


def part_accept(pipes: dict, a) -> list[dict]:
    rows = []
    for name, pipe in pipes.items():
        for batch in a.batch_sizes:
            ar_keyed = None
            for spec in METHODS:
                for mode in MODES:
                    r = run(pipe, name, spec, mode, a.num, batch, a.seed)
                    toks = r.pop("tokens")
                    r.pop("per_call_mean_accepted_length")
                    if mode == "keyed+coupled":
                        if spec == "ar":
                            ar_keyed = toks
                        r["images_equal_ar"] = int((toks == ar_keyed).all(1).sum())
                        r["tokens_differing_ar"] = int((toks != ar_keyed).sum())
                    rows.append(r)
                    print(f"accept {name} b{batch} {spec} {mode}: mal {r['mean_accepted_length']:.3f} "
                          f"{r['images_per_s']:.3f} img/s {r.get('images_equal_ar', '')}", flush=True)
    return rows


def part_cost(pipes: dict, a) -> dict:
    """Every keyed-noise call of a real decode timed (CPU work is synchronous), against the decode's wall."""
    name = "emoji-t2i" if "emoji-t2i" in pipes else next(iter(pipes))
    pipe = pipes[name]
    spec = default_method_spec(pipe)
    spent = [0.0, 0]
    inner = keyed_module.exponentials

    def timed(*args):
        sync = torch.cuda.synchronize if args[0].is_cuda else (lambda: None)  # CUDA returns before its kernels end
        sync()
        t0 = time.perf_counter()
        out = inner(*args)
        sync()
        spent[0] += time.perf_counter() - t0
        spent[1] += 1
        return out

    run(pipe, name, spec, "keyed+coupled", 8, 8, a.seed)  # warm-up
    keyed_module.exponentials = timed
    try:
        sampling = dataclasses.replace(pipe.default_sampling, temperature=1.0, noise="keyed")
        conds = conditions(pipe, name)
        walls, noise_s, fwd_s, rounds = [], [], [], 0
        for rep in range(a.cost_repeats):
            spent[0] = 0.0
            out = call(pipe, conds[:8], method_from_spec(spec), sampling, a.seed + 8 * rep)
            walls.append(out.stats.wall_s)
            noise_s.append(spent[0])
            fwd_s.append(out.stats.forward_s.get("target", float("nan")))
            rounds = out.stats.target_forwards - 1  # the prefill is no round
    finally:
        keyed_module.exponentials = inner
    share = [n / w for n, w in zip(noise_s, walls)]
    return {"model": name, "spec": spec, "batch_size": 8, "rounds": rounds, "repeats": a.cost_repeats,
            "noise_calls_last": spent[1], "wall_s": walls, "noise_s": noise_s, "target_forward_s": fwd_s,
            "noise_ms_per_round": 1e3 * statistics.median(noise_s) / rounds,
            "round_ms": 1e3 * statistics.median(walls) / rounds,
            "target_forward_ms_per_round": 1e3 * statistics.median(fwd_s) / rounds,
            "noise_share_of_round": statistics.median(share)}


def part_figure(pipes: dict, a) -> dict:
    name = "emoji" if "emoji" in pipes else next(iter(pipes))
    pipe = pipes[name]
    sampling = dataclasses.replace(pipe.default_sampling, temperature=1.0, noise="keyed")
    conds = conditions(pipe, name)[:1]
    outs = [call(pipe, conds, method_from_spec(s), sampling, a.seed, decode=True) for s in FIGURE]
    path = ROOT / "docs" / "img" / "seeds-same-picture.png"
    big = [o.images[0].resize((3 * o.images[0].width, 3 * o.images[0].height), Image.NEAREST) for o in outs]
    contact_sheet(big, ncol=len(outs)).save(path)
    same = all(torch.equal(o.tokens, outs[0].tokens) for o in outs)
    return {"model": name, "seed": a.seed, "condition": conds[0], "methods": FIGURE, "identical": same,
            "png": str(path.relative_to(ROOT))}


def part_bf16(a) -> list[dict]:
    rows = []
    for name in a.models:
        pipe = sv.load(name, device=a.device, dtype="bf16", threads=1)
        ar = run(pipe, name, "ar", "keyed+coupled", a.num, 8, a.seed, warm=False)["tokens"]
        for spec in BF16:
            toks = run(pipe, name, spec, "keyed+coupled", a.num, 8, a.seed, warm=False)["tokens"]
            differ = toks != ar
            flipped = differ.any(1)
            # once a token flips the rest of the image follows another prefix: count first flips per token
            # compared up to the first flip (a geometric rate), not every differing token
            first = torch.where(flipped, differ.long().argmax(1), torch.full_like(flipped, toks.shape[1], dtype=torch.long))
            exposure = int(torch.where(flipped, first + 1, first).sum())
            rows.append({"model": name, "spec": spec, "dtype": "bf16", "n_images": a.num, "tokens": toks.numel(),
                         "tokens_differing": int(differ.sum()), "images_differing": int(flipped.sum()),
                         "images_changed": flipped.nonzero().flatten().tolist(), "first_flip_positions": first[flipped].tolist(), "tokens_compared": exposure,
                         "flips_per_million": 1e6 * int(flipped.sum()) / exposure})
            print(f"bf16 {rows[-1]}", flush=True)
    return rows


def same_first_flips(x: dict, y: dict) -> str:
    """How many images two bf16 runs (same seeds) first leave AR's tokens at the same position, of those both
    leave: ``first_flip_positions`` lists only the images that changed, so they are matched by image index."""
    fx, fy = dict(zip(x["images_changed"], x["first_flip_positions"])), dict(zip(y["images_changed"], y["first_flip_positions"]))
    both = fx.keys() & fy.keys()
    return f"{sum(fx[i] == fy[i] for i in both)} / {len(both)}"


def page(data: dict) -> str:
    """The results page, from the JSON alone."""
    out = ["# One picture per seed: keyed noise and `sv.Coupled` on CPU", "",
           "Generated by `scripts/bench_seeds.py --page docs/results/seeds-cpu.md` from "
           "`docs/results/data/seeds-cpu.json` (what ran, how: the script's docstring). Under keyed noise image i "
           "has seed seed + i and every lossless method verifies by `Coupled`; stream + Exact is "
           "`noise=\"stream\"`, the former default.", ""]
    meta = data.get("meta", {})
    if meta:
        out += [f"Machine: {meta.get('cpu')}, torch {meta.get('torch')}, {meta.get('threads')} thread(s).", ""]
    if "default" in data:
        out += ["## The default noise", "", "Batch 1, T = 1, the model's CFG; mean accepted length over the images "
                "(+- its standard error); the ratio's standard error by the delta method (the two runs are independent).", "",
                "| model | default method | images | stream + Exact | keyed + Coupled | ratio |",
                "| --- | --- | ---: | ---: | ---: | ---: |"]
        for r in data["default"]:
            out.append(f"| {r['model']} | `{r['spec']}` | {r['n_images']} | {r['mal_stream+exact']:.3f} +- "
                       f"{r['se_stream+exact']:.3f} | {r['mal_keyed+coupled']:.3f} +- {r['se_keyed+coupled']:.3f} | "
                       f"{r['ratio']:.3f} +- {r['ratio_se']:.3f} |")
        keyed = all(r["ratio"] >= 0.95 for r in data["default"])
        margins = ", ".join(f"{r['model']} {(r['ratio'] - 0.95) / r['ratio_se']:+.1f}" for r in data["default"] if r["ratio_se"])
        out += ["", f"Rule: keyed noise becomes the default if the ratio is >= 0.95 on both models: "
                f"**{'keyed' if keyed else 'stream'}** by the point estimates (distance to 0.95 in standard errors: "
                f"{margins}). The library's default now: `Sampling().noise` is None, the model's default, which resolves to "
                f"`\"{sv.Sampling().resolved(discrete=True).noise}\"` for these discrete-token models.", ""]
    if "accept" in data:
        out += ["## Every lossless method", "", "| model | batch | method | stream + Exact: accepted | img/s | "
                "keyed + Coupled: accepted | img/s | images equal to AR's |", "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
        rows = data["accept"]
        for r in rows:
            if r["noise"] != "stream":
                continue
            k = next(x for x in rows if x["noise"] == "keyed" and x["model"] == r["model"] and x["spec"] == r["spec"]
                     and x["batch_size"] == r["batch_size"])
            out.append(f"| {r['model']} | {r['batch_size']} | `{r['spec']}` | {r['mean_accepted_length']:.2f} | "
                       f"{r['images_per_s']:.2f} | {k['mean_accepted_length']:.2f} | {k['images_per_s']:.2f} | "
                       f"{k['images_equal_ar']} / {k['n_images']} |")
        out.append("")
    if "cost" in data:
        c = data["cost"]
        out += ["## The noise's cost", "", f"{c['model']}, `{c['spec']}` under keyed noise at batch {c['batch_size']}, "
                f"{c['repeats']} decodes: keyed noise {c['noise_ms_per_round']:.2f} ms a round of "
                f"{c['round_ms']:.2f} ms (target forwards {c['target_forward_ms_per_round']:.2f} ms a round): "
                f"**{100 * c['noise_share_of_round']:.1f}%** of a round (goal <= 5%).", ""]
    if "figure" in data:
        f = data["figure"]
        out += ["## The same picture", "", f"![{', '.join(f['methods'])}](../img/seeds-same-picture.png)", "",
                f"{f['model']}, condition {f['condition']}, seed {f['seed']}: {', '.join(f'`{m}`' for m in f['methods'])} "
                f"(left to right); tokens identical: **{f['identical']}**.", ""]
    if "bf16" in data:
        out += ["## bf16", "", "The models in bf16, keyed noise, the method against bf16 AR on the same seeds. A flip sends the "
                "rest of the image down another prefix, so the rate counts first flips per token compared up to the "
                "first flip (tokens differing in all: the next column).", "",
                "| model | method | images | images differing | tokens differing | first flips per million tokens |",
                "| --- | --- | ---: | ---: | ---: | ---: |"]
        for r in data["bf16"]:
            out.append(f"| {r['model']} | `{r['spec']}` | {r['n_images']} | {r['images_differing']} | "
                       f"{r['tokens_differing']} | {r['flips_per_million']:.0f} |")
        out.append("")
        for name in dict.fromkeys(r["model"] for r in data["bf16"]):
            pair = [r for r in data["bf16"] if r["model"] == name]
            if len(pair) == 2 and pair[0]["n_images"] == pair[1]["n_images"]:
                same = same_first_flips(*pair)
                out.append(f"- {name}: `{pair[0]['spec']}` and `{pair[1]['spec']}` first leave AR at the same position in "
                           f"{same} of the images both change: what flips a near-tie is mostly the rounding of AR's "
                           f"one-token forward against a multi-token one, not the drafts.")
        out += ["", "In fp32 every keyed image equals AR's (the table above and the tests); in bf16 "
                "the picture is AR's only up to the first near-tie.", ""]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="default,accept,cost,figure,bf16")
    ap.add_argument("--num", type=int, default=64, help="images per run (>= 1)")
    ap.add_argument("--seed", type=int, default=777)
    ap.add_argument("--models", default="emoji,emoji-t2i")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--cost-repeats", type=int, default=5, help="decodes timed by the cost part (>= 1)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "data" / "seeds-cpu.json"))
    ap.add_argument("--page", help="write the markdown page here from --out")
    ap.add_argument("--device", default="cpu", help="where the models run (cpu, cuda)")
    a = ap.parse_args()
    parts = [p for p in a.parts.split(",") if p and p != "none"]
    unknown = sorted(set(parts) - {"default", "accept", "cost", "figure", "bf16"})
    if unknown or a.num < 1 or a.cost_repeats < 1:
        raise SystemExit(f"--parts takes default, accept, cost, figure, bf16 (got {unknown}); --num and --cost-repeats >= 1")
    a.models = [m for m in a.models.split(",") if m]
    a.batch_sizes = [int(b) for b in a.batch_sizes.split(",") if b]
    torch.set_num_threads(1)
    out = Path(a.out)
    data = json.loads(out.read_text()) if out.exists() else {}
    from specvis.cpu_features import cpu_description

    if parts:  # the machine the parts run on (a page alone keeps the recorded one)
        data["meta"] = {"cpu": cpu_description(), "torch": torch.__version__, "threads": torch.get_num_threads()}
    pipes = {m: sv.load(m, device=a.device, threads=1) for m in a.models} if set(parts) - {"bf16"} else {}
    for part in parts:
        if part == "bf16":
            data[part] = part_bf16(a)
        else:
            data[part] = {"default": part_default, "accept": part_accept, "cost": part_cost,
                          "figure": part_figure}[part](pipes, a)
        write_text(out, json.dumps(data, indent=1))  # after every part: an interrupted run keeps the parts done
    if a.page:
        write_text(Path(a.page), page(data) + "\n")
    print(f"wrote {out}" + (f" and {a.page}" if a.page else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
