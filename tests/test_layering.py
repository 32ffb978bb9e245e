"""The house's gauges, read off the source with ``ast``; every failure lists each violation
as file:line.

- Imports point down: no import cycle among specvis's modules, counting imports inside functions
  (they run too) and the package ``__init__`` a submodule import runs first. The layers, top to
  bottom: cli, commands, demo > sample > bench > zoo > pipeline > families > tune > generate > methods, cost >
  rules (accept, lantern, gsd), registry's tables, sampling, models, diffusion > options, checks, io.
  The pipeline asks its model's family; no family module imports the pipeline, even through another.
- No ``hasattr(`` nor ``getattr(x, "name", default)`` probing of models, rules or methods in
  specvis/methods/, specvis/generate.py, specvis/pipeline.py, models/base.py, the families' base, MAR's,
  the embedded bundles' and the zoo: capabilities are declared.
- No method file over 300 lines; specvis/pipeline.py at most 250; README.md at most 200 lines;
  specvis/cli.py at most 400 lines, and no function over 60 lines in the doors (cli.py, commands/,
  bench/, sample.py, job.py, outputs.py).
- No private name crosses a module: no ``from x import _name`` nor ``module._name`` of a specvis
  module, and no ``obj._name`` in one module of a private attribute another module defines.
- docs/design/api.md (the public contract) says what the code does: its generated sections are what
  scripts/api_page.py reads off the code now.
- The CLI, the demo and the model zoo ask a pipeline what its model can do (``conditioning``,
  ``tokens``, ``kv_cache``, ``num_iter``), never ``isinstance`` of a pipeline class; there is one
  pipeline class (no class in specvis subclasses ``Pipeline``): what differs is the model's family.
- A drafter is a proposer: the decode loops (``ctx.run(round)``) are the shared ones of
  specvis/methods/proposer.py (chains, 2-D rows) and the few kinds of round that are not chains (trees,
  MAR's orders, continuous drafts); no method writes its own; generate.py asks a method what it decodes
  (``model_order``), never ``isinstance`` of a method class; the adding-a-method page's drafter is one
  class of at most 40 lines.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "specvis"



def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def imports(name: str) -> dict[str, int]:
    """Modules of specvis that importing ``name`` runs, with the line of each (first) import: every
    ``import``/``from`` statement of the file, at module level or inside functions, and each subpackage
    ``__init__`` above an imported module (the root package excepted: it is the facade over every layer)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
            targets = subs + ([base] if len(subs) < len(node.names) else [])
        else:
            continue
        for target in targets:
            if not target.startswith("specvis"):
                continue
            while target not in MODULES:
                target = target.rpartition(".")[0]
            parts = target.split(".")
            for i in range(2, len(parts)):  # subpackages above the target run their __init__ first
                parent = ".".join(parts[:i])
                if not name.startswith(parent + ".") and parent != name:
                    out.setdefault(parent, node.lineno)
            if target != name:
                out.setdefault(target, node.lineno)
    return out


GRAPH = {name: imports(name) for name in MODULES}


def cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    return out


def describe(component: list[str]) -> str:
    edges = [f"{MODULES[a].relative_to(ROOT)}:{line} imports {b}" for a in component
             for b, line in GRAPH[a].items() if b in component]
    return f"cycle among {', '.join(component)}: " + "; ".join(edges)


def test_no_import_cycles():
    """Catches an upward import anywhere in specvis (a function-local one included), e.g. the
    method-choosing code importing ``generate`` from below it, as methods/auto.py did (30 cycles), or a
    family module importing its package's ``detect`` (families/llamagen_t2i.py did)."""
    bad = [describe(c) for c in cycles()]
    assert not bad, "\n".join(bad)


def test_the_graph_sees_function_local_and_package_imports():
    """The parser's own check: an import inside a function counts, and so does the package ``__init__``
    a submodule import runs (bench.runner reads ``__version__`` from the root; the pipeline imports
    the families' package through ``families.prompts``)."""
    assert "specvis.tune" in GRAPH["specvis.families.kv_cache"] and "specvis.registry" in GRAPH["specvis.generate"]
    assert "specvis.families" in GRAPH["specvis.pipeline"]
    local = [n for n in ast.walk(ast.parse(MODULES["specvis.zoo"].read_text()))
             if isinstance(n, ast.FunctionDef) and any(isinstance(i, ast.ImportFrom) for i in ast.walk(n))]
    assert local and "specvis.families" in GRAPH["specvis.zoo"]  # zoo imports families inside functions
    assert "specvis.bench" in GRAPH["specvis.commands.bench"] or "specvis.bench.runner" in GRAPH["specvis.commands.bench"]


@pytest.mark.parametrize("low,above", [
    ("specvis.options", set(MODULES)),  # imports nothing of specvis
    ("specvis.checks", set(MODULES)),
    ("specvis.tune", {"specvis.pipeline", "specvis.zoo", "specvis.families", "specvis.bench", "specvis.sample",
                      "specvis.cli", "specvis.demo"}),
    ("specvis.cost", {"specvis.tune", "specvis.generate", "specvis.pipeline", "specvis.bench", "specvis.zoo"}),
    ("specvis.registry", {"specvis.generate", "specvis.tune", "specvis.pipeline", "specvis.cli"}),
])
def test_low_modules_import_nothing_above_them(low, above):
    """The bottom of the house stays at the bottom: ``options`` (the declarations every method and rule
    uses) and ``checks`` import nothing of specvis; the tuner, the cost curve and the registry nothing
    of the layers above them (subpackages included)."""
    bad = sorted(m for m in reach(low) if any(m == a or m.startswith(a + ".") for a in above) and m != low)
    assert not bad, f"{low} reaches {', '.join(bad)}"


def reach(name: str) -> set[str]:
    """Every module that importing ``name`` runs, through any chain of imports."""
    reached, todo = set(), [name]
    while todo:
        for m in GRAPH[todo.pop()]:
            if m not in reached:
                reached.add(m)
                todo.append(m)
    return reached


FAMILY_MODULES = sorted(n for n in MODULES if n == "specvis.families" or n.startswith("specvis.families."))


@pytest.mark.parametrize("name", FAMILY_MODULES)
def test_no_family_imports_the_pipeline(name):
    """The pipeline asks its model's family (``Family.condition``, ``run``, ...), and a family never
    asks back: no module under specvis/families imports ``specvis.pipeline`` (nor the zoo, the loader
    above it), directly, inside a function or through another module. Catches families/base.py taking
    its KV-cache defaults and ``Request`` from the pipeline, and a family building its ``Pipeline``."""
    bad = sorted(m for m in reach(name) if m in ("specvis.pipeline", "specvis.zoo"))
    assert not bad, f"{MODULES[name].relative_to(ROOT)} reaches {', '.join(bad)}"


# ---------------------------------------------------------------- probing
PROBED = [*sorted((PKG / "methods").glob("*.py")), PKG / "generate.py", PKG / "pipeline.py", PKG / "models" / "base.py",
          PKG / "families" / "base.py", PKG / "families" / "embedded.py", PKG / "families" / "mar.py", PKG / "zoo.py"]


def probes(path: Path, root: Path = ROOT) -> list[str]:
    """Each ``hasattr(...)`` and each ``getattr(obj, name, default)`` call in ``path``, as file:line: code."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
                node.func.id == "hasattr" or (node.func.id == "getattr" and len(node.args) + len(node.keywords) >= 3)):
            out.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return sorted(out, key=lambda s: int(s.split(":")[1]))


@pytest.mark.parametrize("path", PROBED, ids=lambda p: str(p.relative_to(PKG)))
def test_no_probing(path):
    """Capabilities of models, rules and methods are declared (``AcceptanceRule.needs``/``walks``, a
    method's ``walk``), never probed: catches ``hasattr(rule, "sibling")`` and its kind."""
    found = probes(path)
    assert not found, "\n".join(found)


def test_the_probe_finder_finds_probes(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("def f(m, name):\n    a = hasattr(m, 'x')\n    b = getattr(m, 'y', None)\n    return getattr(m, name)\n")
    assert probes(src, tmp_path) == ["x.py:2: hasattr(m, 'x')", "x.py:3: getattr(m, 'y', None)"]


# ---------------------------------------------------------------- pipeline kinds
ASKERS = [PKG / "cli.py", *sorted((PKG / "commands").glob("*.py")), PKG / "demo.py", PKG / "zoo.py",
          PKG / "bench" / "runner.py"]


def pipeline_isinstance(path: Path, root: Path = ROOT) -> list[str]:
    """Each ``isinstance(x, ...)`` whose class (or one of a tuple of classes) is named ``...Pipeline``,
    as file:line: code."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
                and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            names = [k.id if isinstance(k, ast.Name) else k.attr if isinstance(k, ast.Attribute) else "" for k in kinds]
            if any(n.endswith("Pipeline") for n in names):
                out.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return out


@pytest.mark.parametrize("path", ASKERS, ids=lambda p: str(p.relative_to(PKG)))
def test_callers_ask_the_pipeline(path):
    """What a model can do is declared on its pipeline (``Pipeline.conditioning``/``tokens``/
    ``kv_cache``/``num_iter``): catches ``isinstance(pipe, TextPipeline)`` and its kind."""
    found = pipeline_isinstance(path)
    assert not found, "\n".join(found)


def test_the_pipeline_isinstance_finder_finds_them(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("def f(p, m):\n    a = isinstance(p, TextPipeline)\n    b = isinstance(p, (pl.ContinuousPipeline, int))\n"
                   "    return isinstance(m, torch.nn.Module)\n")
    assert pipeline_isinstance(src, tmp_path) == ["x.py:2: isinstance(p, TextPipeline)",
                                                  "x.py:3: isinstance(p, (pl.ContinuousPipeline, int))"]


def pipeline_subclasses(path: Path, root: Path = ROOT) -> list[str]:
    """Each class statement with a base named ``...Pipeline``, as file:line: class Name."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ClassDef):
            names = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]
            if any(n.endswith("Pipeline") for n in names):
                out.append(f"{path.relative_to(root)}:{node.lineno}: class {node.name}")
    return out


def test_one_pipeline_class():
    """Every model runs in the one ``Pipeline``; what differs is its family (``families.base.Family``):
    catches a ``class MARPipeline(Pipeline)`` (or ``TextPipeline``, ``ContinuousPipeline``) anywhere in specvis."""
    found = [line for path in MODULES.values() for line in pipeline_subclasses(path)]
    assert not found, "\n".join(found)


def test_the_pipeline_subclass_finder_finds_them(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("class A(Pipeline):\n    pass\nclass B(pl.TextPipeline, object):\n    pass\nclass C(Family):\n    pass\n")
    assert pipeline_subclasses(src, tmp_path) == ["x.py:1: class A", "x.py:3: class B"]


# ---------------------------------------------------------------- sizes


@pytest.mark.parametrize("path", sorted((PKG / "methods").glob("*.py")), ids=lambda p: str(p.relative_to(PKG)))
def test_method_files_are_small(path):
    n = len(path.read_text().splitlines())
    assert n <= 300, f"{path.relative_to(ROOT)}:{n}: {n} lines (at most 300)"


DOORS = [PKG / "cli.py", *sorted((PKG / "commands").glob("*.py")), *sorted((PKG / "bench").glob("*.py")),
         PKG / "sample.py", PKG / "job.py", PKG / "outputs.py"]


def long_functions(path: Path, limit: int = 60, root: Path = ROOT) -> list[str]:
    """``file:line: name (n lines)`` of each function (method, nested function) of ``path`` over
    ``limit`` lines, from its ``def`` to its last line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                out.append(f"{path.relative_to(root)}:{node.lineno}: {node.name} ({n} lines)")
    return out


@pytest.mark.parametrize("path", DOORS, ids=lambda p: str(p.relative_to(PKG)))
def test_door_functions_are_short(path):
    """The doors (the CLI and its commands, the bench, the sampler, the job and the outputs): no
    function over 60 lines."""
    bad = long_functions(path)
    assert not bad, "\n".join(bad)


def test_the_long_function_finder_finds_them(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("def short():\n    return 1\n\n\nclass A:\n    def long(self):\n" + "        x = 1\n" * 60)
    assert long_functions(src, root=tmp_path) == ["x.py:6: long (61 lines)"]


def test_cli_is_short():
    n = len((PKG / "cli.py").read_text().splitlines())
    assert n <= 400, f"specvis/cli.py:{n}: {n} lines (at most 400)"


def test_pipeline_is_small():
    """``specvis/pipeline.py`` keeps ``Pipeline`` and its call; prompt handling (``families.prompts``), the
    KV-cache defaults (``families.kv_cache``) and the stand-in tokenizers (``specvis.zoo``) live elsewhere."""
    n = len((PKG / "pipeline.py").read_text().splitlines())
    assert n <= 250, f"specvis/pipeline.py:{n}: {n} lines (at most 250)"


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= 200, f"README.md:{n}: {n} lines (at most 200)"


# ---------------------------------------------------------------- private names


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_defs(tree: ast.AST) -> set[str]:
    """The private names a module defines: functions, classes, assigned names and assigned attributes."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            out.add(n.attr)
    return {x for x in out if private(x)}


def private_crossings(paths: list[Path], root: Path = ROOT, package: str = "specvis") -> list[str]:
    """Each use in one module of a private name of another module of ``package``, as file:line: code:
    ``from m import _x``, ``m._x`` with ``m`` an imported module of the package, and ``obj._x`` (not
    ``self``/``cls``) where ``_x`` is defined in another module and not in this one."""
    trees = {p: ast.parse(p.read_text(), str(p)) for p in paths}
    defs = {p: private_defs(t) for p, t in trees.items()}
    elsewhere = {p: set().union(*(d for q, d in defs.items() if q != p)) for p in paths}
    out = []
    for path, tree in trees.items():
        modules = set()  # names bound to modules of the package
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith(package)):
                out += [f"{path.relative_to(root)}:{n.lineno}: {ast.unparse(n)}" for a in n.names if private(a.name)]
                modules.update(a.asname or a.name for a in n.names if not private(a.name))
            elif isinstance(n, ast.Import):
                modules.update(a.asname or a.name.split(".")[0] for a in n.names if a.name.startswith(package))
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Attribute) and private(n.attr)):
                continue
            base = n.value.id if isinstance(n.value, ast.Name) else None
            if base in ("self", "cls"):
                continue
            if base in modules or (n.attr in elsewhere[path] and n.attr not in defs[path]):
                out.append(f"{path.relative_to(root)}:{n.lineno}: {ast.unparse(n)}")
    return sorted(set(out))


def test_no_private_name_crosses_a_module():
    """A name another module needs is public (or lives with its user): catches bench/report.py importing
    cost's ``_forward_fields`` and memory.py reading ``PackedLinear._packed_key``."""
    found = private_crossings(list(MODULES.values()))
    assert not found, "\n".join(found)


def test_the_private_name_finder_finds_them(tmp_path):
    pkg = tmp_path / "specvis"
    pkg.mkdir()
    (pkg / "a.py").write_text("_X = 1\nclass A:\n    def __init__(self):\n        self._k = None\n"
                              "    def same(self, other):\n        return other._k\n")
    (pkg / "b.py").write_text("from .a import _X, A\nimport specvis.a as a\nimport torch\n"
                              "def f(o):\n    return a._X, o._k, torch._dynamo, o.__dict__\n")
    assert private_crossings([pkg / "a.py", pkg / "b.py"], tmp_path) == [
        "specvis/b.py:1: from .a import _X, A", "specvis/b.py:5: a._X", "specvis/b.py:5: o._k"]


# ---------------------------------------------------------------- the public contract


def api_page():
    spec = importlib.util.spec_from_file_location("api_page", ROOT / "scripts" / "api_page.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_api_page_is_what_the_code_says():
    """docs/design/api.md's generated sections (public names, signatures, methods and rules with their
    defaults, Sampling/Stats/Generation/MemoryPlan fields, every command's flags) are current: a
    default, field or flag changed without ``python scripts/api_page.py`` fails here."""
    page = api_page()
    text = page.DOC.read_text()
    assert page.current(text) == text, "docs/design/api.md is not current: run python scripts/api_page.py"


def test_the_api_page_check_sees_a_stale_default():
    page = api_page()
    text = page.DOC.read_text()
    stale = text.replace("`sv.Jacobi(window=16)`", "`sv.Jacobi(window=8)`")
    assert stale != text and page.current(stale) != stale


# ---------------------------------------------------------------- a drafter is a proposer
LOOPS = {"specvis/methods/proposer.py": 2,  # decode_chain (AR, speculative, SJD, Jacobi, auto), decode_rows (ZipAR, PJD)
         "specvis/methods/trees.py": 1,  # a Tree each round (EAGLE-2, ADT, static trees)
         "specvis/methods/ordered.py": 1, "specvis/methods/cspd_mar.py": 1,  # MAR's order of steps
         "specvis/methods/cspd.py": 1}  # continuous drafts, an acceptance of their own


def round_loops(path: Path, root: Path = ROOT) -> list[str]:
    """Each ``ctx.run(...)`` call (a decode loop over a round), as file:line: code."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "ctx":
            out.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_method_writes_its_own_decode_loop():
    """Every chain method (AR, speculative, SJD, Jacobi, the server's auto) runs ``decode_chain`` and both
    2-D methods ``decode_rows``: a method file that prefills and runs its own rounds (``ctx.run``) fails."""
    found = {}
    for path in MODULES.values():
        for line in round_loops(path):
            found[line.split(":")[0]] = found.get(line.split(":")[0], 0) + 1
    assert found == LOOPS, f"decode loops: {found}"


def test_the_loop_finder_finds_them(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("def f(ctx, r, o):\n    ctx.run(r)\n    o.run(r)\n    ctx.run(r, capture=False)\n")
    assert round_loops(src, tmp_path) == ["x.py:2: ctx.run(r)", "x.py:4: ctx.run(r, capture=False)"]


def method_isinstance(path: Path, root: Path = ROOT) -> list[str]:
    """Each ``isinstance(method, ...)`` naming a class other than ``Options`` (every method is one) and
    ``Auto`` (refused by name), as file:line: code."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
                and len(node.args) == 2 and isinstance(node.args[0], ast.Name) and node.args[0].id == "method":
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            if any(ast.unparse(k) not in ("Options", "Auto") for k in kinds):
                out.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_generate_asks_the_method_what_it_decodes():
    """A MAR model runs the methods that declare ``model_order``: catches ``isinstance(method, (AR, CSpD))``."""
    found = method_isinstance(PKG / "generate.py")
    assert not found, "\n".join(found)
    from specvis.registry import METHODS, available, resolve
    assert {name for name in available(METHODS) if resolve(METHODS, name, "method").model_order} == {"ar", "cspd"}


def test_the_method_isinstance_finder_finds_them(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("def f(method):\n    a = isinstance(method, (AR, CSpD))\n    b = isinstance(method, Options)\n"
                   "    return isinstance(method, m.SJD)\n")
    assert method_isinstance(src, tmp_path) == ["x.py:2: isinstance(method, (AR, CSpD))", "x.py:4: isinstance(method, m.SJD)"]


def test_the_documented_drafter_is_one_class_of_at_most_40_lines():
    """docs/design/adding-a-method.md's method file (run by tests/test_docs.py through the exactness
    harness) declares one class, decorators included at most 40 lines: a new chain drafter is that small."""
    import re
    text = (ROOT / "docs" / "design" / "adding-a-method.md").read_text()
    code = re.search(r"<!-- method-file: (\S+) -->\n```python\n(.*?)^```", text, re.S | re.M).group(2)
    classes = [n for n in ast.parse(code).body if isinstance(n, ast.ClassDef)]
    assert len(classes) == 1, [c.name for c in classes]
    first = min([classes[0].lineno, *(d.lineno for d in classes[0].decorator_list)])
    assert classes[0].end_lineno - first + 1 <= 40, f"{classes[0].name}: {classes[0].end_lineno - first + 1} lines"
