"""Paper-style sweeps on a bundle, each a set of ``run_bench`` calls (resumable JSON) plus one figure.

    python -m specvis.bench.sweeps sjd-ablations --model emoji --out docs/results/archive
    python -m specvis.bench.sweeps lantern-grid --model emoji --out docs/results/archive
    python -m specvis.bench.sweeps lantern-greedy --model emoji --out docs/results/archive

``sjd-ablations``: SJD step compression vs window 1/4/8/16/32 (SJD Fig. 8), vs sampling top-k
1/10/100/all (Fig. 6) and refinement on/off (App. F). ``lantern-grid``: Speculative+LANTERN and
SJD+LANTERN over k x delta: accepted length and speedup against the quality proxy (LANTERN Fig. 5).
``lantern-greedy``: the same grid at temperature 0 (the paper's greedy rule, LANTERN Table 3 / Fig. 5 tau = 0).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from ..outputs import write_figure, write_text
from ..zoo import load
from ..job import Job
from .runner import Bench, run_bench

WINDOWS = (1, 4, 8, 16, 32)
TOP_KS = (1, 10, 100, None)


def sjd_ablations(pipe, out: Path, num: int, batch_size: int, init: str = "horizontal-sample") -> dict:
    """Three sweeps; returns {"window": report, "top_k": {k: report}, "refine": report}."""
    base = pipe.default_sampling
    window = run_bench(pipe, Job(num=num, batch_size=batch_size, sampling=base, out=out / "sjd-window.json"),
                       Bench(specs=tuple(f"sjd:window={w}:init={init}" for w in WINDOWS), metrics=()), progress=False)
    top_k = {}
    for k in TOP_KS:
        name = "all" if k is None else str(k)
        top_k[name] = run_bench(pipe, Job(num=num, batch_size=batch_size, sampling=replace(base, top_k=k),
                                          out=out / f"sjd-topk-{name}.json"),
                                Bench(specs=(f"sjd:window=16:init={init}",), metrics=()), progress=False)
    refine = run_bench(pipe, Job(num=num, batch_size=batch_size, sampling=base, out=out / "sjd-refine.json"),
                       Bench(specs=(f"sjd:window=16:init={init}", f"sjd:window=16:init={init}:refine=false"), metrics=()),
                       progress=False)
    return {"window": window, "top_k": top_k, "refine": refine}


def _sjd_runs(report: dict) -> list[dict]:
    return [r for r in report["runs"] if r["method"] == "sjd"]


def plot_sjd_ablations(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    runs = _sjd_runs(res["window"])
    axes[0].plot([r["config"]["window"] for r in runs], [r["step_compression"] for r in runs], "o-")
    axes[0].set(xlabel="Jacobi window", ylabel="step compression", title="window (SJD Fig. 8)", xscale="log", xticks=WINDOWS)
    axes[0].set_xticklabels([str(w) for w in WINDOWS])
    names = list(res["top_k"])
    axes[1].bar(names, [_sjd_runs(res["top_k"][n])[0]["step_compression"] for n in names], color="#3b528b")
    axes[1].set(xlabel="sampling top-k", title="top-k (SJD Fig. 6)")
    ref = _sjd_runs(res["refine"])
    axes[2].bar(["refine", "re-initialise"], [r["step_compression"] for r in ref], color="#21918c")
    axes[2].set(title="refinement (SJD App. F)")
    for ax in axes[1:]:
        ax.axhline(1.0, color="0.4", lw=0.8, ls="--")
    fig.tight_layout()
    write_figure(fig, path, dpi=120)
    plt.close(fig)


def lantern_grid(pipe, out: Path, num: int, batch_size: int, ks=(10, 50, 200), deltas=(0.05, 0.1, 0.2, 0.4),
                 methods=("speculative:gamma=4", "sjd:window=8:init=horizontal-sample"), greedy: bool = False) -> dict:
    """One report: AR, each method exact, and each method with LANTERN at every (k, delta); under the
    bundle's sampling, or at temperature 0 when ``greedy`` (``lantern-greedy.json``)."""
    specs = list(methods)
    specs += [f"{m}:accept=lantern:k={k}:delta={d}" for m in methods for k in ks for d in deltas]
    sampling = replace(pipe.default_sampling, temperature=0.0) if greedy else pipe.default_sampling
    name = "lantern-greedy" if greedy else "lantern-grid"
    return run_bench(pipe, Job(num=num, batch_size=batch_size, sampling=sampling, out=out / f"{name}.json"),
                     Bench(specs=tuple(specs)), progress=False)


def plot_lantern_grid(report: dict, path: Path, title: str = "LANTERN trade-off (cf. LANTERN Fig. 5)") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    ar = report["runs"][0]
    for method, marker in (("speculative", "o"), ("sjd", "s")):
        runs = [r for r in report["runs"] if r["method"] == method]
        q = [r["quality"].get("fid_proxy", float("nan")) for r in runs]
        axes[0].scatter([r["mean_accepted_length"] for r in runs], q, marker=marker, label=method)
        axes[1].scatter([r["speedup"] for r in runs], q, marker=marker, label=method)
        for r, y in zip(runs, q):
            cfg = r["config"].get("acceptance_config")
            tag = "exact" if cfg is None else f"k{cfg['k']} d{cfg['delta']}"
            axes[0].annotate(tag, (r["mean_accepted_length"], y), fontsize=6)
    for ax, xl in zip(axes, ("mean accepted length", "speedup vs AR")):
        ax.axhline(ar["quality"].get("fid_proxy", float("nan")), color="0.4", lw=0.8, ls="--", label="AR")
        ax.set(xlabel=xl, ylabel="fid_proxy (lower is better)")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    write_figure(fig, path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweep", choices=["sjd-ablations", "lantern-grid", "lantern-greedy"])
    p.add_argument("--model", default="emoji")
    p.add_argument("--out", default="docs/results/archive")
    p.add_argument("--num", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=8)
    a = p.parse_args(argv)
    pipe, out = load(a.model), Path(a.out)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    if a.sweep == "sjd-ablations":
        res = sjd_ablations(pipe, out, a.num, a.batch_size)
        plot_sjd_ablations(res, out / "plots" / "sjd_ablations.png")
        rows = [(f"window {r['config']['window']}", r) for r in _sjd_runs(res["window"])]
        rows += [(f"top-k {n}", _sjd_runs(rep)[0]) for n, rep in res["top_k"].items()]
        rows += [(f"refine {r['config']['refine']}", r) for r in _sjd_runs(res["refine"])]
    else:
        greedy = a.sweep == "lantern-greedy"
        rep = lantern_grid(pipe, out, a.num, a.batch_size, greedy=greedy)
        if greedy:
            plot_lantern_grid(rep, out / "plots" / "lantern_tradeoff_greedy.png",
                              "LANTERN trade-off, greedy (cf. LANTERN Fig. 5, tau = 0)")
        else:
            plot_lantern_grid(rep, out / "plots" / "lantern_tradeoff.png")
        rows = [(json.dumps(r["config"].get("acceptance_config", "exact")), r) for r in rep["runs"]]
    lines = [f"| {a.sweep} | method | step compression | mean accepted length | speedup | fid_proxy |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for label, r in rows:
        fid = r.get("quality", {}).get("fid_proxy")
        lines.append(f"| {label} | {r['method']} | {r['step_compression']:.2f} | {r['mean_accepted_length']:.2f} | "
                     f"{r['speedup']:.2f}x | {'-' if fid is None else f'{fid:.2f}'} |")
    write_text(out / f"{a.sweep}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
