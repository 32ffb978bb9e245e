"""MAR checkpoint directories for ``sv.load(dir)``: a directory holding the official
``checkpoint-last.pth`` (as ``pretrained_models/mar/mar_base/`` of LTH14/mar) and the KL-16 VAE
``kl16.ckpt``, found next to it, in ``vae/`` under it, or where the official tree puts it
(``pretrained_models/vae/kl16.ckpt``, two levels up).

The pipeline runs MAR through ``specvis.generate`` with the family's ordered sampler declared
(``MARReveal``: random order, cosine mask schedule, linear CFG schedule, DiffLoss sampling): ``method``
None or ``sv.AR()`` is MAR's own sampler (``MAR.sample`` with one generator, draw for draw), and
``sv.CSpD(...)`` with a draft MAR (``draft=``: a smaller MAR directory or ``MAR`` sharing the grid, token
dimension and classes) runs over the same generation order (``specvis.methods.cspd_mar``);
discrete-token methods are refused. ``sampling.cfg_scale`` is MAR's ``cfg`` (the
end point of its linear schedule), ``sampling.temperature`` its DiffLoss temperature; top-k/top-p do
not apply to continuous tokens and must stay unset.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import checks
from ..generate import generate_checked
from ..methods.ar import AR
from ..methods.cspd import CSpD
from ..methods.laws import ContinuousLaw, GuidedHead
from ..models.loading import requested_dtype
from ..models.mar import CHECKPOINT_NAME as CHECKPOINT
from ..models.mar import cfg_scales, mask_schedule
from ..sampling import Sampling
from ..viz import to_pil
from .base import ClassFamily, OwnFormatFamily, Request

NAME = "mar"
VAE_NAME = "kl16.ckpt"
MAX_NUM_ITER = 1_000_000  # sampler steps: a bound on the schedule's loop (a step past the stream reveals nothing)


def matches(config: dict) -> bool:
    return False  # MAR releases have no config.json: detected by matches_dir


def matches_dir(directory: Path) -> bool:
    return (Path(directory) / CHECKPOINT).is_file()


def find_vae(directory: Path) -> Path:
    d = Path(directory)
    for candidate in (d / VAE_NAME, d / "vae" / VAE_NAME, d.parent.parent / "vae" / VAE_NAME, d.parent / "vae" / VAE_NAME):
        if candidate.is_file():
            return candidate
    raise ValueError(f"{d}: missing the KL-16 VAE {VAE_NAME} (looked in the directory, its vae/ and "
                     f"../../vae/ as in MAR's pretrained_models tree)")


def load_decoder(directory: Path, height: int | None = None, width: int | None = None, *,
                 device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None):
    """The MAR model (EMA weights) of a directory, memory-mapped and streamed into ``dtype`` (None:
    ``models.loading.default_dtype`` of the stored one) on ``device``; ``model.dtype_source`` says why."""
    from ..models.loading import read_torch_file, resolve, state_dict_dtype
    from ..models.mar import load_mar_checkpoint

    if height is not None or width is not None:
        raise ValueError("MAR has a fixed grid: height/width cannot be set")
    path = Path(directory) / CHECKPOINT
    stored = None
    if dtype is None:
        try:
            obj = read_torch_file(path, allowed=[argparse.Namespace])
            ema = obj.get("model_ema") if isinstance(obj, dict) else None
            stored = state_dict_dtype(ema if isinstance(ema, dict) else obj.get("model", obj))
        except Exception:  # noqa: BLE001 - load_mar_checkpoint reports unreadable files in one line
            stored = None
    dt, why = resolve(dtype, stored, device)
    model = load_mar_checkpoint(path, ema=True, device=device, dtype=dt)
    model.dtype_source = why
    return model


@dataclass(frozen=True)
class MARReveal:
    """MAR's sampler as the ordered-verifier protocol of ``specvis.methods.ordered`` (what
    ``specvis.generate(..., ordered=)`` runs AR and CSpD with): ``num_iter`` steps of the official cosine
    mask schedule, each step's CFG scale by ``cfg_schedule`` (``models.mar.cfg_scales``), a random
    generation order per sample revealed from its end, one bidirectional forward (``MAR.z_at``) and
    the DiffLoss head, whose x_K stays random at temperature 0 (the temperature scales the step noise
    only). ``draw`` is ``MAR.sample``'s per step: per sample x_K then the step noises, no noise on the last
    denoising step (official ``p_sample``)."""

    num_iter: int = 64
    cfg_schedule: str = "linear"

    def schedule(self, seq_len: int, cfg: float) -> tuple[list[int], list[float]]:
        mask_lens, reveals = mask_schedule(seq_len, self.num_iter)
        return reveals, cfg_scales(cfg, self.cfg_schedule, seq_len, mask_lens)

    def order(self, model, batch: int, generator: torch.Generator) -> torch.Tensor:
        return model.sample_orders(batch, [generator] * batch)

    def condition(self, model, labels: torch.Tensor, guided: bool) -> torch.Tensor:
        return model.guided_class_embedding(labels, labels.shape[0], guided)

    def features(self, model, tokens: torch.Tensor, unknown: torch.Tensor, condition: torch.Tensor,
                 positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return model.z_at(tokens, unknown, condition, positions)

    def head(self, model, scale: float | torch.Tensor, temperature: float) -> GuidedHead:
        return GuidedHead(model.diffloss, scale, temperature, random_start=True)

    def token_dim(self, model) -> int:
        return model.token_embed_dim

    def draw(self, law: ContinuousLaw, generator: torch.Generator) -> torch.Tensor:
        B, n = law.z.shape[:2]
        C, K, dev = law.head.head.token_dim, law.head.head.num_steps, law.z.device
        x_T, noise = [], []
        for _ in range(B):  # MAR.sample with one generator: sample after sample
            x_T.append(torch.randn(n, C, device=dev, generator=generator))
            noise.append(torch.randn(n, K, C, device=dev, generator=generator))
        noise = torch.cat(noise)
        noise[:, -1] = 0  # the official p_sample adds no noise at t == 0
        return law.flat().run(generator, x_T=torch.cat(x_T), noise=noise).x0.reshape(B, n, C)


def check_draft(target, draft) -> None:
    """A MAR draft must share the target's grid, token dimension and classes."""
    for what, a, b in (("seq_len", target.seq_len, draft.seq_len),
                       ("token_embed_dim", target.token_embed_dim, draft.token_embed_dim),
                       ("class_num", target.num_classes, draft.num_classes)):
        if a != b:
            raise ValueError(f"the MAR draft's {what} {b} differs from the target's {a}")


class SphereLatentDecoder(torch.nn.Module):
    """A VQ as MAR's image decoder when MAR's tokens are the VQ's L2-normalised pre-quantisation latents
    (the emoji MAR, trained on ``tokenize --latents``): ``decode(z)`` with z (B, d, h, w) projects each
    token onto the codebook sphere and decodes it (``VQModel.decode_continuous``)."""

    def __init__(self, vq) -> None:
        super().__init__()
        self.vq = vq

    @property
    def embed_dim(self) -> int:
        return self.vq.config.codebook_embed_dim

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.vq.decode_continuous(z.flatten(2).transpose(1, 2))


def pipeline_fields(name, directory: Path, draft=None, drafter=None, vae=None, *, device: str | torch.device = "cpu",
                    dtype: str | torch.dtype | None = None) -> dict:
    """The ``Pipeline`` fields (its keyword arguments) of ``sv.load(dir)`` of a MAR directory; ``draft``:
    a MAR directory, checkpoint file or ``MAR``; ``vae``: the image decoder (``decode(latents (B, E, h,
    w))``; default: the KL-16 found by ``find_vae``, fp32). MAR and its draft are loaded on ``device``
    in ``dtype`` (None: the checkpoint's default, ``models.loading.default_dtype``; the draft follows
    the target)."""
    from ..models.kl_vae import KLVAE
    from ..models.mar import DEFAULT_CFG

    if drafter is not None:
        raise ValueError("MAR directories take no drafter= (EAGLE heads are for discrete tokens); give draft= for CSpD")
    directory = Path(directory)
    model = load_decoder(directory, device=device, dtype=dtype)
    dt = next(model.parameters()).dtype
    if draft is not None and not isinstance(draft, torch.nn.Module):
        draft_dir = Path(draft)
        if draft_dir.is_file():
            from ..models.mar import load_mar_checkpoint

            draft = load_mar_checkpoint(draft_dir, ema=True, device=device, dtype=dt)
        elif matches_dir(draft_dir):
            draft = load_decoder(draft_dir, device=device, dtype=dt)
        else:
            raise ValueError(f"draft {draft_dir}: not a MAR directory (no {CHECKPOINT}) or checkpoint file")
    if draft is not None:
        check_draft(model, draft)
    vae = vae if vae is not None else KLVAE.from_checkpoint(find_vae(directory), device=device)
    if vae.embed_dim != model.config.vae_embed_dim:
        raise ValueError(f"{directory}: the VAE has {vae.embed_dim} latent channels, MAR expects {model.config.vae_embed_dim}")
    cfg = DEFAULT_CFG.get(model.config.model, 1.0)
    return dict(name=directory.name, target=model, tokenizer=vae,
                default_sampling=Sampling(cfg_scale=cfg, temperature=1.0),
                extras={"family": NAME, "directory": str(directory), "grid": (model.seq_h, model.seq_w),
                        "dtype_source": model.dtype_source},
                class_names=[f"class{i}" for i in range(model.num_classes)], draft=draft, num_iter=64, family=FAMILY)


class MARFamily(OwnFormatFamily, ClassFamily):
    """MAR: class-conditional, continuous tokens revealed in its own order (``MARReveal``), its own
    file format (``checkpoint-last.pth``) and image decoder (the KL-16 VAE, the pipeline's ``tokenizer``).
    ``pipe(classes=[...], sampling=sv.Sampling(cfg_scale=..., temperature=...), seed=0, num_iter=64)``
    -> ``Generation`` (``latents`` (B, L, C) MAR tokens, ``tokens`` None, ``images`` PIL)."""

    name = NAME
    conditioning = "class"
    tokens = "continuous"
    kv_cache = False  # MAR's encoder-decoder recomputes every step: no memory plan
    matches_dir = staticmethod(matches_dir)

    read_model = staticmethod(load_decoder)
    read_fields = staticmethod(pipeline_fields)

    def image_decoder(self, directory: Path, device: str | torch.device = "cpu"):
        from ..models.kl_vae import KLVAE

        return KLVAE.from_checkpoint(find_vae(Path(directory)), device=device)

    def num_classes(self, pipe) -> int:
        return pipe.target.num_classes

    def check_sampler_options(self, pipe, request: Request) -> None:
        """MAR's sampler takes ``num_iter`` and ``cfg_schedule`` (checked when it runs)."""

    def condition(self, pipe, request: Request, sampling: Sampling):
        """The class ids (``ClassFamily.condition``); MAR decodes every image of a call at once (its rows
        are not refilled): ``batch_size`` below the images is refused."""
        condition = super().condition(pipe, request, sampling)
        if request.batch_size is not None and request.batch_size < condition.batch:
            raise ValueError(f"batch_size {request.batch_size}: model {pipe.name} (MAR) decodes every image of a call "
                             "at once and does not refill rows; leave batch_size out (--batch-size) or call it per batch")
        return condition

    def check_method(self, pipe, method, sampling: Sampling) -> None:
        """MAR's ordered sampler runs AR and CSpD (continuous tokens); top-k/top-p do not apply."""
        if method is not None and not method.model_order:
            raise ValueError(f"model {pipe.name} (MAR) has continuous tokens: method must be None, sv.AR() or "
                             f"sv.CSpD(...), got {type(method).__name__} (a discrete-token method)")
        if sampling.top_k is not None or sampling.top_p is not None:
            raise ValueError("top_k/top_p do not apply to MAR's continuous tokens")

    def check_memory(self, pipe, condition, method, sampling: Sampling, refill: bool = False) -> None:
        """No KV cache, no plan."""

    def memory(self, pipe, batch_size: int, method, sampling, prompt_tokens, refill: bool = False):
        """MAR keeps no KV cache (its encoder-decoder recomputes every step): it has no memory plan."""
        raise ValueError(f"model {pipe.name} (MAR) has no KV cache to plan: pipe.memory is for the "
                         "autoregressive families")

    def configure(self, pipe, dtype, compile: bool | str, graphs: bool | None) -> None:
        """The target's and the draft's dtype only (no cached block stacks to compile, no captured rounds)."""
        if dtype is not None:
            pipe.target.to(dtype=requested_dtype(dtype))
            if pipe.draft is not None:
                pipe.draft.to(dtype=requested_dtype(dtype))

    def run(self, pipe, condition, request: Request, method, sampling: Sampling, seed: int, progress):
        """MAR's ordered sampler (``MARReveal``) through ``specvis.generate`` (the call's arguments checked
        already: ``generate_checked``): AR, or CSpD with the draft."""
        # steps past the stream's length reveal nothing and cost no forward, only the schedule's loop
        num_iter = checks.integer(pipe.num_iter if request.num_iter is None else request.num_iter, "num_iter", 1,
                                  MAX_NUM_ITER)
        reveal = MARReveal(num_iter, request.cfg_schedule or pipe.cfg_schedule)
        return generate_checked(pipe.target, condition.cond, AR() if method is None else method, sampling, seed,
                                draft=pipe.draft if isinstance(method, CSpD) else None, progress=progress,
                                ordered=reveal, batch_size=request.batch_size)

    def codebook(self, pipe) -> None:
        return None

    def to_images(self, pipe, latents: torch.Tensor) -> list:
        vae = pipe.tokenizer
        return to_pil(vae.decode(pipe.target.unpatchify(latents).to(next(vae.parameters()).dtype)))


FAMILY = MARFamily()
