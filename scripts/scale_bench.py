"""Real scale on this machine: synthetic checkpoints of the real families at 0.3B, 1.5B and 7B shapes
(``scripts/synthetic_checkpoint.py``), loaded and run by specvis. Benchmark, not a test: run it
alone on the machine, one torch thread (it sets ``sv.load(threads=1)``), and only where the 7B
shapes fit (about 14 GB of bf16 weights, 18 GiB available).

    python scripts/scale_bench.py run --families lumina,janus --sizes 0.3b,1.5b,7b \\
        --scratch /work/scale-tmp --json docs/results/data/scale.json --md docs/results/data/scale-runs.md

For each family and size it measures, each in a fresh process:

- ``load``: ``sv.load(DIR, threads=1)`` (dtype: the default, or ``--dtype``/``--quantize``): its
  seconds, the process's peak resident memory (``VmHWM`` of /proc/self/status, i.e. ru_maxrss) and
  its resident memory before (Python, torch and specvis imported) and after, the bytes of the
  loaded weights and of those left in the files' mappings (``models.loading.mapped_weight_bytes``); against ``cat DIR/*.safetensors > /dev/null`` timed just before (what the page
  cache held is not dropped: the figures say how much the machine could have cached).
- ``curve``: specvis's own cached target forward over k = 1, 5, 9, 17, 33 tokens per row, batch 1
  with CFG (2 rows), mid-image (``specvis.bench.forward_cost``, fewer repeats at 7B), and the memory
  plan (``pipe.memory``) at batch 1 and 8.
- ``linear``: the linear products alone at the same shape, measured the same way (one thread,
  median of timed passes after untimed ones): ``F.linear`` on random bf16 weights (out, in) of every
  layer (qkv, o, gate, up, down) and of the image head, 2k rows; four distinct layers are cycled
  (each is larger than the caches, so every product streams its weights from memory). The same
  products packed for oneDNN (``PackedLinear``'s kernel) and, at 2 rows, the transposed layout.
- ``rounds`` (``--rounds`` sizes): a 16x16-token image with AR and SJD (window 16 and 32, gumbel
  coupling; the family's default sampling), every round timed (``progress`` callback); acceptance on
  random weights means nothing, so rounds and forwards are reported, and the image time is
  projected at the mean accepted length SJD reaches on the trained ``emoji-t2i`` bundle (16x16):
  a projection, labelled as one. A 4x4 image with greedy AR and SJD checks that the tokens agree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GIB = 2 ** 30
KS = (1, 5, 9, 17, 33)
PROMPT = "a photo of a red fox in the snow"


def status_bytes(field: str) -> int:
    """A ``kB`` field of /proc/self/status (VmRSS, VmHWM, RssFile ...) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return -1


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return -1


def emit(obj: dict) -> None:
    print("RESULT " + json.dumps(obj), flush=True)


# ---------------------------------------------------------------- fresh-process measurements
def cmd_load(a) -> None:
    import torch  # noqa: F401

    import specvis as sv
    from specvis.memory import tensor_bytes
    from specvis.models.loading import mapped_weight_bytes

    before = status_bytes("VmRSS")
    t0 = time.perf_counter()
    pipe = sv.load(str(a.dir), a.device, dtype=a.dtype, threads=1, **({"quantize": a.quantize} if a.quantize else {}))
    if pipe.device.type == "cuda":
        torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    emit({"load_s": load_s, "rss_before": before, "rss_after": status_bytes("VmRSS"), "peak_rss": status_bytes("VmHWM"),
          "weights_bytes": tensor_bytes(pipe.target), "mapped_bytes": mapped_weight_bytes(), "dtype": pipe.extras.get("dtype"),
          "dtype_source": pipe.extras.get("dtype_source"),
          "params": sum(p.numel() for p in pipe.target.parameters())  # + int8 weights (buffers)
          + sum(b.numel() for n, b in pipe.target.named_buffers() if n.endswith("weight_int8")), "device": str(pipe.device),
          "largest_file": max(f.stat().st_size for f in Path(a.dir).glob("*.safetensors")) if list(Path(a.dir).glob("*.safetensors")) else None})


def _pipe(a):
    import specvis as sv

    return sv.load(str(a.dir), a.device, dtype=a.dtype, threads=1, **({"quantize": a.quantize} if a.quantize else {}))


def cmd_curve(a) -> None:
    """specvis's own forward cost curve and the memory plan."""
    import specvis as sv
    from specvis.bench import forward_cost as fc

    pipe = _pipe(a)
    fc.WARM_CALLS, fc.TIMED_CALLS, fc.FILLS = a.warm, a.timed, (0.5,)
    rows = fc.forward_cost(pipe, list(KS), 1, repeats=a.timed, prompts=[PROMPT], grid=(16, 16))
    plans = {}
    for b in (1, 8):
        p = pipe.memory(b, sv.SJD(window=16), prompt_tokens=64)
        plans[b] = {"weights_bytes": p.weights_bytes, "kv_bytes": p.kv_bytes, "other_bytes": p.other_bytes,
                    "free_bytes": p.free_bytes, "fits": p.fits, "max_batch_size": p.max_batch_size, "slots": p.slots}
    L = pipe.target.layout
    emit({"curve": [{"tokens": r["tokens"], "ms": r["median_s"] * 1e3, "x1": r["relative_to_1"]} for r in rows],
          "plan_sjd16_prompt64": plans, "grid": [L.height, L.width], "stream_len": L.stream_len,
          "peak_rss": status_bytes("VmHWM"), "dtype": pipe.extras.get("dtype")})


def layer_shapes(config: dict) -> tuple[list[tuple[int, int]], tuple[int, int], int]:
    """(per-layer (out, in) weight shapes, image head (out, in), layers) of a decoder config."""
    d, h, kv, f = config["dim"], config["n_head"], config["n_kv_head"], config["ffn_hidden"]
    hd = d // h
    return [((h + 2 * kv) * hd, d), (d, h * hd), (f, d), (f, d), (d, f)], (config["vocab"], d), config["n_layer"]


def cmd_linear(a) -> None:
    """The linear products alone at a decoder's shape (module docstring)."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    cfg = json.loads(a.shape)
    shapes, head, n_layer = layer_shapes(cfg)
    dtype = torch.bfloat16
    distinct = min(4, n_layer)
    g = torch.Generator().manual_seed(0)
    layers = [[(torch.randn(s, generator=g) / s[1] ** 0.5).to(dtype) for s in shapes] for _ in range(distinct)]
    head_w = (torch.randn(head, generator=g) / head[1] ** 0.5).to(dtype)
    packed = None
    if a.packed:
        packed = [[torch.ops.mkldnn._reorder_linear_weight(w, None) for w in ws] for ws in layers]
        packed_head = torch.ops.mkldnn._reorder_linear_weight(head_w, None)

    def run(kind: str, x: dict[int, torch.Tensor]) -> float:
        """One pass of every layer's products and the head's on inputs ``x`` (by width)."""
        t0 = time.perf_counter()
        with torch.inference_mode():
            for i in range(n_layer):
                ws = (packed if kind == "packed" else layers)[i % distinct]
                for w, (_, k) in zip(ws, shapes):
                    if kind == "packed":
                        torch.ops.mkldnn._linear_pointwise(x[k], w, None, "none", [], "")
                    else:
                        F.linear(x[k], w)
            if kind == "packed":
                torch.ops.mkldnn._linear_pointwise(x[cfg["dim"]], packed_head, None, "none", [], "")
            else:
                F.linear(x[cfg["dim"]], head_w)
        return time.perf_counter() - t0

    out = {}
    for kind in ["contiguous"] + (["packed"] if a.packed else []):
        curve = []
        for k in KS:
            x = {width: torch.randn(2 * k, width, generator=g).to(dtype) for width in {s[1] for s in shapes}}
            for _ in range(a.warm):
                run(kind, x)
            ts = [run(kind, x) for _ in range(a.timed)]
            curve.append({"tokens": k, "ms": statistics.median(ts) * 1e3})
        for r in curve:
            r["x1"] = r["ms"] / curve[0]["ms"]
        out[kind] = curve
    # one layer's largest product at 2 rows in the three layouts (why bf16 weights stay (out, in))
    w = layers[0][2]
    wt = w.t().contiguous().t()
    pk = torch.ops.mkldnn._reorder_linear_weight(w, None)
    x = torch.randn(2, w.shape[1]).to(dtype)
    layout = {}
    for name, fn in (("contiguous", lambda: F.linear(x, w)), ("transposed", lambda: F.linear(x, wt)),
                     ("packed", lambda: torch.ops.mkldnn._linear_pointwise(x, pk, None, "none", [], ""))):
        for _ in range(3):
            fn()
        ts = []
        for _ in range(7):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        layout[name] = statistics.median(ts) * 1e3
    emit({"linear": out, "one_product_2_rows_ms": {"shape": list(w.shape), **layout}})


def greedy_4x4(pipe) -> dict:
    """A 4x4 image (LlamaGen t2i: its native grid) with greedy AR and greedy SJD (window 16): the tokens, whether they are identical
    and, if not, where they first differ. In bf16 a near-tie can flip: a position's logits depend at
    rounding level on the block they are computed in (docs/results/archive/bf16-cpu.md)."""
    import torch

    import specvis as sv

    greedy = sv.Sampling(temperature=0, cfg_scale=pipe.default_sampling.cfg_scale)
    # LlamaGen t2i generates its native grid only (its 2D RoPE table): 16x16 there
    grid = {} if pipe.extras.get("family") == "llamagen-t2i" else {"height": 4, "width": 4}
    small = [pipe(prompts=[PROMPT], method=m, sampling=greedy, decode=False, **grid).tokens
             for m in (sv.AR(), sv.SJD(window=16))]
    same = bool(torch.equal(small[0], small[1]))
    first = None if same else int((small[0] != small[1]).nonzero()[0, 1])
    return {"ar": small[0].tolist(), "sjd": small[1].tolist(), "identical": same, "first_difference": first,
            "dtype": pipe.extras.get("dtype")}


def cmd_greedy(a) -> None:
    emit({"greedy_4x4": greedy_4x4(_pipe(a))})


def cmd_rounds(a) -> None:
    """Per-round wall-clock of AR and SJD over a 16x16 image (module docstring), and the greedy 4x4 check."""
    pipe = _pipe(a)
    out = {}
    greedy_check = greedy_4x4(pipe)
    for spec in a.methods.split(","):
        from specvis.registry import method_from_spec

        method = method_from_spec(spec)
        marks = [time.perf_counter()]

        class Stop(Exception):
            pass

        def progress(frac):
            marks.append(time.perf_counter())
            if a.max_rounds and len(marks) > a.max_rounds:
                raise Stop

        try:
            g = pipe(prompts=[PROMPT], method=method, height=16, width=16, decode=False, progress=progress, seed=0)
            stats = {"target_forwards": g.stats.target_forwards, "wall_s": g.stats.wall_s,
                     "mean_accepted_length": g.stats.mean_accepted_length, "complete": True}
        except Stop:
            stats = {"complete": False}
        rounds = [b - c for c, b in zip(marks, marks[1:])]
        stats.update(rounds=len(rounds), round_s_median=statistics.median(rounds[1:] or rounds),
                     first_round_s=rounds[0] if rounds else None, round_s=rounds)
        out[spec] = stats
        print(f"{spec}: {stats['rounds']} rounds, median {stats['round_s_median']:.2f} s", file=sys.stderr, flush=True)
    emit({"rounds": out, "greedy_4x4": greedy_check, "stream_len": pipe.target.layout.stream_len})


def cmd_acceptance(a) -> None:
    """Mean accepted length of SJD (window 16, 32, gumbel) on the trained emoji-t2i bundle at 16x16."""
    import specvis as sv
    from specvis.registry import method_from_spec

    pipe = sv.load("emoji-t2i", threads=1)
    prompts = list(pipe.extras["prompt_classes"])[: a.num]
    out = {}
    for spec in a.methods.split(","):
        if spec == "ar":
            continue
        g = pipe(prompts=prompts, method=method_from_spec(spec), seed=0, decode=False)
        out[spec] = {"mean_accepted_length": g.stats.mean_accepted_length, "target_forwards": g.stats.target_forwards,
                     "images": len(prompts)}
    emit({"emoji_t2i": out, "grid": list(pipe.grid)})


def cmd_int8_law(a) -> None:
    """Total-variation distance between the sampling laws of the emoji bundle in bf16 and the same
    bundle with int8 block weights, position by position, teacher-forced on grids the bf16 model
    sampled (default sampling: CFG, temperature; AR, seed 0): mean, 90th percentile and max; and,
    for scale, the same distance between bf16 and fp32."""
    import torch

    import specvis as sv

    pipes = {"bf16": sv.load("emoji", dtype="bf16", threads=1),
             "int8": sv.load("emoji", dtype="bf16", threads=1, quantize="int8"),
             "fp32": sv.load("emoji", dtype="fp32", threads=1)}
    ref = pipes["bf16"]
    classes = [i % ref.num_classes for i in range(a.num)]
    tokens = ref(classes, sv.AR(), seed=0, decode=False).tokens
    s = ref.default_sampling
    cond = torch.tensor(classes)
    laws = {}
    with torch.no_grad():
        for name, pipe in pipes.items():
            m = pipe.target
            lc = m.logits(cond, tokens[:, :-1]).float()
            lu = m.logits(torch.full_like(cond, m.null_condition), tokens[:, :-1]).float()
            laws[name] = s.probs(lc, lu) if s.uses_cfg else s.probs(lc, None)

    def tv(x, y):
        d = 0.5 * (laws[x] - laws[y]).abs().sum(-1).flatten()
        return {"mean": float(d.mean()), "p90": float(d.quantile(0.9)), "max": float(d.max())}

    emit({"int8_law_tv": {"images": a.num, "positions": int(tokens.numel()), "bf16_vs_int8": tv("bf16", "int8"),
                          "bf16_vs_fp32": tv("bf16", "fp32"),
                          "sampling": {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
                                       "cfg_scale": s.cfg_scale}}})


# ---------------------------------------------------------------- orchestration
def child(args: list[str], timeout: float) -> dict:
    """Run this script's subcommand in a fresh process; its RESULT line as a dict."""
    r = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{args[0]} failed ({r.returncode}): {r.stderr.strip().splitlines()[-3:]}")


def read_files_seconds(directory: Path) -> tuple[float, int]:
    files = sorted(directory.glob("*.safetensors")) + sorted(directory.glob("t2i_*.pt"))
    t0 = time.perf_counter()
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0, sum(f.stat().st_size for f in files)


def decoder_shape(directory: Path) -> dict:
    """The decoder's shape, from its config or its file's tensor shapes (no weights read)."""
    import specvis.families as fam
    from specvis.models.loading import skeleton

    family, config = fam.detect(directory)
    if config is None:  # LlamaGen t2i: the official file's shapes (memory-mapped, nothing read)
        from specvis.models.checkpoint import read_state_dict
        from specvis.models.llamagen import trunk_shapes

        vocab, dim, n_layer, hidden, qkv = trunk_shapes(read_state_dict(fam.llamagen_t2i.gpt_file(directory)))
        heads = 32 if dim == 3200 else dim // 64
        return {"dim": dim, "n_head": heads, "n_kv_head": (qkv // (dim // heads) - heads) // 2, "ffn_hidden": hidden,
                "n_layer": n_layer, "vocab": vocab}
    model = skeleton(lambda: family.build(directory, config, 16, 16)[0])
    c = model.config
    return {"dim": c.dim, "n_head": c.n_head, "n_kv_head": c.n_kv_head, "ffn_hidden": c.ffn_hidden, "n_layer": c.n_layer,
            "vocab": model.layout.vocab_size}


def cmd_run(a) -> None:
    """Everything, per family and size; checkpoints written to --scratch and deleted after."""
    report = json.loads(Path(a.json).read_text()) if a.json and Path(a.json).exists() else {"runs": {}}
    report.update(machine=machine())
    seven = {s.strip() for s in a.rounds.split(",") if s.strip()}
    if "emoji_t2i" not in report or a.refresh_acceptance:
        report["emoji_t2i"] = child(["acceptance", "--methods", a.methods, "--num", str(a.accept_images)], 3600)
    for family in a.families.split(","):
        for size in a.sizes.split(","):
            key = f"{family}-{size}" + (f"-{a.quantize}" if a.quantize else "") + ("" if a.device == "cpu" else f"-{a.device}")
            if key in report["runs"] and not a.redo:
                continue
            d = Path(a.scratch) / f"{family}-{size}"
            if not d.exists():
                t0 = time.perf_counter()
                subprocess.run([sys.executable, str(ROOT / "scripts" / "synthetic_checkpoint.py"), family, size, str(d)],
                               check=True)
                write_s = time.perf_counter() - t0
            else:
                write_s = None
            run = {"family": family, "size": size, "write_s": write_s, "available_before": available_bytes()}
            common = ([str(d), "--device", a.device] + (["--dtype", a.dtype] if a.dtype else [])
                      + (["--quantize", a.quantize] if a.quantize else []))
            run["read_s"], run["file_bytes"] = read_files_seconds(d)
            run["load"] = child(["load", *common], 7200)
            run["read_again_s"], _ = read_files_seconds(d)
            run["curve"] = child(["curve", *common, "--warm", str(a.warm), "--timed", str(a.timed)], 7200)
            if not a.quantize and a.device == "cpu":
                run["linear"] = child(["linear", "--shape", json.dumps(decoder_shape(d)), "--packed",
                                       "--warm", str(a.warm), "--timed", str(a.timed)], 7200)
            if not a.quantize and 4 * run["load"]["params"] < available_bytes() / 2:  # fp32 fits: no bf16 ties
                run["greedy_fp32"] = child(["greedy", str(d), "--device", a.device, "--dtype", "fp32"], 7200)["greedy_4x4"]
            if size in seven:
                run["rounds"] = child(["rounds", *common, "--methods", a.methods, "--max-rounds", str(a.max_rounds)],
                                      4 * 7200)
            report["runs"][key] = run
            if a.json:
                tmp = Path(a.json + ".tmp")
                tmp.write_text(json.dumps(report, indent=1) + "\n")
                os.replace(tmp, a.json)
            if not a.keep:
                shutil.rmtree(d)
            print(f"{key}: load {run['load']['load_s']:.1f}s peak {run['load']['peak_rss'] / GIB:.2f} GiB "
                  f"weights {run['load']['weights_bytes'] / GIB:.2f} GiB", flush=True)
    if a.md:
        Path(a.md).write_text(markdown(report))


def machine() -> dict:
    import platform

    import torch

    from specvis.cpu_features import cpu_description

    return {"cpu": cpu_description(), "torch": torch.__version__, "python": platform.python_version(),
            "mem_total_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1),
            "cores": os.cpu_count()}


def markdown(report: dict) -> str:
    """The tables of docs/results/scale-cpu.md from the JSON (the prose there is written by hand)."""
    lines = [f"Machine: {report['machine']['cpu']}, {report['machine']['cores']} cores, "
             f"{report['machine']['mem_total_gib']} GiB, torch {report['machine']['torch']}, one thread.", "",
             "| checkpoint | params | dtype | file GB | read s (again) | load s | peak RSS GiB | weights GiB | peak / (1.10 w + 1 GiB) |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for key, r in report["runs"].items():
        ld = r["load"]
        goal = 1.10 * ld["weights_bytes"] + GIB
        lines.append(f"| {key} | {ld['params'] / 1e9:.2f}B | {ld['dtype']} | {r['file_bytes'] / 1e9:.2f} | "
                     f"{r['read_s']:.1f} ({r['read_again_s']:.1f}) | {ld['load_s']:.1f} | {ld['peak_rss'] / GIB:.2f} | "
                     f"{ld['weights_bytes'] / GIB:.2f} | {ld['peak_rss'] / goal:.2f} |")
    lines += ["", "Forward cost c(k), batch 1 with CFG (2 rows), ms, and x one token: specvis's cached target forward "
              "against the linear products alone (F.linear, and packed):", "",
              "| checkpoint | " + " | ".join(f"c({k})" for k in KS) + " | c(17)/c(1) | c(33)/c(1) | linear c(17)/c(1) | "
              "linear c(33)/c(1) | packed c(17)/c(1) | packed c(33)/c(1) |",
              "| --- |" + " ---: |" * (len(KS) + 6)]
    for key, r in report["runs"].items():
        c = {x["tokens"]: x for x in r["curve"]["curve"]}
        lin = {x["tokens"]: x for x in r.get("linear", {}).get("linear", {}).get("contiguous", [])}
        pk = {x["tokens"]: x for x in r.get("linear", {}).get("linear", {}).get("packed", [])}
        f = lambda t, k: f"{t[k]['x1']:.2f}" if k in t else "-"  # noqa: E731
        lines.append(f"| {key} | " + " | ".join(f"{c[k]['ms']:.0f}" for k in KS) +
                     f" | {f(c, 17)} | {f(c, 33)} | {f(lin, 17)} | {f(lin, 33)} | {f(pk, 17)} | {f(pk, 33)} |")
    lines += ["", "Memory plan (SJD window 16, 64 prompt tokens, 16x16 image; KV stored as the device stores it):", "",
              "| checkpoint | weights GiB | KV b=1 GiB | KV b=8 GiB | largest batch then |", "| --- | ---: | ---: | ---: | ---: |"]
    for key, r in report["runs"].items():
        p = r["curve"]["plan_sjd16_prompt64"]
        lines.append(f"| {key} | {p['1']['weights_bytes'] / GIB:.2f} | {p['1']['kv_bytes'] / GIB:.3f} | "
                     f"{p['8']['kv_bytes'] / GIB:.3f} | {p['1']['max_batch_size']} |")
    acc = report.get("emoji_t2i", {}).get("emoji_t2i", {})
    for key, r in report["runs"].items():
        if "rounds" not in r:
            continue
        rd = r["rounds"]["rounds"]
        L = r["rounds"]["stream_len"]
        lines += ["", f"{key}: 16x16 image ({L} stream tokens), wall-clock per round (s, median):", "",
                  "| method | rounds timed | complete | s/round | forwards | emoji-t2i mean accepted length | "
                  "projected image s | projected speedup |", "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
        ar = rd.get("ar", {}).get("round_s_median")
        for spec, s in rd.items():
            m = acc.get(spec, {}).get("mean_accepted_length", 1.0 if spec == "ar" else None)
            proj = None if m is None else L / m * s["round_s_median"]
            speed = None if proj is None or ar is None else L * ar / proj
            lines.append(f"| {spec} | {s['rounds']} | {s['complete']} | {s['round_s_median']:.2f} | "
                         f"{s.get('target_forwards', '-')} | {m if m is None else round(m, 2)} | "
                         f"{'-' if proj is None else f'{proj:.0f}'} | {'-' if speed is None else f'{speed:.2f}x'} |")
        gr = r["rounds"]["greedy_4x4"]
        lines.append(f"\nGreedy 4x4 AR and SJD tokens identical in {gr.get('dtype')}: {gr['identical']}"
                     + ("" if gr["identical"] else f" (first difference at token {gr['first_difference']})"))
    for key, r in report["runs"].items():
        if "greedy_fp32" in r:
            lines.append(f"{key}: greedy 4x4 AR and SJD tokens identical in fp32: {r['greedy_fp32']['identical']}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("load", "curve", "rounds", "greedy"):
        s = sub.add_parser(name)
        s.add_argument("dir", type=Path)
        s.add_argument("--device", default="cpu")
        s.add_argument("--dtype")
        s.add_argument("--quantize")
        s.add_argument("--warm", type=int, default=2)
        s.add_argument("--timed", type=int, default=3)
        s.add_argument("--methods", default="ar,sjd:window=16:coupling=gumbel,sjd:window=32:coupling=gumbel")
        s.add_argument("--max-rounds", type=int, default=0)
    s = sub.add_parser("linear")
    s.add_argument("--shape", required=True)
    s.add_argument("--packed", action="store_true")
    s.add_argument("--warm", type=int, default=2)
    s.add_argument("--timed", type=int, default=3)
    s = sub.add_parser("int8-law")
    s.add_argument("--num", type=int, default=32)
    s = sub.add_parser("acceptance")
    s.add_argument("--methods", default="ar,sjd:window=16:coupling=gumbel,sjd:window=32:coupling=gumbel")
    s.add_argument("--num", type=int, default=16)
    s = sub.add_parser("md", help="render the markdown tables of a report JSON")
    s.add_argument("json")
    s.add_argument("md")
    s = sub.add_parser("run")
    s.add_argument("--families", default="lumina,janus")
    s.add_argument("--sizes", default="0.3b,1.5b,7b")
    s.add_argument("--rounds", default="7b", help="sizes whose AR/SJD rounds are timed over a 16x16 image")
    s.add_argument("--methods", default="ar,sjd:window=16:coupling=gumbel,sjd:window=32:coupling=gumbel")
    s.add_argument("--max-rounds", type=int, default=0, help="stop each method after this many timed rounds (0: whole image)")
    s.add_argument("--scratch", default="/tmp/specvis-scale")
    s.add_argument("--device", default="cpu", help="cuda: host peak RSS of a GPU load (goal: largest shard + 1 GiB)")
    s.add_argument("--dtype")
    s.add_argument("--quantize")
    s.add_argument("--warm", type=int, default=2)
    s.add_argument("--timed", type=int, default=3)
    s.add_argument("--accept-images", type=int, default=16)
    s.add_argument("--refresh-acceptance", action="store_true")
    s.add_argument("--json")
    s.add_argument("--md")
    s.add_argument("--keep", action="store_true", help="keep the synthetic checkpoints")
    s.add_argument("--redo", action="store_true")
    a = p.parse_args(argv)
    {"load": cmd_load, "curve": cmd_curve, "linear": cmd_linear, "rounds": cmd_rounds, "acceptance": cmd_acceptance,
     "int8-law": cmd_int8_law, "greedy": cmd_greedy, "run": cmd_run,
     "md": lambda a: Path(a.md).write_text(markdown(json.loads(Path(a.json).read_text())))}[a.cmd](a)


if __name__ == "__main__":
    main()
