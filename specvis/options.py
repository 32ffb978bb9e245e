"""Options of methods and acceptance rules: one declaration per field, from which the checks, the
command line's flags, the bench spec parser and the docs' option tables are all generated.

A method or rule is a frozen dataclass that mixes in ``Options`` and declares each field with
``option(default, help=..., choices=..., low=..., high=..., flag=...)``. The field's annotation is its
type, read with ``typing.get_type_hints`` (never by searching the annotation's text):

- ``int``: an integer (numpy's too), never a bool or a float such as 1.0; ``low``/``high`` inclusive;
- ``float``: a finite number (ints allowed), never a bool or a string; ``low``/``high`` inclusive;
- ``bool``: True or False; ``str``: one of ``choices`` where given;
- ``tuple[X, ...]`` (non-empty) and ``tuple[X, Y]``: a tuple or list, item by item (bounds and choices
  apply to the items); a list is stored as a tuple;
- ``A | B``: either; a class (e.g. the ``AcceptanceRule`` protocol): an instance of it.

``aliases`` names values (``GSD.ranks``: ``"official"`` is (7, 6)); the value is stored. ``stream``
marks a field that counts tokens along the image stream (``generate.fit_to_stream`` clamps it to the
stream's length). A bad value is one ValueError naming ``Class.field``, what it takes and the value
given: ``SJD.window must be an integer >= 1, got 0``. Cross-field checks go in the class's ``check()``,
which ``Options.__post_init__`` calls after the fields passed. This module imports nothing of specvis.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import re
import types
import typing
from dataclasses import MISSING
from typing import Any

NoneType = type(None)


def option(default: Any = MISSING, *, help: str, choices: tuple | None = None, low: float | None = None,
           high: float | None = None, open_low: bool = False, flag: str | None = None, aliases: dict | None = None,
           stream: bool = False, default_factory: Any = MISSING) -> Any:
    """A dataclass field with its metadata. ``low``/``high``: inclusive bounds (``open_low``: the value
    must exceed ``low``). ``flag``: the command-line flag's name where the field's name would collide
    (``EagleTree.top_k`` -> ``tree-top-k``; default the name with "_" -> "-")."""
    meta = {"help": help, "choices": None if choices is None else tuple(choices), "low": low, "high": high,
            "open_low": open_low, "flag": flag, "aliases": dict(aliases or {}), "stream": stream}
    return dataclasses.field(default=default, default_factory=default_factory, metadata={"option": meta})


@dataclasses.dataclass(frozen=True)
class OptionInfo:
    """One option of a method or rule, as ``option_fields`` reads it off the class."""

    owner: str  # the class's name, as errors write it
    name: str
    type: Any  # the real annotation (``int``, ``tuple[int, int] | None``, ...)
    default: Any
    help: str
    choices: tuple | None
    low: float | None
    high: float | None
    open_low: bool
    flag: str
    aliases: dict
    stream: bool

    def allowed(self) -> str:
        """What the option takes, in words: ``an integer >= 1``, ``one of l2, cosine``."""
        return describe(self.type, self)

    def check(self, value: Any) -> Any:
        """``value`` as stored (lists as tuples, aliases resolved), or a one-line ValueError."""
        value = self.aliases.get(value, value) if isinstance(value, str) else value
        ok, out = _conform(self.type, value, self)
        if not ok:
            raise ValueError(f"{self.owner}.{self.name} must be {self.allowed()}, got {_shown(value)}")
        return out


@functools.cache
def option_fields(cls: type) -> tuple[OptionInfo, ...]:
    """The options of a method or rule class, in declaration order: its fields declared with
    ``option``. A field declared otherwise is not an option (no check, no flag, no docs row: e.g. a
    subclass's recorder, ``train_drafter.RecordedAR.records``); every field of the registry's classes
    is declared (tests/test_options.py)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("option")
        if not f.init or meta is None:
            continue
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        out.append(OptionInfo(cls.__name__, f.name, hints[f.name], default, meta["help"], meta["choices"],
                              meta["low"], meta["high"], meta["open_low"], meta["flag"] or f.name.replace("_", "-"),
                              meta["aliases"], meta["stream"]))
    return tuple(out)


class Options:
    """Mixin of the frozen option dataclasses (methods and acceptance rules): every field is checked
    against its declaration on construction, then ``check()`` runs the cross-field checks."""

    refills = False  # a method that restarts a finished row with the next sample (``generate(batch_size=)``)
    model_order = False  # a method that decodes a model revealing its tokens in an order of its own (MAR, ``generate(ordered=)``)
    coupled_walk = False  # a lossy method whose own walk verifies ``accept.Coupled``'s keyed point masses (PJD's rows)

    def __post_init__(self) -> None:
        for info in option_fields(type(self)):
            value = getattr(self, info.name)
            stored = info.check(value)
            if stored is not value:  # the one place a frozen option changes: list -> tuple, alias -> value
                object.__setattr__(self, info.name, stored)
        self.check()

    def check(self) -> None:
        """Cross-field checks (a one-line ValueError); none by default."""

    def scratch_bytes(self, layout: Any) -> int:
        """Bytes per cache row a method's round allocates beyond its cache slots and the laws of its
        ``pad`` slots (``specvis.memory.plan`` adds them): 0 unless the method holds more (PJD's drafts)."""
        return 0


def _num(v: float) -> str:
    """A bound as written: whole numbers in full (16777216, not 1.67772e+07), others as ``:g``."""
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else f"{v:g}"


def _range(info: OptionInfo | None) -> str:
    low, high = (info.low, info.high) if info is not None else (None, None)
    if low is not None and high is not None:
        return f" in {'(' if info.open_low else '['}{_num(low)}, {_num(high)}]"
    if low is not None:
        return f" {'>' if info.open_low else '>='} {_num(low)}"
    return f" <= {_num(high)}" if high is not None else ""


def members(tp: Any) -> tuple:
    return typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)


def describe(tp: Any, info: OptionInfo | None = None, plural: bool = False) -> str:
    """The values of type ``tp`` (with ``info``'s bounds and choices) in words."""
    parts = members(tp)
    if len(parts) > 1:
        words = [describe(m, info, plural) for m in parts if m is not NoneType]
        if info is not None and info.aliases:
            words.append(" or ".join(f"{k} = {_spell(v)}" for k, v in info.aliases.items()))
        return " or ".join(words + (["None"] if NoneType in parts else []))
    s = "s" if plural else ""
    if tp is NoneType:
        return "None"
    if tp is bool:
        return "True or False"
    if tp is int:
        return ("integers" if plural else "an integer") + _range(info)
    if tp is float:
        return ("finite numbers" if plural else "a finite number") + _range(info)
    if tp is str:
        if info is not None and info.choices:
            return ("names among " if plural else "one of ") + ", ".join(info.choices)
        return "strings" if plural else "a string"
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"{'non-empty lists' if plural else 'a non-empty list'} of {describe(args[0], info, True)}"
        if len(set(args)) == 1:
            return f"{'lists' if plural else 'a list'} of {len(args)} {describe(args[0], info, True)}"
        return f"{'lists' if plural else 'a list'} ({', '.join(describe(a, info) for a in args)})"
    return f"{tp.__name__}{s}" if plural else f"an {tp.__name__}"


def _conform(tp: Any, value: Any, info: OptionInfo) -> tuple[bool, Any]:
    """(whether ``value`` is of type ``tp`` within ``info``'s bounds and choices, the value as stored)."""
    parts = members(tp)
    if len(parts) > 1:
        for m in parts:
            ok, out = _conform(m, value, info)
            if ok:
                return True, out
        return False, value
    if tp is NoneType:
        return value is None, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int or tp is float:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral if tp is int else numbers.Real):
            return False, value
        if tp is float and not math.isfinite(value):
            return False, value
        above = info.low is None or (value > info.low if info.open_low else value >= info.low)
        return above and (info.high is None or value <= info.high), value
    if tp is str:
        return isinstance(value, str) and (not info.choices or value in info.choices), value
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (tuple, list)):
            return False, value
        items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        if len(items) != len(value) or not value:
            return False, value
        out = []
        for item_tp, item in zip(items, value):
            ok, stored = _conform(item_tp, item, info)
            if not ok:
                return False, value
            out.append(stored)
        out = tuple(out)
        return True, value if isinstance(value, tuple) and all(a is b for a, b in zip(out, value)) else out
    return isinstance(value, tp) and not isinstance(value, type), value  # an instance, not a class


# ---------------------------------------------------------------- text (bench specs, command-line flags)
def parse(info: OptionInfo, text: str) -> Any:
    """A spec or flag value read as the option's type: ``8`` an int, ``0.2`` a float, ``true``/``false``
    a bool, ``none`` None (where the type takes None), a tuple's items split by '/' (or ','), a path's
    indices by '.' (``2/8`` -> (2, 8), ``0/1/0.0`` -> ((0,), (1,), (0, 0))), an alias by its name.
    Text no member of the type reads is a ValueError (``ParseError``); the class's check follows."""
    if text in info.aliases:
        return info.aliases[text]
    for m in sorted(members(info.type), key=lambda m: m is str):  # a str member takes anything: last
        ok, value = _read(m, text.strip())
        if ok:
            return value
    raise ParseError(info.allowed())


class ParseError(ValueError):
    """Text that is not a value of the option's type; ``str(error)`` says what the option takes."""


def _read(tp: Any, text: str) -> tuple[bool, Any]:
    if tp is NoneType:
        return text.lower() == "none", None
    if tp is bool:
        return text.lower() in ("true", "false"), text.lower() == "true"
    if tp is int:
        return bool(re.fullmatch(r"[+-]?\d+", text)), int(text) if re.fullmatch(r"[+-]?\d+", text) else None
    if tp is float:
        try:
            return True, float(text)
        except ValueError:
            return False, None
    if tp is str:
        return True, text
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        items = [i.strip() for i in re.split(r"[/,]", text)]
        inner = args[:1] * len(items) if len(args) == 2 and args[1] is Ellipsis else args
        if len(inner) != len(items):
            return False, None
        out = []
        for item_tp, item in zip(inner, items):
            if typing.get_origin(item_tp) is tuple:  # a path: indices joined by '.'
                ok, v = _read(item_tp, item.replace(".", "/"))
            else:
                ok, v = _read(item_tp, item)
            if not ok:
                return False, None
            out.append(v)
        return True, tuple(out)
    return False, None


def spell(value: Any) -> str:
    """A value as a spec writes it (``parse`` reads it back): (2, 8) -> ``2/8``, paths ((0,), (0, 1)) ->
    ``0/0.1``, True -> ``true``, None -> ``none``."""
    return _spell(value)


def _spell(value: Any) -> str:
    if isinstance(value, tuple):
        return "/".join(".".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in value)
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    return str(value)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
