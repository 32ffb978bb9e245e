"""Names of methods and acceptance rules for the CLI and the benchmark: adding a method is one line.

A method's options are its dataclass's fields (``acceptance`` excepted), the option ``accept`` names
its acceptance rule, and the rule's options are the rule's dataclass fields: the same names in the
Python API, in bench method specs (``speculative:gamma=4:accept=lantern:k=50``) and in the JSON
``config``. ``build_method`` rejects anything else with one line naming the key.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
from typing import Any, Callable

METHODS = {  # CLI name -> "module:Class"
    "ar": "specvis.methods.ar:AR",
    "speculative": "specvis.methods.speculative:Speculative",
    "jacobi": "specvis.methods.sjd:Jacobi",
    "sjd": "specvis.methods.sjd:SJD",
    "eagle": "specvis.methods.eagle:EagleTree",
    "adt": "specvis.methods.adt:ADTTree",
    "static-tree": "specvis.methods.static_tree:StaticTree",
    "cspd": "specvis.methods.cspd:CSpD",
    "zipar": "specvis.methods.zipar:ZipAR",
    "pjd": "specvis.methods.pjd:PJD",
    "auto": "specvis.methods.auto:Auto",
}

ACCEPTANCE = {
    "exact": "specvis.accept:Exact",
    "lantern": "specvis.lantern:Lantern",
    "gsd": "specvis.gsd:GSD",
}

ACCEPT = "accept"  # the option naming a method's acceptance rule (the method's field ``acceptance``)


def _resolve(table: dict[str, str], name: str, what: str):
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; choose from {', '.join(table)}")
    module, cls = table[name].split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError):
        raise ValueError(f"{what} {name!r} is not available in this version of specvis") from None


def available(table: dict[str, str]) -> list[str]:
    out = []
    for name in table:
        try:
            _resolve(table, name, "")
            out.append(name)
        except ValueError:
            pass
    return out


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def option_names(cls) -> list[str]:
    """The options of a method or rule class: its init fields, the method's ``acceptance`` excepted."""
    return [f.name for f in dataclasses.fields(cls) if f.init and f.name != "acceptance"]


def _rules() -> dict[str, type]:
    return {r: _resolve(ACCEPTANCE, r, "") for r in available(ACCEPTANCE)}


def _listing(cls, spell: Callable[[str], str | None]) -> str:
    """``gamma, accept, and the acceptance rule's (exact: none; lantern: k, delta, metric, budget)``."""
    def names(keys):
        return ", ".join(s for s in map(spell, keys) if s) or "none"

    if "acceptance" not in _fields(cls):
        return names(option_names(cls))
    rules = "; ".join(f"{r}: {names(option_names(rule))}" for r, rule in _rules().items())
    return f"{names([*option_names(cls), ACCEPT])}, and the acceptance rule's ({rules})"


def build_method(name: str, options: dict[str, Any], acceptance: str | None = None, *,
                 spell: Callable[[str], str | None] = str):
    """The method ``name`` configured by ``options``: its field names, ``accept`` (the rule's name)
    and the rule's field names; a None value means the default, and so does the string "none" except
    for a field with a string default, where it is a value (``coupling=none``). ``acceptance``: the rule of a method
    that takes one when ``options`` names none (default exact); methods without a rule ignore it.

    A key that is not an option of the method or of its rule is a ValueError naming it (as ``spell``
    writes it: the CLI passes its flag names), and so is naming a rule for a method without one."""
    cls = _resolve(METHODS, name, "method")
    takes_rule = "acceptance" in _fields(cls)
    named = None if options.get(ACCEPT) == "none" else options.get(ACCEPT)
    if named is not None and not takes_rule:
        raise ValueError(f"method {name} has no option {spell(ACCEPT)!r} (it takes no acceptance rule); "
                         f"options: {_listing(cls, spell)}")
    rule_name = named or acceptance or "exact"
    rule = _resolve(ACCEPTANCE, rule_name, "acceptance rule") if takes_rule else None
    kw = {k: v for k, v in options.items()
          if k != ACCEPT and v is not None and (v != "none" or _str_field(cls, k) or _str_field(rule, k))}
    own, theirs = set(option_names(cls)), set(option_names(rule)) if rule else set()
    for key in [k for k in kw if k not in own | theirs]:
        owners = [r for r, other in _rules().items() if key in option_names(other)] if rule else []
        if owners:
            raise ValueError(f"method {name} has no option {spell(key)!r} with acceptance rule {rule_name}; "
                             f"it is an option of rule {' and '.join(owners)} (set {spell(ACCEPT)}={owners[0]})")
        raise ValueError(f"method {name} has no option {spell(key)!r}; options: {_listing(cls, spell)}")
    method_kw = _typed(cls, {k: v for k, v in kw.items() if k in own}, spell)
    if rule is not None:
        method_kw["acceptance"] = rule(**_typed(rule, {k: v for k, v in kw.items() if k in theirs}, spell))
    return cls(**method_kw)


def _typed(cls, options: dict[str, Any], spell: Callable[[str], str | None] = str) -> dict[str, Any]:
    """``options`` with each tuple field's spec or flag text read as its tuple (``_sequence``); the nesting
    is read off the field's annotation: 1 (``depth_range: tuple[int, int]``) or 2 (``StaticTree.tree``'s
    paths, ``tuple[tuple[int, ...], ...]``). A value whose type is not the field's scalar annotation
    (int, float, bool) is a ValueError naming the option as ``spell`` writes it (``_check_scalar``)."""
    hints = {f.name: f.type if isinstance(f.type, str) else repr(f.type) for f in dataclasses.fields(cls)}
    out = {}
    for k, v in options.items():
        out[k] = _sequence(v, 2 if "tuple[tuple[" in hints[k] else int("tuple" in hints[k]))
        _check_scalar(spell(k) or k, out[k], hints[k])
    return out


def _check_scalar(name: str, value: Any, hint: str) -> None:
    """A spec or flag value against its field's annotation (``int``, ``float``, ``bool``, optionally
    ``| None``): ``gamma=true`` is not gamma 1, ``delta=1.5`` not an integer, ``lam=inf`` not finite."""
    kinds = {part.strip() for part in hint.split("|")}
    if "None" in kinds and value is None:
        return
    if kinds <= {"int", "None"} and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"method option {name} must be an integer, got {value!r}")
    if kinds <= {"float", "None"} and (isinstance(value, bool) or not isinstance(value, (int, float))
                                       or not math.isfinite(value)):
        raise ValueError(f"method option {name} must be a finite number, got {value!r}")
    if kinds <= {"bool", "None"} and not isinstance(value, bool):
        raise ValueError(f"method option {name} must be true or false, got {value!r}")


def _sequence(value: Any, depth: int) -> Any:
    """A spec or flag value of a tuple field as the tuple: items separated by '/' (or ','), a path's
    indices by '.': ``2/8`` -> (2, 8), ``0/1/0.0`` -> ((0,), (1,), (0, 0)), ``4`` -> (4,). Anything else
    (a preset name, a word, a tuple already) is returned as it is, for the field's own check to accept or refuse."""
    if depth == 0 or isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return value
    items = [i.strip() for i in re.split(r"[/,]", str(value))]
    parts = [i.split(".") if depth == 2 else [i] for i in items]
    if not all(n.isdigit() for part in parts for n in part):
        return value
    return tuple(tuple(map(int, part)) if depth == 2 else int(part[0]) for part in parts)


def _str_field(cls, key: str) -> bool:
    """Whether ``key`` is a field of dataclass ``cls`` with a string default, where "none" is a value
    (``SJD.coupling``) rather than "the default"."""
    return cls is not None and any(f.name == key and isinstance(f.default, str) for f in dataclasses.fields(cls))


def parse_method_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"sjd:window=8:init=horizontal-sample"`` -> ("sjd", {"window": 8, "init": "horizontal-sample"}).
    Only the syntax is checked here; ``build_method`` checks the keys."""
    name, *pairs = spec.strip().split(":")
    options: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"method option {pair!r} in {spec!r} must look like key=value")
        key, value = pair.split("=", 1)
        key = key.strip().replace("-", "_")
        if key in options:
            raise ValueError(f"method option {key!r} is given twice in {spec!r}")
        options[key] = _literal(value)
    return name, options


def method_from_spec(spec: str, acceptance: str | None = None):
    """The method of a bench spec; every key must be one of its options (``build_method``)."""
    name, opts = parse_method_spec(spec)
    return build_method(name, opts, acceptance)


def spec_of(method) -> str:
    """The bench spec of a method instance, its fields that differ from their defaults only:
    ``SJD(window=8, init="vertical-sample")`` -> ``sjd:window=8:init=vertical-sample`` (``method_from_spec``
    gives the method back)."""
    parts = [method.name]
    for obj in (method, getattr(method, "acceptance", None)):
        if obj is None:
            continue
        if obj is not method and obj.name != "exact":
            parts.append(f"{ACCEPT}={obj.name}")
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if f.init and f.name != "acceptance" and v != default:
                parts.append(f"{f.name}={_spell(v)}")
    return ":".join(parts)


def _spell(value: Any) -> str:
    """A field's value as a spec writes it (``_sequence`` reads it back): (2, 8) -> ``2/8``, paths
    ((0,), (0, 1)) -> ``0/0.1``."""
    if isinstance(value, tuple):
        return "/".join(".".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in value)
    return str(value)


def _literal(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": "none"}.get(text.lower(), text)


def describe(method) -> tuple[str, dict[str, Any], str]:
    """(name, config without the rule, rule name) of a method instance, for reports."""
    config = {}
    for f in dataclasses.fields(method):
        if f.name == "acceptance":
            continue
        v = getattr(method, f.name)
        config[f.name] = [list(x) if isinstance(x, tuple) else x for x in v] if isinstance(v, tuple) else v
    rule = getattr(method, "acceptance", None)
    rule_name = rule.name if rule is not None else "none"
    if rule is not None and dataclasses.is_dataclass(rule) and dataclasses.fields(rule):
        config["acceptance_config"] = dataclasses.asdict(rule)
    return method.name, config, rule_name
