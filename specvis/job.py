"""A ``Job``: what to make and where it goes, built once by each door (``specvis generate``, ``specvis
bench``, ``specvis sample``, the server) and run on a loaded pipeline through its public call.

The job holds the arguments as given; it does not validate what the pipeline validates (``batch_size``,
``seed``, the classes and prompts it receives): ``run`` hands them to ``pipe(...)``, the one place that
checks them. What only a job means is its own: image i gets condition i mod the number given (classes,
or prompts with their negative prompts), ``num`` images in all."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Job:
    """What to make and where it goes. ``model``: bundle name, checkpoint directory or Hub id (None:
    the loaded pipeline's name); ``method``: a method, a name or bench spec (None: AR); ``sampling``:
    a ``Sampling``, a dict of its fields, or None (the model's); ``classes`` (class-conditional
    models; None: every class) or ``prompts`` with ``negative_prompts`` (one for all, or one per
    prompt; None: the family's own), ``height``/``width`` in image tokens and ``positive_suffix``
    (text-to-image models); ``num`` images (None: one per class or prompt given, else 8);
    ``batch_size``: at most this many decoded at once (None: all); ``seed`` (None: the server draws
    one); ``out``: where the outputs go (a directory or a report file, as the door has it)."""

    model: str | None = None
    method: Any = None
    sampling: Any = None
    classes: tuple[int, ...] | None = None
    prompts: tuple[str, ...] | None = None
    negative_prompts: tuple[str, ...] | None = None
    height: int | None = None
    width: int | None = None
    positive_suffix: bool = True
    num: int | None = None
    batch_size: int | None = None
    seed: int | None = 0
    out: str | None = None

    @property
    def text(self) -> bool:
        """Whether the job is prompted (text-to-image) rather than class-conditional."""
        return self.prompts is not None

    def count(self) -> int:
        """Images in all: ``num``, else one per class or prompt given, else 8."""
        given = self.prompts if self.text else self.classes
        return self.num if self.num is not None else (len(given) if given else 8)

    def for_pipe(self, pipe) -> "Job":
        """The job with one condition per image: image i takes entry i mod the number given of the
        classes (every class of ``pipe`` when none) or of the prompts and negative prompts (one for
        all, or one per prompt). A given class that no image takes is still refused unless it is one
        of the model's (the pipeline checks those the images take); running it changes nothing."""
        n = self.count()
        if self.text:
            prompts, negative = list(self.prompts), self.negative_prompts
            if negative is not None and len(negative) not in (1, len(prompts)):
                raise ValueError(f"negative_prompts: give one, or one per prompt ({len(prompts)}), got {len(negative)}")
            return replace(self, num=n, prompts=tuple(prompts[i % len(prompts)] for i in range(n)),
                           negative_prompts=None if negative is None else tuple(negative[i % len(negative)]
                                                                                for i in range(n)))
        k = pipe.num_classes
        given = list(self.classes) if self.classes else list(range(k))
        for i, c in enumerate(given[n:], start=n):
            if not 0 <= c < k:
                raise ValueError(f"classes[{i}] = {c} is out of range: give class ids in 0..{k - 1}")
        return replace(self, num=n, classes=tuple(given[i % len(given)] for i in range(n)))

    def call_conditions(self, pipe, num: int | None = None) -> dict[str, Any]:
        """The conditioning keywords of ``pipe(...)`` for the first ``num`` images (None: all)."""
        job = self.for_pipe(pipe)
        if not job.text:
            return {"classes": list(job.classes[:num])}
        return {"prompts": list(job.prompts[:num]),
                "negative_prompts": None if job.negative_prompts is None else list(job.negative_prompts[:num]),
                "height": job.height, "width": job.width, "positive_suffix": job.positive_suffix}

    def run(self, pipe, num: int | None = None, progress=None, decode: bool = True):
        """``pipe(...)`` on the first ``num`` images (None: all) with the job's method, sampling, seed
        and batch size: the pipeline checks each of them, once."""
        return pipe(**self.call_conditions(pipe, num), method=self.method, sampling=self.sampling, seed=self.seed,
                    batch_size=self.batch_size, progress=progress, decode=decode)
