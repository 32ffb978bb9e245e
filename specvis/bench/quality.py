"""Image quality for the benchmark, offline: a small emoji classifier as feature extractor.

``fid_proxy`` is the Frechet distance between the classifier's penultimate-layer features of the
generated images and of the held-out real images (shipped with the classifier as ``ref_features``);
``class_accuracy`` is the fraction of generated images classified as the class they were asked for.

Metrics are pluggable: a metric maps uint8 images (N, H, W, 3) and their labels to per-image
*observations* (feature vectors or scalars); :func:`summarize` turns observations into figures.
An observation with a reference set is summarised as a Frechet distance, any other one as a mean.
Keeping observations (not only figures) lets sharded runs be merged exactly. ``--metrics fid,clip``
uses torchmetrics' Inception and CLIP models when they and their weights are already on disk.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch
from torch import nn

from ..models.checkpoint import load_strict, read_pretrained, save_pretrained

# ---------------------------------------------------------------------------------------- classifier


@dataclass
class ClassifierConfig:
    num_classes: int = 11
    image_size: int = 64
    channels: tuple[int, ...] = (32, 64, 96, 128)
    feature_dim: int = 64
    dropout: float = 0.2
    n_reference: int = 0  # rows of the ref_features buffer (held-out real images)

    def __post_init__(self) -> None:
        self.channels = tuple(int(c) for c in self.channels)
        for name in ("num_classes", "image_size", "feature_dim"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"ClassifierConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if not self.channels or min(self.channels) < 1:
            raise ValueError(f"ClassifierConfig.channels must be positive, got {self.channels!r}")


class EmojiClassifier(nn.Module):
    """Conv stages (stride-2 conv + conv, BatchNorm, ReLU), global average pool, a ``feature_dim``
    ReLU embedding (the features of ``fid_proxy``) and a linear head. Input: (N, 3, H, W) in [-1, 1]."""

    def __init__(self, config: ClassifierConfig) -> None:
        super().__init__()
        self.config = config
        layers: list[nn.Module] = []
        c_in = 3
        for c in config.channels:
            layers += [nn.Conv2d(c_in, c, 3, 2, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
                       nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True)]
            c_in = c
        self.body = nn.Sequential(*layers)
        self.embed = nn.Linear(c_in, config.feature_dim)
        self.drop = nn.Dropout(config.dropout)
        self.head = nn.Linear(config.feature_dim, config.num_classes)
        self.register_buffer("ref_features", torch.zeros(config.n_reference, config.feature_dim))
        self.register_buffer("ref_labels", torch.zeros(config.n_reference, dtype=torch.long))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate-layer features (N, feature_dim)."""
        return torch.relu(self.embed(self.body(x).mean((2, 3))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.features(x)))

    def set_reference(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        """Store the held-out real images' features (shipped with the weights)."""
        self.config.n_reference = int(features.shape[0])
        self.ref_features = features.detach().float().cpu().clone()
        self.ref_labels = labels.detach().long().cpu().clone()

    def save_pretrained(self, directory: str | Path, dtype: torch.dtype | None = None) -> None:
        save_pretrained(self, asdict(self.config), directory, dtype)

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> "EmojiClassifier":
        config, tensors = read_pretrained(directory)
        names = {f.name for f in fields(ClassifierConfig)}
        model = cls(ClassifierConfig(**{k: v for k, v in config.items() if k in names}))
        load_strict(model, tensors, str(directory))
        return model.float().eval()


def to_input(images: np.ndarray, size: int | None = None) -> torch.Tensor:
    """uint8 (N, H, W, 3) -> float (N, 3, size, size) in [-1, 1] (bilinear resize when needed)."""
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
    if size is not None and x.shape[-1] != size:
        x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x


@torch.no_grad()
def classifier_outputs(model: EmojiClassifier, images: np.ndarray, batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(features (N, D), logits (N, C)) of uint8 images, in eval mode."""
    was = model.training
    model.eval()
    feats, logits = [], []
    for i in range(0, len(images), batch_size):
        f = model.features(to_input(images[i:i + batch_size], model.config.image_size))
        feats.append(f.numpy())
        logits.append(model.head(f).numpy())
    model.train(was)
    d, c = model.config.feature_dim, model.config.num_classes
    return (np.concatenate(feats) if feats else np.zeros((0, d), np.float32),
            np.concatenate(logits) if logits else np.zeros((0, c), np.float32))


# ---------------------------------------------------------------------------------------- Frechet


def _psd_sqrt(m: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh((m + m.T) / 2)
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Frechet distance between Gaussians fitted to feature sets a (N, D) and b (M, D).

    tr sqrt(Ca Cb) is computed as tr sqrt(Ca^1/2 Cb Ca^1/2) (a similar, symmetric PSD matrix) with
    eigh, so no scipy is needed and no complex parts appear.
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or len(a) < 2 or len(b) < 2:
        raise ValueError(f"frechet_distance needs two (N>=2, D) feature sets of the same D, got {a.shape} and {b.shape}")
    ca, cb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    s = _psd_sqrt(ca)
    cross = np.sqrt(np.clip(np.linalg.eigvalsh(s @ cb @ s), 0, None)).sum()
    d = float(((a.mean(0) - b.mean(0)) ** 2).sum() + np.trace(ca) + np.trace(cb) - 2 * cross)
    return max(d, 0.0)


def fid_proxy(generated: np.ndarray, reference: np.ndarray) -> float:
    """``frechet_distance`` of classifier features (named for the report)."""
    return frechet_distance(generated, reference)


# ---------------------------------------------------------------------------------------- metrics


class FeatureExtractor(Protocol):
    """Anything that maps uint8 images (N, H, W, 3) to feature vectors (N, D)."""

    name: str

    def features(self, images: np.ndarray) -> np.ndarray: ...


class Metric(Protocol):
    """Per-image observations of generated images; ``references[key]`` (real-image features) makes
    ``key`` a Frechet distance, otherwise its observations are averaged."""

    references: dict[str, np.ndarray]

    def observe(self, images: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]: ...


class MetricUnavailable(Exception):
    """Raised by a metric factory that cannot run here (package, weights or data missing)."""


class FrechetMetric:
    """A Frechet distance to reference images in the feature space of any ``FeatureExtractor``."""

    def __init__(self, key: str, extractor: FeatureExtractor, reference_images: np.ndarray) -> None:
        self.key, self.extractor = key, extractor
        self.references = {key: np.asarray(extractor.features(reference_images), np.float32)}

    def observe(self, images: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
        return {self.key: np.asarray(self.extractor.features(images), np.float32)}


class ProxyMetric:
    """``fid_proxy`` + ``class_accuracy`` from the shipped emoji classifier."""

    def __init__(self, model: EmojiClassifier, reference: np.ndarray | None = None) -> None:
        self.model = model
        ref = model.ref_features.float().numpy() if reference is None else reference
        if len(ref) < 2:
            raise MetricUnavailable("the classifier has no reference features of real images")
        self.references = {"fid_proxy": np.asarray(ref, np.float32)}

    def observe(self, images: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
        feats, logits = classifier_outputs(self.model, images)
        labels = np.asarray(labels)
        hit = (logits.argmax(1) == labels).astype(np.float32)
        return {"fid_proxy": feats.astype(np.float32),  # a label < 0 (a prompt outside the classes) has no accuracy
                "class_accuracy": np.where(labels >= 0, hit, np.nan).astype(np.float32)}


@dataclass
class QualitySource:
    """What metric factories may use: the pipeline and a dataset directory with ``eval.npz``."""

    pipe: Any
    data_dir: Path | None = None

    def reference_images(self) -> np.ndarray:
        from ..train.emoji_data import load_split

        if self.data_dir is None or not (Path(self.data_dir) / "eval.npz").exists():
            raise MetricUnavailable(f"no reference images ({self.data_dir or '--data'}/eval.npz missing)")
        return load_split(self.data_dir, "eval")[0]


def load_classifier(pipe: Any) -> EmojiClassifier | None:
    """The bundle's classifier (``extras['root'] / 'classifier'``), or None."""
    root = pipe.extras.get("root")
    path = Path(root) / "classifier" if root is not None else None
    if path is None or not (path / "config.json").exists():
        return None
    return EmojiClassifier.from_pretrained(path)


def _proxy(src: QualitySource) -> Metric:
    model = load_classifier(src.pipe)
    if model is None:
        raise MetricUnavailable(f"model {src.pipe.name!r} ships no classifier")
    return ProxyMetric(model)


class _TorchmetricsInception:
    name = "inception-v3"

    def __init__(self) -> None:
        try:
            from torchmetrics.image.fid import NoTrainInceptionV3
        except ImportError:
            raise MetricUnavailable("fid needs torchmetrics[image] (pip install 'torchmetrics[image]')") from None
        weights = Path(torch.hub.get_dir()) / "checkpoints" / "weights-inception-2015-12-05-6726825d.pth"
        if not weights.exists():
            raise MetricUnavailable(f"fid needs the Inception weights at {weights} (not downloaded by specvis)")
        self.net = NoTrainInceptionV3(name="inception-v3-compat", features_list=["2048"]).eval()

    @torch.no_grad()
    def features(self, images: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2)
        return torch.cat([self.net(x[i:i + 32]).reshape(len(x[i:i + 32]), -1) for i in range(0, len(x), 32)]).numpy()


def _fid(src: QualitySource) -> Metric:
    return FrechetMetric("fid", _TorchmetricsInception(), src.reference_images())


CLIP_MODEL = "openai/clip-vit-base-patch16"


class _ClipScore:
    references: dict[str, np.ndarray] = {}

    def __init__(self, class_names: list[str]) -> None:
        try:
            from huggingface_hub import try_to_load_from_cache
            from torchmetrics.multimodal.clip_score import CLIPScore
        except ImportError:
            raise MetricUnavailable("clip needs torchmetrics[multimodal] and transformers") from None
        if not isinstance(try_to_load_from_cache(CLIP_MODEL, "config.json"), str):
            raise MetricUnavailable(f"clip needs {CLIP_MODEL} in the Hugging Face cache (not downloaded by specvis)")
        self.metric = CLIPScore(model_name_or_path=CLIP_MODEL)
        self.prompts = [f"an emoji of {n.replace('_', ' ')}" for n in class_names]

    @torch.no_grad()
    def observe(self, images: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
        scores = []
        for img, y in zip(images, labels):
            self.metric.reset()
            scores.append(float(self.metric(torch.from_numpy(img).permute(2, 0, 1), self.prompts[int(y)])))
        return {"clip_score": np.asarray(scores, np.float32)}


def _clip(src: QualitySource) -> Metric:
    names = list(src.pipe.class_names)
    if not names:
        raise MetricUnavailable(f"model {src.pipe.name!r} has no class names for CLIP prompts")
    return _ClipScore(names)


# name -> factory; a factory returns a Metric or raises MetricUnavailable. Tests register fakes here.
METRICS: dict[str, Callable[[QualitySource], Metric]] = {"proxy": _proxy, "fid": _fid, "clip": _clip}


def can_decode(pipe: Any) -> bool:
    """Whether the pipeline renders images, as its model's family declares (``Pipeline.decodes``)."""
    return bool(pipe.decodes)


def build_metrics(names: list[str] | None, src: QualitySource, warn: Callable[[str], None] | None = None) -> list[Metric]:
    """Metrics for ``names`` (None: ``proxy`` when the bundle ships a classifier). Unknown or
    unavailable metrics are reported through ``warn`` and skipped: quality never fails a benchmark."""
    warn = warn or (lambda m: print(f"specvis: {m}", file=sys.stderr))
    if not can_decode(src.pipe):
        if names:
            warn(f"quality skipped: model {src.pipe.name!r} has no tokenizer that decodes images")
        return []
    explicit = names is not None
    out = []
    for name in (names if explicit else ["proxy"]):
        if name not in METRICS:
            warn(f"unknown metric {name!r} skipped; choose from {', '.join(METRICS)}")
            continue
        try:
            out.append(METRICS[name](src))
        except MetricUnavailable as e:
            if explicit:
                warn(f"metric {name} unavailable: {e}")
    return out


def seed_groups(batch_index: np.ndarray, n_batches: int, groups: int) -> np.ndarray:
    """Group of each image: its batch's position in the whole work list cut into ``groups`` runs of seeds."""
    g = max(1, min(groups, n_batches))
    return (np.asarray(batch_index) * g) // max(n_batches, 1)


def summarize(obs: dict[str, np.ndarray], references: dict[str, np.ndarray], groups: np.ndarray | None = None) -> dict[str, Any]:
    """Figures from per-image observations: Frechet distance (with the std over seed groups) for
    observations that have a reference, mean over the defined (non-NaN) ones otherwise; plus ``n_images``."""
    out: dict[str, Any] = {}
    n = 0
    for key, values in obs.items():
        values = np.asarray(values)
        n = len(values)
        if key in references:
            if n < 2:
                continue
            out[key] = frechet_distance(values, references[key])
            out[f"n_reference_{key}"] = int(len(references[key]))
            if groups is not None and len(np.unique(groups)) > 1:
                per = [frechet_distance(values[groups == g], references[key])
                       for g in np.unique(groups) if (groups == g).sum() >= 2]
                if len(per) > 1:
                    out[f"{key}_groups"] = per
                    out[f"{key}_std"] = float(np.std(per, ddof=1))
        else:
            out[key] = float(np.nanmean(values)) if n and not np.isnan(values).all() else float("nan")
    if obs:
        out["n_images"] = n
    return out
