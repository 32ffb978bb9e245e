"""The generated sections of ``docs/design/api.md`` (the public contract), read off the code: the
public names (``specvis.__all__``), the signatures of the entry points, the methods and acceptance
rules (registry and option declarations), the fields of ``Sampling``, ``Stats``, ``Generation`` and
``MemoryPlan``, and every command's flags (``specvis.cli.build_parser``). Each section sits between
``<!-- api:NAME:begin -->`` and ``<!-- api:NAME:end -->``; the prose around them is written by hand.

    python scripts/api_page.py           # rewrite the generated sections of docs/design/api.md
    python scripts/api_page.py --check   # exit 1 when the committed page is not current

``tests/test_layering.py`` runs the check: a public name, signature, option, field or flag changed
without regenerating fails it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import re
import sys
import tokenize
from pathlib import Path

import specvis
from specvis import registry
from specvis.accept import WALKS
from specvis.cli import build_parser
from specvis.generate import Generation
from specvis.io import write_text
from specvis.memory import MemoryPlan
from specvis.methods import Stats
from specvis.options import option_fields, spell
from specvis.pipeline import Pipeline
from specvis.sampling import Sampling

DOC = Path(__file__).resolve().parents[1] / "docs" / "design" / "api.md"

# Fields whose declaration carries no comment: their meaning, as the page states it.
FIELD_HELP = {
    (Sampling, "temperature"): "logits divided by it; 0 = greedy (argmax), and every method is then deterministic",
    (Sampling, "top_k"): "keep the k most likely image tokens (None: all)",
    (Sampling, "top_p"): "nucleus: keep the smallest set with mass >= top_p (None: all)",
    (Sampling, "cfg_scale"): "classifier-free guidance s in u + s (c - u); 1 = no guidance (no unconditional pass)",
    (Stats, "tokens"): "image tokens generated per sample (forced structural tokens excluded)",
    (Stats, "target_forwards"): "target-model forward passes; one batched call counts once; the condition "
                                "pass that yields the first image token counts",
    (Stats, "draft_forwards"): "draft-model and EAGLE-drafter forward passes",
    (Stats, "step_compression"): "tokens / target_forwards, averaged over the samples",
    (Stats, "mean_accepted_length"): "tokens committed per target forward, averaged over the samples",
    (Stats, "wall_s"): "wall-clock seconds of the decoding loop (device synchronised)",
    (Stats, "accept_map"): "(B, H, W) LongTensor: for each image token, how many tokens the target forward "
                           "that committed it committed (the papers' 2-D acceptance heatmap)",
    (Stats, "extra"): "the method's own statistics (its recorded dataclass, e.g. PJD's `lower_row_rounds`)",
    (Generation, "stats"): "`sv.Stats` of the call",
    (MemoryPlan, "device"): "the device planned for",
    (MemoryPlan, "batch_size"): "samples decoded at once",
}


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


# Public names whose class carries no docstring of its own (a dataclass's generated one does not count).
NAME_HELP = {
    "Generation": "What a call returns: `tokens`, `stats`, `images`, `latents`, the `method` that ran and "
                  "`sv.Auto`'s `calibration` (fields below).",
}


def _first_paragraph(name: str, obj) -> str:
    """The first paragraph of the object's own docstring (not one inherited nor a dataclass's
    generated signature), else ``NAME_HELP``'s entry; neither stops the generator."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    if doc and inspect.isclass(obj) and dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
        doc = None
    doc = NAME_HELP.get(name) or (inspect.cleandoc(doc) if doc else None)
    if not doc:
        raise SystemExit(f"sv.{name} has no docstring: add one or an entry to NAME_HELP")
    return doc.split("\n\n")[0].replace("\n", " ")


def field_comments(cls) -> dict[str, str]:
    """The comment of each annotated field of class ``cls``: on its line, else the comment lines
    right above it."""
    src = inspect.getsource(cls)
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(src).readline) if tok.type == tokenize.COMMENT}
    lines = src.splitlines()
    out = {}
    for node in ast.parse(src).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            text = comments.get(node.lineno)
            if text is None:
                above, row = [], node.lineno - 1
                while row in comments and lines[row - 1].lstrip().startswith("#"):
                    above.insert(0, comments[row])
                    row -= 1
                text = " ".join(above) or None
            if text is not None:
                out[node.target.id] = text
    return out


def field_table(cls) -> list[str]:
    """``| field | type | default | meaning |`` of dataclass ``cls``; a field without a comment and
    without an entry in ``FIELD_HELP`` stops the generator (the page would state nothing)."""
    comments = field_comments(cls)
    rows = ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    for f in dataclasses.fields(cls):
        text = FIELD_HELP.get((cls, f.name), comments.get(f.name))
        if text is None:
            raise SystemExit(f"{cls.__name__}.{f.name} has no comment: add one or an entry to FIELD_HELP")
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = repr(f.default_factory())
        else:
            default = "required"
        tp = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        rows.append(f"| `{f.name}` | `{_cell(tp)}` | {_cell(default)} | {_cell(text)} |")
    return rows


def names() -> list[str]:
    rows = ["| name | kind | what it is |", "| --- | --- | --- |"]
    for name in specvis.__all__:
        obj = getattr(specvis, name)
        kind = "module" if inspect.ismodule(obj) else "class" if inspect.isclass(obj) else "function"
        rows.append(f"| `sv.{name}` | {kind} | {_cell(_first_paragraph(name, obj))} |")
    return rows


def _signature(label: str, fn, drop_self: bool = False) -> str:
    sig = inspect.signature(fn)
    if drop_self:
        sig = sig.replace(parameters=list(sig.parameters.values())[1:])
    text = re.sub(r"<function (\w+) at 0x[0-9a-f]+>", r"\1", str(sig))
    return f"{label}{text}"


def signatures() -> list[str]:
    entries = [_signature("sv.load", specvis.load), _signature("pipe", Pipeline.__call__, True),
               _signature("pipe.memory", Pipeline.memory, True), _signature("sv.generate", specvis.generate),
               _signature("sv.Sampling", Sampling)]
    return ["```python", *entries, "```"]


def _constructor(cls) -> str:
    """``sv.Name(field=default, ...)`` from the declared options (the rule field: its default rule)."""
    parts = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name not in {i.name for i in option_fields(cls)}:
            continue
        value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        parts.append(f"{f.name}={value!r}" if not isinstance(value, str) else f"{f.name}={value!r}")
    return f"sv.{cls.__name__}({', '.join(parts)})"


def methods() -> list[str]:
    rows = ["| `--method` | Python, with its defaults | lossless by default | rule walk |", "| --- | --- | --- | --- |"]
    for name in registry.available(registry.METHODS):
        cls = registry.resolve(registry.METHODS, name, "")
        rows.append(f"| `{name}` | `{_cell(_constructor(cls))}` | {'yes' if cls().lossless else 'no'} | "
                    f"{cls.walk if registry.rule_field(cls) is not None else '-'} |")
    rows += ["", "| `--accept` | Python, with its defaults | lossless | walks |", "| --- | --- | --- | --- |"]
    for name in registry.available(registry.ACCEPTANCE):
        cls = registry.resolve(registry.ACCEPTANCE, name, "")
        rows.append(f"| `{name}` | `{_cell(_constructor(cls))}` | {'yes' if cls.lossless else 'no'} | "
                    f"{', '.join(w for w in WALKS if w in cls.walks)} |")
    return rows


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def cli() -> list[str]:
    """Per command its own flags (default, help); the method and rule flags, the same in generate and
    sample, are listed once by their options in docs/guide/methods.md."""
    method = {f.name for f in registry.method_flags()} | {f"--no-{f.name[2:]}" for f in registry.method_flags()}
    out = []
    for name, sub in _subcommands(build_parser()).items():
        if not sub.add_help:  # forwards its arguments to another parser (train-drafter)
            out += [f"#### `specvis {name}`", "", "Its own flags: `specvis {name} --help`.".format(name=name), ""]
            continue
        rows, skipped = ["| flag | default | help |", "| --- | --- | --- |"], 0
        for a in sub._actions:
            if isinstance(a, argparse._HelpAction) or not a.option_strings:
                continue
            if any(o in method for o in a.option_strings):
                skipped += 1
                continue
            flags = ", ".join(f"`{o}`" for o in a.option_strings)
            switch = a.nargs == 0  # store_true / store_false / store_const: the flag is the value
            default = "" if switch or a.default is None or a.default is argparse.SUPPRESS else f"`{a.default}`"
            choices = f" ({', '.join(map(str, a.choices))})" if a.choices else ""
            rows.append(f"| {flags}{choices} | {default} | {_cell(a.help or '')} |")
        out += [f"#### `specvis {name}`", "", _cell(sub.description or ""), ""] if sub.description else \
            [f"#### `specvis {name}`", ""]
        out += rows if len(rows) > 2 else ["No flags."]
        if skipped:
            out += ["", "and every method and rule flag (docs/guide/methods.md)."]
        out.append("")
    return out


SECTIONS = {
    "names": names,
    "signatures": signatures,
    "methods": methods,
    "sampling": lambda: field_table(Sampling),
    "stats": lambda: field_table(Stats),
    "generation": lambda: field_table(Generation),
    "memory": lambda: field_table(MemoryPlan),
    "cli": cli,
}


def current(text: str) -> str:
    """``text`` with each generated section replaced by what the code says now."""
    for name, make in SECTIONS.items():
        begin, end = f"<!-- api:{name}:begin -->", f"<!-- api:{name}:end -->"
        if begin not in text or end not in text:
            raise SystemExit(f"{DOC}: the markers {begin} and {end} are missing")
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        body = "\n".join(make()).rstrip()
        text = f"{head}{begin}\n{body}\n{end}{tail}"
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/design/api.md is not current")
    a = ap.parse_args(argv)
    text = DOC.read_text()
    new = current(text)
    if a.check:
        if new != text:
            print(f"{DOC} is not current: run python scripts/api_page.py", file=sys.stderr)
            return 1
        print(f"{DOC}: generated sections current")
        return 0
    write_text(DOC, new)
    print(f"wrote the generated sections of {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
