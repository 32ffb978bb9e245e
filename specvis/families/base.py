"""What a model family provides, declared in one place: ``Family``.

One instance per family module (``FAMILY`` at its end), registered in ``specvis.families.FAMILIES``.
A family says what its checkpoints are (``name``; ``conditioning``: "class" ids, "text" prompts through
the checkpoint's own processor, or "caption" states of a separate text encoder; ``tokens``: "discrete"
codes or "continuous" latents), how to recognise a directory (``matches(config)`` on its config.json,
or ``matches_dir`` for releases without one), how to load it (``load``: the model built on the meta
device and its weights streamed in; ``pipeline_fields``: the fields of the ``Pipeline`` around it),
its official prompt template (``encode``, ``negative``), prompt text conventions (``prompt_processor``,
``positive_suffix``), its official sampling defaults (``sampling``) and its image decoder
(``image_decoder``). Every capability is an attribute or method of the base with a default, so
callers never probe a family with ``hasattr``.

The one ``Pipeline`` (``specvis.pipeline``, above this package: no family imports it) asks its
model's family what differs between models (``check_request``,
``check_method``, ``condition``, ``check_memory``, ``run``, ``to_images``/``images_of``, ``codebook``,
``decoder``, ``resident``, ``memory``, ``configure``, ``set_grid``, ``num_classes``): the base gives a
text-conditioned, KV-cached, discrete-token model's answers (``families.prompts``: text prompts;
``families.kv_cache``: configure, plan, run); ``ClassFamily`` a class-conditional one's (the embedded
bundles: ``families.embedded``; MAR: ``families.mar``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

import torch

from .. import checks
from ..checks import config_sizes, one_line
from ..generate import Generation
from ..models.base import Condition, Prompts
from ..models.decoder import PromptDecoder
from ..models.loading import (config_dtype, empty_parameters, load_safetensors, resolve, safetensors_dtype,
                              safetensors_index)
from ..models.quantize import quantize_linears, streaming_quantizer
from ..sampling import Sampling
from ..viz import to_pil
from .hf import check_text_size, read_json, weight_files
from .kv_cache import check_memory, configure_models, memory_plan, rule_needs, run_cached
from .prompts import check_lengths, conditions

Conditioning = Literal["class", "text", "caption"]
Tokens = Literal["discrete", "continuous"]


@dataclass(frozen=True)
class Request:
    """A pipeline call's conditioning arguments as given: what the model's family reads (class ids, or
    prompts, negative prompts, grid and positive suffix) and the sampler options of an ordered model
    (MAR's ``num_iter``, ``cfg_schedule``). ``batch_size`` (continuous batching: samples decoded at once,
    ``generate(batch_size=)``) is checked already."""

    classes: Any = None
    prompts: Any = None
    negative_prompts: Any = None
    height: int | None = None
    width: int | None = None
    positive_suffix: bool = True
    num_iter: int | None = None
    cfg_schedule: str | None = None
    batch_size: int | None = None


class Family:
    """A model family: the base gives every capability a default (or a one-line refusal)."""

    name: ClassVar[str]
    conditioning: ClassVar[Conditioning] = "text"
    tokens: ClassVar[Tokens] = "discrete"
    prompt_processor: ClassVar[str] = "AutoProcessor"  # the transformers class that loads the prompt processor
    positive_suffix: ClassVar[str] = ""  # appended to text prompts by the official scripts (Emu3)
    fixed_grid: ClassVar[bool] = False  # generates its native grid only (LlamaGen t2i: its 2D RoPE table)
    default_sampling: ClassVar[dict[str, Any]] = {}  # the official sampling defaults (``Sampling`` fields)
    kv_cache: ClassVar[bool] = True  # decodes with a KV cache: the memory plan applies (MAR: False)
    decodes: ClassVar[bool] = True  # renders images (``images_of``): the bench's quality metrics ask

    def __repr__(self) -> str:
        return f"<family {self.name}>"

    # ------------------------------------------------------------ recognising a directory
    def matches(self, config: dict) -> bool:
        """Whether a config.json is one of this family's (its ``model_type``)."""
        return False

    def matches_dir(self, directory: Path) -> bool:
        """Whether a directory without a usable config.json is one of this family's releases, by its files."""
        return False

    def recognise(self, directory: Path) -> tuple[bool, dict | None]:
        """(whether the directory is this family's, its config.json or None for releases recognised by
        their files); a one-line ValueError when it is not a directory or has neither."""
        d = Path(directory)
        if not d.is_dir():
            raise ValueError(f"{d}: not a directory")
        if self.matches_dir(d):
            return True, None
        config = read_json(d / "config.json")
        return self.matches(config), config

    # ------------------------------------------------------------ loading
    def build(self, directory: Path, config: dict, height: int | None = None, width: int | None = None):
        """(decoder, route): the model a config describes (build it under ``models.loading.empty_parameters``)
        and where each checkpoint tensor goes in it (``families.hf.decoder_route``)."""
        raise ValueError(f"family {self.name} loads its own file format: it builds no decoder from a config.json")

    def sampling(self, directory: Path, config: dict | None) -> dict[str, Any]:
        """The official sampling defaults of this checkpoint (``default_sampling`` unless the
        checkpoint's own files say otherwise)."""
        return dict(self.default_sampling)

    def load(self, directory: Path, config: dict | None, height: int | None = None, width: int | None = None, *,
             device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
             quantize: str | None = None):
        """The checkpoint's decoder with its weights, in eval mode, on ``device`` in ``dtype`` (None:
        ``models.loading.default_dtype`` of the checkpoint's own dtype). Loaded at the cost of the
        weights: built on the meta device, each tensor streamed from the memory-mapped safetensors,
        shard by shard, into its place (``models.loading``); with ``quantize="int8"`` each block
        linear becomes int8 as its weight arrives (``models.quantize``). ``model.dtype_source`` says
        why this dtype. Families with their own file format override this."""
        d = Path(directory)
        files = weight_files(d)
        dt, why = resolve(dtype, config_dtype(config) or safetensors_dtype(files), device)
        with empty_parameters():
            model, route = self.build(d, config, height, width)
        check_layer_count(model, safetensors_index(files), route, str(directory))
        load_safetensors(model, files, route, dt, device, str(directory),
                         finish=streaming_quantizer(model) if quantize else None)
        if quantize:
            quantize_linears(model)  # block linears with a bias (none in these families' releases)
        model.dtype_source = why
        return model.eval()

    def pipeline_fields(self, name: str | Path, directory: Path, draft=None, drafter=None, *,
                        device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                        quantize: str | None = None) -> dict[str, Any]:
        """The ``Pipeline`` fields (its keyword arguments; ``sv.load`` builds it) of a checkpoint directory
        of this family, with an optional draft checkpoint of the same family (same tokenizer, same image
        vocabulary) and an optional EAGLE head trained for this checkpoint (``specvis train-drafter
        --model``: its ``--out`` directory or the ``final/`` head in it; a Hub id works too). All are loaded on ``device`` in ``dtype``
        (None: the target checkpoint's default, ``models.loading.default_dtype``; the draft and the
        head follow the target); ``quantize="int8"``: the target's and the draft's block linears in
        int8 (``models.quantize``). Families with their own file format override this."""
        from ..hub import resolve_model_dir

        config = read_json(Path(directory) / "config.json")
        target = self.load(directory, config, device=device, dtype=dtype, quantize=quantize)
        dt = next(target.parameters()).dtype
        draft_model = None
        if draft is not None:
            draft_dir = resolve_model_dir(str(draft))
            draft_model = self.load(draft_dir, self.draft_config(draft_dir, directory), device=device, dtype=dt,
                                    quantize=quantize)
            self.check_draft(draft_model, target, draft_dir, directory)
        drafter_model = None
        if drafter is not None:
            from ..models.drafter import load_drafter

            drafter_model = load_drafter(resolve_model_dir(str(drafter)), target)
        grid = (target.layout.height, target.layout.width)
        extras = {"grid": grid, "family": self.name, "directory": str(directory), "dtype_source": target.dtype_source}
        if draft is not None:
            extras["draft"] = display_name(draft, draft_dir)
        return dict(name=display_name(name, directory), target=target, tokenizer=None, draft=draft_model,
                    drafter=drafter_model, directory=directory, family=self,
                    default_sampling=Sampling(**self.sampling(directory, config)), extras=extras)

    def draft_config(self, draft_dir: Path, directory: Path) -> dict | None:
        """The config.json of a draft directory (None: recognised by its files), checked to be of this
        family: else one line naming both."""
        ours, config = self.recognise(draft_dir)
        if not ours:
            raise ValueError(f"draft {draft_dir} (model_type {config.get('model_type')!r}) is not of the family of "
                             f"{directory} ({self.name}): the draft must be a checkpoint of the target's family")
        if config is not None:
            checked_config(config, Path(draft_dir))
        return config

    def check_draft(self, draft, target, draft_dir, directory) -> None:
        """A draft must read the target's prompt ids (same text vocabulary) and propose its tokens (same
        image vocabulary and structural tokens). Its native grid may differ: the pipeline sets both to
        the requested grid."""
        d, t = draft.layout, target.layout
        if (d.vocab_size, d.row_end) != (t.vocab_size, t.row_end):
            raise ValueError(f"draft {draft_dir}: image vocabulary of {d.vocab_size} codes (row ends {d.row_end}) "
                             f"differs from {directory}'s {t.vocab_size} (row ends {t.row_end})")
        if draft.config.text_vocab_size != target.config.text_vocab_size:
            raise ValueError(f"draft {draft_dir}: text vocabulary of {draft.config.text_vocab_size} tokens differs from "
                             f"{directory}'s {target.config.text_vocab_size}: the draft must share the target's tokenizer")

    # ------------------------------------------------------------ prompts and images
    def processor(self, directory: Path, target, device: torch.device, dtype: torch.dtype):
        """What turns text prompts into token ids: the checkpoint's transformers ``prompt_processor``."""
        try:
            import transformers
        except ImportError:
            raise ValueError("text prompts need the checkpoint's processor: pip install specvis[hf]") from None
        kind = self.prompt_processor
        try:
            return getattr(transformers, kind).from_pretrained(str(directory))
        except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, KeyError ...
            raise ValueError(f"{directory}: cannot load the checkpoint's {kind} for text prompts "
                             f"({one_line(exc)}); token-id prompts need none, and under CFG neither do "
                             "token-id negative_prompts or a family whose unconditional prompt is ids") from None

    def check_ids(self, pipe, rows: list[list[int]], what: str) -> None:
        """Token-id rows must be ids of the model's text vocabulary."""
        vocab = pipe.target.config.text_vocab_size
        if any(not 0 <= t < vocab for p in rows for t in p):
            raise ValueError(f"{what}: token ids must be in 0..{vocab - 1}")

    def prefix(self, pipe, rows: list[list[int]]):
        """The model's conditional prefix of token-id rows: the ids themselves (``Prompts``)."""
        return Prompts.of(rows, pipe.device)

    def unconditional(self, pipe, cond, height: int, width: int):
        """The official CFG rows of a call without negative prompts: the model's own unconditional rule
        where it has one (Janus: the prompt with its text replaced by pad; Chameleon: from config ids),
        else the official negative prompt through the same template (``negative``: Emu3)."""
        if pipe.target.unconditional_rule is not None:
            return pipe.target.unconditional(cond)
        rows = self.negative(pipe.processor, len(cond), height, width, pipe.target)
        check_lengths(pipe, rows, "negative_prompts")
        return self.prefix(pipe, rows)

    def decode_images(self, decoder, codes: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Pixels of codes (B, H*W) on a ``height x width`` grid by the family's image decoder."""
        return decoder.decode(codes, height, width)

    def native_grid(self, directory: Path, config: dict | None) -> tuple[int, int]:
        """The grid (rows, columns) in image tokens the checkpoint generates by default."""
        raise ValueError(f"family {self.name} declares no native grid")

    def encode(self, processor, texts: list[str], height: int, width: int, model=None) -> list[list[int]]:
        """The official prompt template: each text as the whole conditional prefix, in token ids."""
        raise ValueError(f"family {self.name} takes no text prompts")

    def negative(self, processor, count: int, height: int, width: int, model=None) -> list[list[int]]:
        """The official unconditional prompt (for families whose model has no unconditional rule)."""
        raise ValueError(f"family {self.name} has no official negative prompt: give negative_prompts=")

    def image_decoder(self, directory: Path, device: str | torch.device = "cpu"):
        """The checkpoint's image decoder (``decode``, ``codebook``), fp32 on ``device``."""
        raise ValueError(f"family {self.name} declares no image decoder")

    # ------------------------------------------------------------ a pipeline call (``Pipeline.__call__``)
    def check_request(self, pipe, request: Request) -> None:
        """The call's arguments this family takes, before anything runs: prompts, not classes."""
        if request.classes is not None:
            raise ValueError(f"model {pipe.name} is text-conditioned: give prompts=, not classes=")
        if request.prompts is None:
            raise ValueError(f"model {pipe.name} is text-conditioned: give prompts=[...]")
        self.check_sampler_options(pipe, request)

    def check_sampler_options(self, pipe, request: Request) -> None:
        """``num_iter``/``cfg_schedule`` are an ordered sampler's (MAR): refused by a one-step-a-token model."""
        for what, value in (("num_iter", request.num_iter), ("cfg_schedule", request.cfg_schedule)):
            if value is not None:
                raise ValueError(f"{what}= applies to MAR models only; model {pipe.name} decodes one token per step")

    def check_method(self, pipe, method, sampling: Sampling) -> None:
        """Methods or sampling the family cannot run, refused in one line before any forward (the base: none)."""

    def condition(self, pipe, request: Request, sampling: Sampling) -> Condition:
        """The call's ``Condition``: the prompts' rows and their CFG rows on the grid asked for
        (``prompts.conditions``: template, positive suffix, negative or official unconditional prompts)."""
        return conditions(pipe, request.prompts, request.negative_prompts, sampling, request.height, request.width,
                          request.positive_suffix)

    def check_memory(self, pipe, condition: Condition, method, sampling: Sampling, refill: bool = False):
        """The memory plan of the call (``kv_cache.check_memory``): a one-line error when it does not fit."""
        return check_memory(pipe, condition, method, sampling, refill)

    def run(self, pipe, condition: Condition, request: Request, method, sampling: Sampling, seed: int,
            progress) -> Generation:
        """The generation: ``specvis.generate`` through the tuner, with the codebook the rule needs."""
        return run_cached(pipe, condition, method, sampling, seed, self.rule_codebook(pipe, method), progress,
                          request.batch_size)

    def rule_codebook(self, pipe, method) -> torch.Tensor | None:
        """The codebook the method's acceptance rule gets: the VQ's, loaded only for a rule that needs it (LANTERN)."""
        return self.codebook(pipe) if "codebook" in rule_needs(method) else None

    def codebook(self, pipe) -> torch.Tensor | None:
        """The code vectors of the image decoder (``Pipeline.codebook``)."""
        return self.decoder(pipe).codebook

    def decoder(self, pipe):
        """The checkpoint's image decoder (``image_decoder``: ``decode(codes, height, width)``, ``codebook``),
        loaded on first use onto the pipeline's device and kept in ``pipe.vq``."""
        if pipe.vq is None:
            try:
                vq = self.image_decoder(pipe.directory, device=pipe.device)  # fp32, streamed onto the device
            except (ImportError, OSError, RuntimeError, KeyError) as exc:
                raise ValueError(f"{pipe.directory}: cannot load the image decoder ({one_line(exc)})") from None
            pipe.vq = vq.to(pipe.device)
        return pipe.vq

    def resident(self, pipe) -> tuple:
        """Modules besides the cached models that hold memory for the plan (the loaded VQ, if any)."""
        return (pipe.vq,)

    def to_images(self, pipe, codes: torch.Tensor) -> list:
        """PIL images of codes (B, H*W) on the grid last generated (the native one before any call)."""
        L = pipe.target.layout
        return to_pil(self.decode_images(self.decoder(pipe), codes.to(pipe.device), L.height, L.width))

    def images_of(self, pipe, out: Generation) -> list:
        """PIL images of a ``Generation`` of this family's pipeline: its codes, or its latents for a
        continuous-token family (``tokens``)."""
        return self.to_images(pipe, out.latents if self.tokens == "continuous" else out.tokens)

    def num_classes(self, pipe) -> int:
        """Classes of ``pipe(classes=...)``: none for prompt-conditioned models."""
        return 0

    def memory(self, pipe, batch_size: int, method, sampling: Sampling | None, prompt_tokens: int | None,
               refill: bool = False):
        """``Pipeline.memory`` of checked arguments: the KV-cache plan (``kv_cache.memory_plan``)."""
        return memory_plan(pipe, batch_size, method, sampling, prompt_tokens, refill)

    def configure(self, pipe, dtype, compile: bool | str, graphs: bool | None) -> None:
        """``Pipeline.configure``: dtype, compile, captured rounds, CPU linear layouts (``kv_cache.configure_models``)."""
        configure_models(pipe, dtype, compile, graphs)

    def set_grid(self, pipe, height: int | None, width: int | None) -> tuple[int, int]:
        """Generate ``height x width`` image tokens (None: the native grid's) with the target and draft;
        a family with a fixed grid (``fixed_grid``: LlamaGen t2i's 2D RoPE table) takes its own only."""
        native = pipe.grid
        if self.fixed_grid:
            if (height is not None and height != native[0]) or (width is not None and width != native[1]):
                raise ValueError(f"model {pipe.name}: {self.name} generates its native {native[0]}x{native[1]} "
                                 f"grid only (its 2D RoPE table), got height={height} width={width}")
            return native
        H, W = native[0] if height is None else height, native[1] if width is None else width
        try:
            for m in (pipe.target, pipe.draft):
                if m is not None:
                    m.set_grid(H, W)
        except ValueError as e:
            if height is None and width is None:
                raise ValueError(f"{e} (the checkpoint's native grid); pass height= and width= "
                                 "(--height/--width) in image tokens for a smaller image") from None
            raise
        return H, W


class ClassFamily(Family):
    """A class-conditional family (the embedded bundles, MAR): ``pipe(classes=[...])``, its model's fixed
    grid, the image decoder given to the pipeline as its ``tokenizer``."""

    conditioning = "class"

    def check_request(self, pipe, request: Request) -> None:
        """Classes, no prompts, the model's own grid; the class ids themselves are checked once, by ``condition``."""
        if request.prompts is not None or request.negative_prompts is not None:
            raise ValueError(f"model {pipe.name} is class-conditional: give classes=, not prompts=")
        if request.height is not None or request.width is not None:
            raise ValueError(f"model {pipe.name} has a fixed grid: height/width cannot be set")
        if request.classes is None:
            raise ValueError(f"model {pipe.name} is class-conditional: give classes=[...]")
        self.check_sampler_options(pipe, request)

    def condition(self, pipe, request: Request, sampling: Sampling) -> Condition:
        """Class ids in 0 .. num_classes - 1 on the pipeline's device (the model's null class is the CFG row)."""
        ids = checks.class_ids(request.classes, self.num_classes(pipe))
        return Condition(torch.as_tensor(ids, dtype=torch.long, device=pipe.device))

    def run(self, pipe, condition: Condition, request: Request, method, sampling: Sampling, seed: int,
            progress) -> Generation:
        return run_cached(pipe, condition.cond, method, sampling, seed, self.rule_codebook(pipe, method), progress,
                          request.batch_size)

    def rule_codebook(self, pipe, method) -> torch.Tensor | None:
        return self.codebook(pipe)  # the tokenizer's, in memory already

    def codebook(self, pipe) -> torch.Tensor | None:
        return pipe.tokenizer.codebook

    def decoder(self, pipe):
        return pipe.tokenizer

    def resident(self, pipe) -> tuple:
        return (pipe.tokenizer,)

    def to_images(self, pipe, codes: torch.Tensor) -> list:
        return to_pil(pipe.tokenizer.decode(codes))

    def num_classes(self, pipe) -> int:
        return pipe.target.num_conditions

    def processor(self, directory: Path, target, device: torch.device, dtype: torch.dtype):
        raise ValueError(f"family {self.name} is class-conditional: it takes no text prompts")

    def set_grid(self, pipe, height: int | None, width: int | None) -> tuple[int, int]:
        raise ValueError(f"model {pipe.name} has a fixed grid: height/width cannot be set")


def checked_config(config: dict, directory: Path) -> None:
    """Zero or huge sizes in config.json: one line, before any module is built."""
    config_sizes(config, str(directory / "config.json"))
    check_text_size(config, directory)


LAYER = re.compile(r"layers\.(\d+)\.")


def check_layer_count(model: PromptDecoder, keys, route, where: str) -> None:
    """The decoder layers the checkpoint's keys fill (read from the headers, through ``route``) are the
    config's count: else a one-line ValueError, before any tensor is read (a config with fewer layers
    than the file would otherwise report the rest as unexpected tensors, one key at a time)."""
    stored = {int(m.group(1)) for k in keys for p in (route(k) or ()) if (m := LAYER.match(p.name))}
    if stored and len(stored) != model.config.n_layer:
        raise ValueError(f"{where}: config.json gives {model.config.n_layer} decoder layers, the checkpoint stores {len(stored)}")


def display_name(name: str | Path, directory: Path) -> str:
    """How reports name a checkpoint: its Hub id when it came from the cache (the snapshot directory is
    a commit hash), else the directory's name."""
    return Path(directory).name if Path(str(name)).expanduser().is_dir() else str(name)


class OwnFormatFamily(Family):
    """A family with its own file format and model class (LlamaGen t2i, MAR): ``read_model`` and
    ``read_fields`` are its module's loaders (``specvis.load`` quantizes a pipeline's models afterwards)."""

    read_model: ClassVar[Callable[..., Any]]
    read_fields: ClassVar[Callable[..., dict[str, Any]]]

    def load(self, directory: Path, config: dict | None, height: int | None = None, width: int | None = None, *,
             device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None, quantize: str | None = None):
        """``read_model``; ``quantize="int8"``: its linears in int8 once loaded."""
        model = self.read_model(Path(directory), height, width, device=device, dtype=dtype)
        if quantize:
            quantize_linears(model)
        return model

    def pipeline_fields(self, name, directory: Path, draft=None, drafter=None, *, device: str | torch.device = "cpu",
                        dtype: str | torch.dtype | None = None, quantize: str | None = None) -> dict[str, Any]:
        return self.read_fields(name, directory, draft, drafter, device=device, dtype=dtype)
