"""Names of methods and acceptance rules for the CLI and the benchmark: adding a method is one line.

A method's options are its declared fields (``specvis.options``; the rule field excepted), the option
``accept`` names its acceptance rule, and the rule's options are the rule's declared fields: the same
names in the Python API, in bench method specs (``speculative:gamma=4:accept=lantern:k=50``) and in the
JSON ``config``. A spec's or a flag's text is read as the field's type (``options.parse``, from the real
annotation). ``build_method`` rejects anything else with one line naming the key.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Protocol, runtime_checkable

from .accept import AcceptanceRule
from .checks import InputTypeError, shown
from .methods.ar import AR
from .options import NoneType, OptionInfo, Options, members, option_fields, parse, spell

METHODS = {  # CLI name -> "module:Class"
    "ar": "specvis.methods.ar:AR",
    "speculative": "specvis.methods.speculative:Speculative",
    "jacobi": "specvis.methods.jacobi:Jacobi",
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
    "coupled": "specvis.accept:Coupled",
}

ACCEPT = "accept"  # the option naming a method's acceptance rule (its field of type AcceptanceRule)


def resolve(table: dict[str, str], name: str, what: str):
    """The class registered as ``name`` in ``table`` (``METHODS`` or ``ACCEPTANCE``); ValueError naming
    ``what`` when the name is unknown or its module is not importable."""
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; choose from {', '.join(table)}")
    module, cls = table[name].split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError):
        raise ValueError(f"{what} {name!r} is not available in this version of specvis") from None


def refilling_methods() -> list[str]:
    """Names of the methods that restart finished rows with the next sample (``refills``)."""
    return [name for name in available(METHODS) if resolve(METHODS, name, "method").refills]


def available(table: dict[str, str]) -> list[str]:
    out = []
    for name in table:
        try:
            resolve(table, name, "")
            out.append(name)
        except ValueError:
            pass
    return out


def rule_field(cls) -> OptionInfo | None:
    """The field of method class ``cls`` that holds its acceptance rule, or None."""
    return next((i for i in option_fields(cls) if i.type is AcceptanceRule), None)


def options_of(cls) -> dict[str, OptionInfo]:
    """The options of a method or rule class by name (the rule field excepted)."""
    return {i.name: i for i in option_fields(cls) if i.type is not AcceptanceRule}


def option_names(cls) -> list[str]:
    """The options of a method or rule class: its declared fields, the method's rule field excepted."""
    return list(options_of(cls))


def _rules() -> dict[str, type]:
    return {r: resolve(ACCEPTANCE, r, "") for r in available(ACCEPTANCE)}


def _listing(cls, spell_key: Callable[[str], str | None]) -> str:
    """``gamma, accept, and the acceptance rule's (exact: none; lantern: k, delta, metric, budget)``."""
    def names(keys):
        return ", ".join(s for s in map(spell_key, keys) if s) or "none"

    if rule_field(cls) is None:
        return names(option_names(cls))
    rules = "; ".join(f"{r}: {names(option_names(rule))}" for r, rule in _rules().items())
    return f"{names([*option_names(cls), ACCEPT])}, and the acceptance rule's ({rules})"


def _takes_none_text(info: OptionInfo | None) -> bool:
    """Whether the text "none" is a value of the option (a str or an optional field) rather than "the default"."""
    return info is not None and any(m in (str, NoneType) for m in members(info.type))


def build_method(name: str, options: dict[str, Any], acceptance: str | None = None, *,
                 spell: Callable[[str], str | None] = str):
    """The method ``name`` configured by ``options``: its field names, ``accept`` (the rule's name)
    and the rule's field names. A value is text (a spec's or a flag's, read as the field's type) or a
    Python value (checked by the class); a None value means the default, and so does the text "none"
    except for a field that takes a string or None, where it is a value (``coupling=none``). ``acceptance``:
    the rule of a method that takes one when ``options`` names none (default: the method's default rule,
    ``Exact``, or ``Coupled`` under keyed noise); methods without a rule ignore it.

    A key that is not an option of the method or of its rule is a ValueError naming it (as ``spell``
    writes it: the CLI passes its flag names), and so is naming a rule for a method without one."""
    cls = resolve(METHODS, name, "method")
    holder = rule_field(cls)
    named = None if options.get(ACCEPT) == "none" else options.get(ACCEPT)
    if named is not None and holder is None:
        raise ValueError(f"method {name} has no option {spell(ACCEPT)!r} (it takes no acceptance rule); "
                         f"options: {_listing(cls, spell)}")
    rule_name = named or acceptance or "exact"
    rule = resolve(ACCEPTANCE, rule_name, "acceptance rule") if holder is not None else None
    own, theirs = options_of(cls), options_of(rule) if rule else {}
    kw = {k: v for k, v in options.items()
          if k != ACCEPT and v is not None and (v != "none" or _takes_none_text(own.get(k) or theirs.get(k)))}
    for key in [k for k in kw if k not in own and k not in theirs]:
        owners = [r for r, other in _rules().items() if key in option_names(other)] if rule else []
        if owners:
            raise ValueError(f"method {name} has no option {spell(key)!r} with acceptance rule {rule_name}; "
                             f"it is an option of rule {' and '.join(owners)} (set {spell(ACCEPT)}={owners[0]})")
        raise ValueError(f"method {name} has no option {spell(key)!r}; options: {_listing(cls, spell)}")
    method_kw = {k: _typed(own[k], v, spell) for k, v in kw.items() if k in own}
    if rule is not None and (named or acceptance):  # none named: the field's default (``accept.default_rule``)
        method_kw[holder.name] = rule(**{k: _typed(theirs[k], v, spell) for k, v in kw.items() if k in theirs})
    return cls(**method_kw)


def _typed(info: OptionInfo, value: Any, spell_key: Callable[[str], str | None]) -> Any:
    """A spec's or flag's text read as the option's type (``options.parse``) and checked against its
    declaration; other values as given (the class checks them). Text that is not a value of the option is
    a ValueError naming the option as ``spell_key`` writes it (a spec key or a flag): ``gamma=true`` is not
    gamma 1, ``delta=1.5`` not an integer, ``--lantern-delta inf`` not finite."""
    if not isinstance(value, str):
        return value
    try:
        return info.check(parse(info, value))
    except ValueError:  # ParseError included
        raise ValueError(f"method option {spell_key(info.name) or info.name} must be {info.allowed()}, "
                         f"got {value!r}") from None


def parse_method_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``"sjd:window=8:init=horizontal-sample"`` -> ("sjd", {"window": "8", "init": "horizontal-sample"}):
    the values stay text, read as their fields' types by ``build_method``. Only the syntax is checked here."""
    name, *pairs = spec.strip().split(":")
    options: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"method option {pair!r} in {spec!r} must look like key=value")
        key, value = pair.split("=", 1)
        key = key.strip().replace("-", "_")
        if key in options:
            raise ValueError(f"method option {key!r} is given twice in {spec!r}")
        options[key] = value.strip()
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
    rule = method.acceptance
    for obj in (method, rule):
        if obj is None:
            continue
        if obj is rule and rule.name != "exact":
            parts.append(f"{ACCEPT}={rule.name}")
        for info in options_of(type(obj)).values():
            value = getattr(obj, info.name)
            if value != info.default:
                parts.append(f"{info.name}={spell(value)}")
    return ":".join(parts)


def describe(method) -> tuple[str, dict[str, Any], str]:
    """(name, config without the rule, rule name) of a method instance, for reports."""
    config = {}
    for f in dataclasses.fields(method):
        if f.name == "acceptance":
            continue
        v = getattr(method, f.name)
        config[f.name] = [list(x) if isinstance(x, tuple) else x for x in v] if isinstance(v, tuple) else v
    rule = method.acceptance
    rule_name = rule.name if rule is not None else "none"
    if isinstance(rule, Options) and dataclasses.fields(rule):
        config["acceptance_config"] = dataclasses.asdict(rule)
    return method.name, config, rule_name


@runtime_checkable
class MethodContract(Protocol):
    """What ``specvis.generate`` calls on a method (methods/base.py: the loop contract)."""

    name: str
    lossless: bool
    acceptance: Any  # its AcceptanceRule, or None
    pad: int

    def decode(self, ctx) -> None: ...


def method_argument(value: Any, what: str = "method"):
    """A call's method: None means ``sv.AR()``; a string is a method name or bench spec
    (``"sjd"``, ``"sjd:window=8:coupling=maximal"``, as ``--method`` takes); anything else must be a
    method instance (a class of ``METHODS``, or one that follows ``MethodContract``)."""
    if value is None:
        return AR()
    if isinstance(value, str):
        return method_from_spec(value)
    if isinstance(value, type):
        raise InputTypeError(f"{what} must be a method instance such as sv.SJD() (not the class {value.__name__}) "
                             f"or one of {', '.join(METHODS)}")
    if not isinstance(value, MethodContract):
        raise InputTypeError(f"{what} must be a method such as sv.SJD(window=16) or a name/spec such as "
                             f"'sjd:window=16' (one of {', '.join(METHODS)}), got {shown(value)}")
    return value


@dataclasses.dataclass(frozen=True)
class Flag:
    """One command-line flag of the method options: the spec key it sets (the field name, ``accept``
    for the rule field), its name(s) and the (registry name, option) pairs it serves."""

    key: str
    name: str  # "--tree-top-k"; a bool field that defaults to True is set off by "--no-<flag>"
    owners: tuple[tuple[str, OptionInfo], ...]

    @property
    def dest(self) -> str:
        return "method_opt_" + self.key

    @property
    def boolean(self) -> bool:
        return all(set(members(info.type)) <= {bool, NoneType} for _, info in self.owners)


def method_flags() -> list[Flag]:
    """The flags of every option of every method and rule (``METHODS``, ``ACCEPTANCE``), one per spec
    key, in the order the registry lists them: the flag's name is the field's ``flag`` metadata (the
    field name with "_" -> "-" unless it says otherwise), ``accept`` for a method's rule field. A key
    with two flag names, or a flag name with two keys, is an error of the declarations (TypeError)."""
    by_key: dict[str, list[tuple[str, OptionInfo]]] = {}
    flag_of: dict[str, str] = {}
    for table in (METHODS, ACCEPTANCE):
        for name in available(table):
            for info in option_fields(resolve(table, name, "")):
                key = ACCEPT if info.type is AcceptanceRule else info.name
                flag = ACCEPT if key == ACCEPT else info.flag
                if flag_of.setdefault(key, flag) != flag:
                    raise TypeError(f"option {key!r} has two flags: --{flag_of[key]} and --{flag}")
                by_key.setdefault(key, []).append((name, info))
    names = list(flag_of.values())
    clash = {n for n in names if names.count(n) > 1}
    if clash:
        raise TypeError(f"flag --{sorted(clash)[0]} sets two options")
    out = []
    for key, owners in by_key.items():
        flag = Flag(key, "", tuple(owners))
        off = flag.boolean and all(info.default is True for _, info in owners)
        out.append(dataclasses.replace(flag, name=f"--{'no-' if off else ''}{flag_of[key]}"))
    return out
