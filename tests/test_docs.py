"""The documents say what the code does: every ``specvis ...`` command fenced in README.md parses with
the CLI's own parser (and builds its methods), every relative link in README.md and docs/**/*.md
points at a file that exists, the result pages and the README's headline table are what
scripts/results_tables.py generates from the committed JSON, docs/results keeps at most 25 current
files and indexes every archived one, the method of docs/design/adding-a-method.md and the rule of
docs/design/adding-a-rule.md, each copied out of its page and registered with one line, build from a
spec and from flags and are exact by the harness (the rule where it claims to be), and every field a
bench report writes is described in docs/design/api.md.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from pathlib import Path

import pytest
from exactness import check_method

import specvis as sv
from specvis import registry
from specvis.cli import UsageError, _method, build_parser

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def fenced(text: str, langs: tuple[str, ...]) -> list[str]:
    return [body for lang, body in FENCE.findall(text) if lang.strip() in langs]


def specvis_commands(text: str) -> list[list[str]]:
    """Each ``specvis ...`` command of the fenced shell blocks (continuation lines joined, ``&&`` chains
    split, comments dropped), as its argv without the program name."""
    out = []
    for body in fenced(text, ("bash", "sh", "shell", "console", "")):
        for line in body.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                argv = shlex.split(part, comments=True)
                if argv and argv[0] == "specvis":
                    out.append(argv[1:])
    return out


README_COMMANDS = specvis_commands((ROOT / "README.md").read_text())


def test_the_readme_has_commands_to_check():
    assert len(README_COMMANDS) >= 8 and {c[0] for c in README_COMMANDS} >= {"generate", "bench", "models"}


@pytest.mark.parametrize("argv", README_COMMANDS, ids=[" ".join(c)[:60] for c in README_COMMANDS])
def test_readme_command_parses(argv):
    """The CLI's parser takes it (it refuses an unknown flag or a bad choice: ``UsageError``), and the method it
    names builds from its flags (generate, sample) or each of its specs (bench): a renamed flag or
    option in the code fails here before a user meets it."""
    try:
        args = build_parser().parse_args(argv)
    except (UsageError, SystemExit) as e:
        pytest.fail(f"specvis {' '.join(argv)}: the parser refuses it ({e})")
    if argv[0] in ("generate", "sample"):
        _method(args)
    if argv[0] == "bench" and args.methods:
        for spec in args.methods.split(","):
            registry.method_from_spec(spec)


def test_a_broken_command_is_refused():
    """The check has teeth: a misspelt flag and an unknown option are refused the way the test reads them."""
    with pytest.raises(UsageError, match="--windw"):
        build_parser().parse_args(["generate", "--windw", "8"])
    with pytest.raises(ValueError, match="window"):
        registry.method_from_spec("speculative:window=8")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every relative link outside fenced code."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:|^#", target):
                continue
            out.append((i, target))
    return out


def test_every_relative_link_resolves():
    broken = []
    for path in markdown_files():
        for line, target in links(path):
            file = target.split("#", 1)[0]
            if not (path.parent / file).exists():
                broken.append(f"{path.relative_to(ROOT)}:{line}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_link_check_sees_links():
    """The README links its picture, the result pages and the guides (the regexp reads them)."""
    targets = {t for _, t in links(ROOT / "README.md")}
    assert {"docs/img/emoji_classes.png", "docs/results/README.md", "docs/guide/methods.md"} <= targets


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_result_pages_and_headline_are_generated_from_the_json():
    """docs/results/*.md and the README's headline table are what scripts/results_tables.py makes of
    docs/results/data/ (a figure typed by hand, or a JSON changed without its page, fails here)."""
    pytest.importorskip("transformers")  # the families page imports the transformers fixtures' script
    stale = [p.relative_to(ROOT).as_posix() for p, text in script("results_tables").expected().items()
             if not p.exists() or p.read_text() != text]
    assert not stale, f"out of date: {stale}; run python scripts/results_tables.py"


def test_headline_is_the_fastest_lossless_run():
    """The headline row of a run is its fastest lossless method, AR and auto aside."""
    rt = script("results_tables")
    report = {"runs": [
        {"method": "ar", "config": {}, "acceptance": "none", "lossless": True, "speedup": 1.0},
        {"method": "auto", "config": {}, "acceptance": "none", "lossless": True, "speedup": 3.0},
        {"method": "sjd", "config": {"window": 8}, "acceptance": "exact", "lossless": True, "speedup": 1.2},
        {"method": "sjd", "config": {"window": 16}, "acceptance": "exact", "lossless": True, "speedup": 1.5},
        {"method": "sjd", "config": {"window": 8}, "acceptance": "lantern", "lossless": False, "speedup": 2.0}]}
    label, run, ar = rt.best_lossless(report)
    assert (label, run["speedup"], ar["method"]) == ("sjd(window=16)", 1.5, "ar")


def test_results_keep_at_most_25_current_files_and_index_the_archive():
    current = [p for p in RESULTS.iterdir() if p.is_file()]
    assert len(current) <= 25, f"docs/results holds {len(current)} current files (at most 25): {sorted(p.name for p in current)}"
    index = (RESULTS / "archive" / "README.md").read_text()
    listed = set(re.findall(r"\[([^\]]+)\]\(", index))
    missing = []
    for p in sorted((RESULTS / "archive").iterdir()):
        if p.name == "README.md" or p.name.endswith(".quality.npz"):
            continue  # a run's quality observations travel with its JSON
        stem = re.sub(r"\.(json|md)$", "", p.name) + ("/" if p.is_dir() else "")
        if p.name not in listed and stem not in listed:
            missing.append(p.name)
    assert not missing, f"archived without an index line in docs/results/archive/README.md: {missing}"
    pages = set(re.findall(r"\]\(([^)#]+)", (RESULTS / "README.md").read_text()))
    assert {p.name for p in current if p.suffix == ".md" and p.name != "README.md"} <= pages


# ------------------------------------------------------------------------------------------ adding a method

def doc_method_file() -> tuple[str, str]:
    """(module path, code) of the method file that docs/design/adding-a-method.md shows."""
    text = (ROOT / "docs" / "design" / "adding-a-method.md").read_text()
    m = re.search(r"<!-- method-file: (\S+) -->\n```python\n(.*?)^```", text, re.S | re.M)
    assert m, "adding-a-method.md: no <!-- method-file: ... --> python block"
    return m.group(1), m.group(2)


@pytest.fixture
def row_above(tmp_path, monkeypatch):
    """The page's method, in its own module, registered by the one line the page shows."""
    path, code = doc_method_file()
    (tmp_path / Path(path).name).write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(Path(path).stem, None)
    page = (ROOT / "docs" / "design" / "adding-a-method.md").read_text()
    line = re.search(r'^\s*"([\w-]+)": "specvis\.methods\.(\w+):(\w+)",$', page, re.M)
    assert line and line.group(2) == Path(path).stem, "the page's registry line names its file"
    monkeypatch.setitem(registry.METHODS, line.group(1), f"{line.group(2)}:{line.group(3)}")
    return line.group(1)


def test_the_documented_method_is_one_file_and_one_registry_line(row_above):
    method = registry.method_from_spec(f"{row_above}:gamma=3:accept=lantern:k=4")
    assert method.gamma == 3 and method.acceptance == sv.Lantern(k=4) and not method.lossless
    flags = build_parser().parse_args(["generate", "--method", row_above, "--gamma", "5"])
    assert _method(flags).gamma == 5 and _method(flags).lossless
    with pytest.raises(ValueError, match="gamma"):
        registry.method_from_spec(f"{row_above}:gamma=0")


@pytest.mark.parametrize("noise", ["stream", "keyed"])
def test_the_documented_method_is_exact(row_above, target, noise):
    """The page's method passes the exactness harness (chi-square against the enumerated law) through the
    shared loop and verifier: with Exact (stream noise) and with Coupled (keyed noise, its default rule
    there); a method on the page that drafted at the wrong positions or kept a rejected draft fails. The
    noise is named: the harness gives each keyed sample a seed of its own only when it knows the noise."""
    method = registry.method_from_spec(f"{row_above}:gamma=2")
    assert check_method(target, method, sv.Sampling(temperature=0.9, cfg_scale=2.0, noise=noise)) > 1e-3


# ------------------------------------------------------------------------------------------ the bench report

def documented_bench_fields() -> set[str]:
    """The backticked names of docs/design/api.md's bench report section (its tables' first column and
    its sentence on the methods' own statistics)."""
    text = (ROOT / "docs" / "design" / "api.md").read_text().split("## Bench report", 1)[1]
    out, tables_seen = set(), False
    for line in text.splitlines():
        if line.startswith("|"):
            out.update(re.findall(r"`(\w+)`", line.split("|")[1]))
            tables_seen = True
        elif tables_seen:  # the sentence after the tables
            out.update(re.findall(r"`(\w+)`", line))
    return out


def test_every_bench_report_field_is_documented():
    """A small bench (AR, SJD, a tree method; with the cost curve) writes no field that
    docs/design/api.md does not describe; the method's own ``Stats.extra`` means are covered by the
    page's sentence on them."""
    from specvis.bench import runner
    from specvis.bench.runner import Bench
    from specvis.job import Job

    pipe = sv.load("emoji")
    report = runner.run_bench(pipe, Job(num=1, batch_size=1),
                              Bench(specs=("sjd:window=4", "adt:total_tokens=8"), metrics=(), cost_curve=True),
                              progress=False)
    documented = documented_bench_fields()
    missing = sorted(set(report) - documented)
    missing += sorted({k for r in report["runs"] for k in r} - documented)
    assert not missing, f"bench fields not in docs/design/api.md: {missing}"


def test_the_bench_field_reader_reads_the_tables():
    fields = documented_bench_fields()
    assert {"runs", "speedup", "target_block_sizes", "wall_s_repeats", "mean_tree_depth"} <= fields
    assert "true" not in fields and "ar" not in fields  # the meaning column is not read


# ------------------------------------------------------------------------------------------ adding a rule

def doc_rule_file() -> tuple[str, str]:
    """(module path, code) of the rule file that docs/design/adding-a-rule.md shows."""
    text = (ROOT / "docs" / "design" / "adding-a-rule.md").read_text()
    m = re.search(r"<!-- rule-file: (\S+) -->\n```python\n(.*?)^```", text, re.S | re.M)
    assert m, "adding-a-rule.md: no <!-- rule-file: ... --> python block"
    return m.group(1), m.group(2)


@pytest.fixture
def neighbour(tmp_path, monkeypatch):
    """The page's rule, in its own module, registered by the one line the page shows."""
    path, code = doc_rule_file()
    (tmp_path / Path(path).name).write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(Path(path).stem, None)
    page = (ROOT / "docs" / "design" / "adding-a-rule.md").read_text()
    line = re.search(r'^\s*"([\w-]+)": "specvis\.(\w+):(\w+)",$', page, re.M)
    assert line and line.group(2) == Path(path).stem, "the page's registry line names its file"
    monkeypatch.setitem(registry.ACCEPTANCE, line.group(1), f"{line.group(2)}:{line.group(3)}")
    return line.group(1)


def test_the_documented_rule_is_one_file_and_one_registry_line(neighbour):
    """The page's rule builds from a spec and from flags, its option is checked, and a method whose walk
    it lacks refuses it in one line."""
    method = registry.method_from_spec(f"sjd:window=4:accept={neighbour}:weight=0.25")
    assert method.acceptance.name == neighbour and method.acceptance.weight == 0.25 and not method.lossless
    flags = build_parser().parse_args(["generate", "--method", "sjd", "--accept", neighbour, "--neighbour-weight", "0.3"])
    assert _method(flags).acceptance.weight == 0.3
    with pytest.raises(ValueError, match="weight"):
        registry.method_from_spec(f"sjd:accept={neighbour}:weight=2")
    with pytest.raises(ValueError, match="tree walk"):
        registry.method_from_spec(f"eagle:accept={neighbour}")


def test_the_documented_rule_is_exact_at_weight_0_and_not_above(neighbour, target):
    """The page's rule, bound to the target's embeddings by ``generate``, passes the exactness harness
    where it is speculative sampling's rule (weight 0) and fails it where it relaxes (weight 1)."""
    sampling = sv.Sampling(temperature=0.9, cfg_scale=2.0)
    exact = registry.method_from_spec(f"sjd:window=3:accept={neighbour}:weight=0")
    assert check_method(target, exact, sampling) > 1e-3
    relaxed = registry.method_from_spec(f"sjd:window=3:accept={neighbour}:weight=1")
    assert check_method(target, relaxed, sampling) < 1e-6
