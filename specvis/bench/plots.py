"""Bench figures (matplotlib, Agg, imported lazily): speedup and step compression per method as bar
charts, and acceptance heatmaps averaged per class (rows: methods, columns: classes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..outputs import write_figure
from .report import run_labels


def _save(fig, path: Path) -> None:
    write_figure(fig, path, dpi=120, bbox_inches="tight")


def _bars(plt, labels: list[str], values: list[float], ylabel: str, title: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(max(4.0, 0.8 * len(labels) + 1.5), 3.4))
    bars = ax.bar(range(len(values)), values, color="#3b528b")
    ax.axhline(1.0, color="0.4", lw=0.8, ls="--")
    ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=8)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    _save(fig, path)
    plt.close(fig)


def write_plots(report: dict[str, Any], out_dir: str | Path, class_names: list[str] | None = None) -> list[Path]:
    """Write ``speedup.png``, ``step_compression.png`` and ``acceptance.png``; returns the paths."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError("--plots needs matplotlib (pip install 'specvis[plots]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = report["runs"]
    labels = run_labels(runs)
    title = f"{report['model']} on {report['device']}, batch {report['batch_size']}, {report['num_images']} images"
    paths = [out / "speedup.png", out / "step_compression.png"]
    _bars(plt, labels, [r["speedup"] for r in runs], "speedup vs AR (images/s)", title, paths[0])
    _bars(plt, labels, [r["step_compression"] for r in runs], "tokens per target forward", title, paths[1])

    shown = [(lab, r) for lab, r in zip(labels, runs) if r.get("accept_map_per_class") and r["method"] != "ar"]
    if shown:
        classes = sorted({c for _, r in shown for c in r["accept_map_per_class"]}, key=int)
        vmax = max(float(np.max(m)) for _, r in shown for m in r["accept_map_per_class"].values())
        fig, axes = plt.subplots(len(shown), len(classes), squeeze=False,
                                 figsize=(1.3 * len(classes) + 1.2, 1.3 * len(shown) + 0.6))
        im = None
        for i, (lab, r) in enumerate(shown):
            for j, c in enumerate(classes):
                ax = axes[i][j]
                ax.set_xticks([])
                ax.set_yticks([])
                if c in r["accept_map_per_class"]:
                    im = ax.imshow(np.asarray(r["accept_map_per_class"][c]), cmap="viridis", vmin=1, vmax=max(vmax, 1.0))
                if i == 0:
                    name = class_names[int(c)] if class_names and int(c) < len(class_names) else f"class {c}"
                    ax.set_title(name, fontsize=6)
                if j == 0:
                    ax.set_ylabel(lab, fontsize=7)
        if im is not None:
            fig.colorbar(im, ax=axes, shrink=0.8, label="tokens committed by the forward")
        fig.suptitle("mean acceptance maps per class", fontsize=9)
        paths.append(out / "acceptance.png")
        _save(fig, paths[-1])
        plt.close(fig)
    return paths
