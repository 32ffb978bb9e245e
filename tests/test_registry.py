"""Method options: one dataclass per method, its declared fields are the options, in the Python API, the
bench method specs, the JSON config and the generate flags (generated from the declarations: the flag
is the field's name or its ``flag`` metadata); anything else is an error naming the key. Every spec the
repository commits to must build."""

import os
import re
import subprocess
from pathlib import Path

import pytest

import specvis as sv
from specvis.bench import sweeps
from specvis.cli import _method, build_parser
from specvis.options import option_fields, spell
from specvis.registry import (ACCEPT, ACCEPTANCE, METHODS, resolve, build_method, describe, method_flags,
                              method_from_spec, option_names, parse_method_spec, spec_of)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_emoji.sh"


def strict(spec: str, acceptance: str | None = None):
    name, opts = parse_method_spec(spec)
    return build_method(name, opts, acceptance)


@pytest.mark.parametrize("spec,message", [
    ("speculative:gamma=4:bogus=1", "method speculative has no option 'bogus'; options: gamma, accept, and the "
                                    "acceptance rule's (exact: none; lantern: k, delta, metric, budget"),  # + later fields
    ("speculative:gama=4", "method speculative has no option 'gama'"),
    ("sjd:window=8:initt=random", "method sjd has no option 'initt'; options: window, init, refine, coupling, accept"),
    ("eagle:depth=5:topk=8", "method eagle has no option 'topk'; options: depth, top_k, total_tokens, accept"),
    ("jacobi:window=8:init=random", "method jacobi has no option 'init'; options: window"),
    ("cspd:gamma=4:window=2", "method cspd has no option 'window'; options: gamma, prefill, align, ratio"),
    ("ar:gamma=4", "method ar has no option 'gamma'; options: none"),
    ("speculative:delta=0.2", "method speculative has no option 'delta' with acceptance rule exact; "
                              "it is an option of rule lantern (set accept=lantern)"),
    ("sjd:window=8:accept=exact:k=50", "method sjd has no option 'k' with acceptance rule exact"),
    ("ar:accept=lantern", "method ar has no option 'accept' (it takes no acceptance rule); options: none"),
    ("cspd:accept=exact", "method cspd has no option 'accept'"),
    ("speculative:accept=lanterm", "unknown acceptance rule 'lanterm'; choose from exact, lantern"),
    ("speculative:gamma=2:gamma=4", "method option 'gamma' is given twice"),
])
def test_bad_spec_names_the_key(spec, message):
    with pytest.raises(ValueError) as e:
        strict(spec)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_options_reach_the_method_under_their_field_names():
    assert strict("eagle:depth=3:top_k=4:total_tokens=9:accept=lantern:k=7:delta=0.1:metric=cosine") == sv.EagleTree(
        depth=3, top_k=4, total_tokens=9, acceptance=sv.Lantern(k=7, delta=0.1, metric="cosine"))
    assert strict("sjd:window=8:refine=false:gamma=none") == sv.SJD(window=8, refine=False)  # none = default
    # the bench --accept default applies to the methods that take a rule and whose spec names none
    assert strict("ar", "lantern") == sv.AR()
    assert strict("speculative:k=5", "lantern").acceptance == sv.Lantern(k=5)
    assert strict("speculative:accept=exact", "lantern").acceptance == sv.Exact()
    with pytest.raises(ValueError, match="'k' with acceptance rule exact"):
        strict("speculative:accept=exact:k=5", "lantern")


# ---------------------------------------------------------------- generate flags


def generate_method(*flags):
    return _method(build_parser().parse_args(["generate", *flags]))


def test_generate_flags_set_the_api_fields():
    a = build_parser().parse_args(["generate"])
    fields = {ACCEPT}.union(*(option_names(resolve(t, n, "")) for t in (METHODS, ACCEPTANCE) for n in t))
    assert set(a.method_flags) == fields  # every option of every method and rule has its flag
    names = [f.name for f in a.method_flags.values()]
    assert len(set(names)) == len(names) and "--tree-top-k" in names and "--lantern-k" in names
    assert generate_method("--method", "eagle", "--depth", "3", "--tree-top-k", "4", "--total-tokens", "9",
                           "--accept", "lantern", "--lantern-k", "7", "--lantern-delta", "0.1", "--lantern-metric",
                           "cosine", "--lantern-budget", "output") == sv.EagleTree(
        depth=3, top_k=4, total_tokens=9, acceptance=sv.Lantern(k=7, delta=0.1, metric="cosine", budget="output"))
    assert generate_method("--method", "sjd", "--no-refine", "--top-k", "5") == sv.SJD(refine=False)  # --top-k: sampling
    assert generate_method("--method", "speculative") == sv.Speculative()


@pytest.mark.parametrize("flags,message", [
    (["--method", "ar", "--gamma", "4"], "method ar has no option '--gamma'; options: none"),
    (["--method", "ar", "--accept", "exact"], "method ar has no option '--accept' (it takes no acceptance rule)"),
    (["--method", "jacobi", "--no-refine"], "method jacobi has no option '--no-refine'; options: --window"),
    (["--method", "sjd", "--tree-top-k", "3"], "method sjd has no option '--tree-top-k'; options: --window, --init, "
                                               "--no-refine, --coupling, --accept, and the acceptance rule's (exact: none; "
                                               "lantern: --lantern-k, --lantern-delta, --lantern-metric, "
                                               "--lantern-budget"),
    (["--method", "speculative", "--lantern-k", "50"], "method speculative has no option '--lantern-k' with acceptance "
                                                       "rule exact; it is an option of rule lantern (set --accept=lantern)"),
])
def test_generate_flag_of_another_method_is_an_error(flags, message):
    with pytest.raises(ValueError) as e:
        generate_method(*flags)
    assert message in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------- committed specs


def script_specs(tmp_path: Path) -> list[str]:
    """Every --methods spec of scripts/bench_emoji.sh, as bash expands it: each case of the script
    runs with ``specvis`` and ``python`` replaced by stubs that log their arguments."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    for exe in ("specvis", "python"):
        (bin_dir / exe).write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> "{log}"\n')
        (bin_dir / exe).chmod(0o755)
    text = SCRIPT.read_text()
    cases = [c for group in re.findall(r"^  ([\w|-]+)\)", text, re.M) for c in group.split("|")]
    subcases = [c for group in re.findall(r"^      ([\w|-]+)\)", text, re.M) for c in group.split("|")]
    assert "main" in cases and subcases
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    for case in cases:
        for sub in subcases:  # cspd's second argument; the other cases ignore it
            subprocess.run(["bash", str(SCRIPT), case, sub], env=env, cwd=tmp_path, check=True, capture_output=True)
    args = log.read_text().splitlines()
    return sorted({s for i, a in enumerate(args) if a == "--methods" for s in args[i + 1].split(",")})


def sweep_specs(tmp_path: Path, monkeypatch) -> list[str]:
    specs = []
    monkeypatch.setattr(sweeps, "run_bench", lambda pipe, job, bench, **k: specs.extend(bench.specs) or {"runs": []})
    sweeps.sjd_ablations(type("P", (), {"default_sampling": sv.Sampling()})(), tmp_path, 1, 1)
    sweeps.lantern_grid(type("P", (), {"default_sampling": sv.Sampling()})(), tmp_path, 1, 1)
    return sorted(set(specs))


def test_every_committed_spec_builds_with_its_options_in_the_json_config(tmp_path, monkeypatch):
    from_script, from_sweeps = script_specs(tmp_path), sweep_specs(tmp_path, monkeypatch)
    assert "eagle:depth=5:top_k=8:total_tokens=24:accept=lantern:k=50:delta=0.2" in from_script
    assert "cspd:gamma=8:ratio=trajectory" in from_script and "speculative:gamma=4:accept=lantern:k=50:delta=0.2" in from_sweeps
    for spec in from_script + from_sweeps:
        name, opts = parse_method_spec(spec)
        method = build_method(name, dict(opts))
        got, config, rule = describe(method)
        assert got == name
        for key, value in opts.items():  # the JSON config keys are the spec keys: the dataclass fields
            if key == ACCEPT:
                assert rule == value
            elif key in config:
                assert config[key] == literal(value), spec
            else:
                assert config["acceptance_config"][key] == literal(value), spec


def literal(text: str):
    """A spec value as a number or bool where it reads as one (what the JSON config then holds)."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def _flag_value(info):
    """A value of ``info`` other than its default, as text."""
    from specvis.options import NoneType, members

    kinds = members(info.type)
    if bool in kinds:
        return "false" if info.default is True else "true"
    if info.choices:
        return next(c for c in reversed(info.choices) if c != info.default)
    if int in kinds:
        return str(info.default + 1 if isinstance(info.default, int) else int(info.low or 0) + 3)
    if float in kinds:
        return str((info.low or 0) + 0.5 if info.high is None else (info.low + info.high) / 2 + 0.01)
    if info.default is None:  # a tuple or None
        return "7/6" if "ranks" in info.name else "0/3"
    return spell(tuple(v + 1 for v in info.default))


@pytest.mark.parametrize("key", [f.key for f in method_flags()])
def test_each_generated_flag_sets_its_own_field(key):
    """Every flag, set alone on the first method that has it, changes that method's (or its rule's)
    field of the flag's key and nothing else. Catches a flag mapped to another field, or two flags
    sharing a destination."""
    flag = next(f for f in method_flags() if f.key == key)
    owner, info = flag.owners[0]
    if key == ACCEPT:
        got = generate_method("--method", owner, "--accept", "lantern")
        assert got == resolve(METHODS, owner, "")(acceptance=sv.Lantern())
        return
    value = _flag_value(info)
    args = [flag.name] if flag.boolean else [flag.name, value]
    if owner in ACCEPTANCE:
        got = generate_method("--method", "speculative", "--accept", owner, *args).acceptance
        base = resolve(ACCEPTANCE, owner, "")()
    else:
        got = generate_method("--method", owner, *args)
        base = resolve(METHODS, owner, "")()
    changed = [i.name for i in option_fields(type(got)) if getattr(got, i.name) != getattr(base, i.name)]
    assert changed == [info.name], (flag.name, args, changed)


@pytest.mark.parametrize("method", [
    sv.AR(), sv.Speculative(gamma=3), sv.SJD(window=8, init="vertical-sample", coupling="gumbel"),
    sv.SJD(refine=False, coupling="none"), sv.EagleTree(depth=4, top_k=8, total_tokens=24), sv.StaticTree(tree="chain"),
    sv.Speculative(gamma=2, acceptance=sv.Lantern(k=5, delta=0.3, budget="relative", lam=2.0)),
    sv.SJD(window=4, acceptance=sv.GSD(group=4)), sv.Auto(margin=1.2, probe_classes=(0, 3)),
    sv.Auto(probe_classes=(4,)), sv.SJD(acceptance=sv.GSD(ranks=(7, 6))), sv.ADTTree(depth_range=(2, 8)),
    sv.StaticTree(tree=[[0], [1], [0, 0], [0, 1], [0, 0, 0]]), sv.StaticTree(tree=[[0]]),
])
def test_spec_of_gives_the_method_back(method):
    """``spec_of`` (what auto prints for reuse) is the inverse of ``method_from_spec``: a field or a
    rule it dropped or misspelt would build another method."""
    spec = spec_of(method)
    assert spec.split(":")[0] in METHODS and method_from_spec(spec) == method


def test_tuple_options_are_written_with_slashes_and_dots():
    """A tuple field (ADT's ranges, a static tree's paths) has a spelling in a spec and a flag: items
    split by '/' (',' outside a bench --methods list), a path's indices joined by '.'."""
    assert strict("adt:depth_range=2/8:topk_range=1/5") == sv.ADTTree(depth_range=(2, 8), topk_range=(1, 5))
    assert strict("static-tree:tree=0/1/0.0").paths == ((0,), (1,), (0, 0))
    assert strict("static-tree:tree=chain") == sv.StaticTree(tree="chain")
    assert generate_method("--method", "static-tree", "--tree", "0,0.0,0.0.0") == sv.StaticTree(tree=[[0], [0, 0], [0, 0, 0]])
    for spec, message in [("static-tree:tree=0/0.1", "StaticTree.tree: path [0, 1] has no elder sibling [0, 0]"),
                          ("static-tree:tree=0/x", "method option tree must be one of mc_sim_7b_63, "),
                          ("static-tree:tree=0/x", "or a non-empty list of non-empty lists of integers in [0, 1023], got '0/x'"),
                          ("adt:depth_range=2/3", "ADTTree.depth_range must be an open interval")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            strict(spec)
