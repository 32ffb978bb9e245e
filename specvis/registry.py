"""Names of methods and acceptance rules for the CLI and the benchmark: adding a method is one line."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

METHODS = {  # CLI name -> "module:Class"
    "ar": "specvis.methods.ar:AR",
    "speculative": "specvis.methods.speculative:Speculative",
    "jacobi": "specvis.methods.sjd:Jacobi",
    "sjd": "specvis.methods.sjd:SJD",
    "eagle": "specvis.methods.tree:EagleTree",
    "adt": "specvis.methods.tree:ADTTree",
    "cspd": "specvis.methods.cspd:CSpD",
}

ACCEPTANCE = {
    "exact": "specvis.accept:Exact",
    "lantern": "specvis.lantern:Lantern",
}


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


def build_acceptance(name: str, options: dict[str, Any]):
    cls = _resolve(ACCEPTANCE, name, "acceptance rule")
    return cls(**{k: v for k, v in options.items() if k in _fields(cls) and v is not None})


def build_method(name: str, options: dict[str, Any], acceptance: str = "exact"):
    """The method ``name`` with every option that names one of its fields (None = default)."""
    cls = _resolve(METHODS, name, "method")
    names = _fields(cls)
    kw = {k: v for k, v in options.items() if k in names and v is not None}
    if "acceptance" in names:
        kw["acceptance"] = build_acceptance(acceptance, options)
    elif acceptance != "exact":
        raise ValueError(f"method {name!r} takes no acceptance rule (got --accept {acceptance})")
    return cls(**kw)


def parse_method_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"sjd:window=8:init=horizontal-sample"`` -> ("sjd", {"window": 8, "init": "horizontal-sample"})."""
    name, *pairs = spec.strip().split(":")
    options: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"method option {pair!r} in {spec!r} must look like key=value")
        key, value = pair.split("=", 1)
        options[key.replace("-", "_")] = _literal(value)
    return name, options


def _literal(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def describe(method) -> tuple[str, dict[str, Any], str]:
    """(name, config without the rule, rule name) of a method instance, for reports."""
    config = {}
    for f in dataclasses.fields(method):
        if f.name == "acceptance":
            continue
        v = getattr(method, f.name)
        config[f.name] = list(v) if isinstance(v, tuple) else v
    rule = getattr(method, "acceptance", None)
    rule_name = rule.name if rule is not None else "none"
    if rule is not None and dataclasses.is_dataclass(rule) and dataclasses.fields(rule):
        config["acceptance_config"] = dataclasses.asdict(rule)
    return method.name, config, rule_name
