"""Option declarations (``specvis.options``): every method and rule field is checked from its real
annotation and metadata, with one line naming ``Class.field``, what it takes and the value given; the
rule protocol's capabilities are checked when a method is built; a new method is its own file plus
one registry line."""

from __future__ import annotations

import math
import sys
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import specvis as sv
from specvis import registry
from specvis.accept import AcceptanceRule, BoundRule, Exact, RuleTables
from specvis.options import members, option_fields, parse, spell

ROOT = Path(__file__).resolve().parents[1]
CLASSES = [registry.resolve(t, n, "") for t in (registry.METHODS, registry.ACCEPTANCE) for n in t]
OPTIONS = [(cls, info) for cls in CLASSES for info in option_fields(cls) if info.type is not AcceptanceRule]


def ids(pairs):
    return [f"{cls.__name__}.{info.name}" for cls, info in pairs]


def test_every_field_is_declared_with_help():
    assert len(OPTIONS) == 45  # the 38, then ZipAR (1) and PJD (6): every one checked, documented and flagged
    for cls, info in OPTIONS:
        assert info.help and not info.help.endswith("."), f"{cls.__name__}.{info.name}"
        assert info.check(info.default) == info.default  # every default passes its own declaration


def at(info, v, top=False):
    """A value of ``info`` whose numbers are all ``v`` (the tightest one a cross-field check allows;
    ``top``: an open interval's upper end is ``v``)."""
    if not any(typing.get_origin(m) is tuple for m in members(info.type)):
        return v
    if info.name == "tree":  # rank v needs its elder siblings 0 .. v - 1
        return tuple((i,) for i in range(v + 1)) if top else ((v,),)
    if info.owner == "ADTTree":  # an open interval: (low, low + 2) holds one integer
        return (v - 2, v) if top else (v, v + 2)
    return (v, v) if info.name == "ranks" else (v,)


BOUNDED = [p for p in OPTIONS if p[1].low is not None or p[1].high is not None]


def numbers_in(tp) -> set:
    out = set()
    for m in members(tp):
        out |= numbers_in(typing.get_args(m)[0]) if typing.get_origin(m) is tuple else {m} & {int, float}
    return out


@pytest.mark.parametrize("cls,info", OPTIONS, ids=ids(OPTIONS))
def test_every_number_has_an_upper_bound(cls, info):
    """Each option holding numbers declares the largest it takes (``high``) or counts stream tokens
    (``stream``: clamped to the stream before the plan and the run), so that no value makes unbounded
    work or memory (PJD's window of 2**62, Auto's 10**6 repeats). Catches a numeric option declared
    without a bound."""
    if numbers_in(info.type):
        assert info.high is not None or info.stream, f"{cls.__name__}.{info.name} has no upper bound"


@pytest.mark.parametrize("cls,info", BOUNDED, ids=ids(BOUNDED))
def test_bounds_are_exact(cls, info):
    """Each numeric bound (of a number, or of a tuple's items) admits the bound itself and refuses the
    next value past it (ADTTree.beta's lower bound is open: refused, and anything above admitted).
    Catches a bound off by one, or a strict bound where the declaration says inclusive."""
    step = 1e-9 if float in members(info.type) else 1
    for bound, past in ((info.low, -step), (info.high, step)):
        if bound is None:
            continue
        edge = bound if step != 1 else int(bound)
        top = bound == info.high
        inside, outside = at(info, edge, top), at(info, edge + past, top)
        if info.open_low and bound == info.low:
            inside, outside = at(info, edge + step), at(info, edge)
        made = cls(**{info.name: inside})
        assert getattr(made, info.name) == inside
        with pytest.raises(ValueError) as e:
            cls(**{info.name: outside})
        message = str(e.value)
        assert message.startswith(f"{cls.__name__}.{info.name} must be ") and "\n" not in message
        shown = repr(outside) if len(repr(outside)) <= 60 else repr(outside)[:57] + "..."  # as errors show it
        assert message.endswith(f"got {shown}")


@pytest.mark.parametrize("cls,info", OPTIONS, ids=ids(OPTIONS))
def test_wrong_types_are_refused(cls, info):
    """An int field refuses a bool and a float (1.0 too); a float field a bool, a string, nan and inf;
    a str field any other type and a name outside its choices; a bool field 0/1."""
    kinds = members(info.type)
    bad = []
    if int in kinds:
        bad += [True, float(info.default) if isinstance(info.default, int) else 1.0]
    if float in kinds:
        bad += [True, "0.5", math.nan, math.inf]
    if bool in kinds:
        bad += [1, "true"]
    if str in kinds and info.choices:
        bad += ["no-such-choice", 3]
    for v in bad:
        with pytest.raises(ValueError) as e:
            cls(**{info.name: v})
        assert f"{cls.__name__}.{info.name} must be " in str(e.value), v


def test_a_float_option_without_an_upper_bound_still_refuses_infinity():
    """Every declared float option has an upper bound (which also refuses inf), so the finiteness check is
    tested on an option declared without one: inf and -inf refused, a large finite value kept."""
    from specvis.options import OptionInfo

    info = OptionInfo(owner="Probe", name="scale", type=float, default=1.0, help="", choices=None, low=0.0, high=None,
                      open_low=False, flag="scale", aliases={}, stream=False)
    assert info.check(1e300) == 1e300
    for v in (math.inf, -math.inf, math.nan):
        with pytest.raises(ValueError, match="Probe.scale must be "):
            info.check(v)


def test_tuples_are_checked_item_by_item_and_stored_as_tuples():
    assert sv.ADTTree(depth_range=[2, 5]).depth_range == (2, 5)
    assert sv.Auto(probe_classes=[0, 3]).probe_classes == (0, 3)
    assert sv.StaticTree(tree=[[0], [0, 0]]).tree == ((0,), (0, 0))
    assert sv.GSD(ranks="official").ranks == (7, 6) == sv.GSD(ranks=[7, 6]).ranks  # an alias is its value
    for make, text in [(lambda: sv.ADTTree(depth_range=(2, 5, 9)), "ADTTree.depth_range must be a list of 2 integers"),
                       (lambda: sv.ADTTree(depth_range=(2, True)), "ADTTree.depth_range must be a list of 2 integers"),
                       (lambda: sv.Auto(probe_classes=(0, 1.0)), "Auto.probe_classes must be a non-empty list"),
                       (lambda: sv.GSD(ranks=(7, -1)), r"GSD.ranks must be a list of 2 integers in \[0, 4096\] or official = 7/6 or None"),
                       (lambda: sv.StaticTree(tree=[[0], []]), r"non-empty lists of integers in \[0, 1023\]")]:
        with pytest.raises(ValueError, match=text):
            make()


def test_cross_field_checks_run_after_the_fields():
    with pytest.raises(ValueError, match=r"ADTTree.depth_range must be an open interval .* got \(3, 4\)"):
        sv.ADTTree(depth_range=(3, 4))
    with pytest.raises(ValueError, match="CSpD.align=False has no meaning with ratio='trajectory'"):
        sv.CSpD(ratio="trajectory", align=False)
    with pytest.raises(ValueError, match="has no parent"):
        sv.StaticTree(tree=[[0, 0]])


def test_text_is_read_as_the_fields_type_and_spelled_back():
    """``parse`` reads spec and flag text from the real annotation (no annotation-string search);
    ``spell`` writes a value so that ``parse`` gives it back."""
    infos = {(cls.__name__, i.name): i for cls, i in OPTIONS}
    cases = [("SJD", "window", "8", 8), ("SJD", "refine", "false", False), ("Lantern", "delta", "0.5", 0.5),
             ("GSD", "max_dist", "none", None), ("GSD", "max_dist", "2", 2.0), ("GSD", "ranks", "official", (7, 6)),
             ("GSD", "ranks", "3/4", (3, 4)), ("ADTTree", "static_shapes", "none", None),
             ("StaticTree", "tree", "0/1/0.0", ((0,), (1,), (0, 0))), ("StaticTree", "tree", "chain", "chain"),
             ("Auto", "probe_classes", "4", (4,)), ("SJD", "coupling", "none", "none")]
    for owner, name, text, want in cases:
        got = parse(infos[owner, name], text)
        assert got == want and type(got) is type(want), (owner, name, text, got)
        if want is not None:
            assert parse(infos[owner, name], spell(want)) == want
    for owner, name, text in [("SJD", "window", "true"), ("SJD", "window", "1.5"), ("SJD", "refine", "2"),
                              ("ADTTree", "depth_range", "2/x")]:
        with pytest.raises(ValueError):
            parse(infos[owner, name], text)


# ---------------------------------------------------------------- the rule protocol
def test_rules_declare_their_capabilities():
    for rule in (sv.Exact(), sv.Lantern(), sv.GSD(), sv.GSD(max_dist=0.5), sv.GSD(max_dist=0.5, embedding="codebook")):
        assert isinstance(rule, AcceptanceRule) and rule.walks <= {"chain", "tree", "sampled-tree"}
        assert rule.needs <= {"codebook", "embeddings", "soft"}
    assert sv.Lantern().needs == {"codebook", "soft"} and sv.GSD().needs == frozenset()
    assert sv.GSD(max_dist=0.5).needs == {"embeddings"} and sv.GSD(max_dist=0.5, embedding="codebook").needs == {"codebook"}
    assert sv.GSD().walks == {"chain"} and sv.Exact().bind(RuleTables()) == sv.Exact()
    bound = sv.Lantern(k=3).bind(RuleTables(torch.randn(5, 2), structural=1))
    assert isinstance(bound, BoundRule) and isinstance(bound, AcceptanceRule) and bound.table.shape == (6, 3)
    assert bound.bind(RuleTables(structural=1)) is bound  # already bound, with its structural id


@pytest.mark.parametrize("method,walk", [(sv.Speculative, "chain"), (sv.SJD, "chain"), (sv.EagleTree, "tree"),
                                         (sv.ADTTree, "tree"), (sv.StaticTree, "sampled-tree")])
def test_a_method_refuses_a_rule_without_its_walk_when_built(method, walk):
    """The capability check runs at construction: a rule that does not declare the method's walk is one
    line naming the method, the rule, its walks and the rules that do. Catches the check removed (a
    tree method would only fail at run time, with an AttributeError inside a round)."""
    assert method.walk == walk

    @dataclass(frozen=True)
    class ChainOnly(Exact):
        name = "chain-only"
        walks = frozenset({"chain"})

    if walk == "chain":
        assert method(acceptance=ChainOnly()).acceptance == ChainOnly()
        return
    with pytest.raises(ValueError) as e:
        method(acceptance=ChainOnly())
    text = str(e.value)
    assert text.startswith(f"{method.__name__}.acceptance: rule chain-only is not supported with {method.__name__}")
    assert f"needs the {walk} walk" in text and "use exact or coupled or lantern" in text and "\n" not in text


def test_acceptance_must_be_a_rule():
    for bad in (3, "exact", Exact):
        with pytest.raises(ValueError, match="SJD.acceptance must be an AcceptanceRule"):
            sv.SJD(acceptance=bad)


def test_every_field_of_the_registry_is_declared():
    """A method or rule of the registry has no field outside the declarations (it would get no check,
    no flag and no docs row); a field declared otherwise, in a subclass of a user's, is left alone."""
    import dataclasses

    for cls in CLASSES:
        declared = {i.name for i in option_fields(cls)}
        assert declared == {f.name for f in dataclasses.fields(cls) if f.init}, cls.__name__

    @dataclass(frozen=True)
    class Recorded(sv.AR):
        records: list = dataclasses.field(default_factory=list, compare=False)

    assert option_fields(Recorded) == () and Recorded().records == []


# ---------------------------------------------------------------- a new method: its file + one registry line
TOY = '''
from dataclasses import dataclass

import torch

from specvis.accept import AcceptanceRule, Exact, RuleMethod
from specvis.methods.verdicts import Verdict
from specvis.options import option


@dataclass(frozen=True)
class Toy(RuleMethod):
    """AR with a declared option and rule: what a new method writes."""

    stride: int = option(2, low=1, help="a toy option")
    acceptance: AcceptanceRule = option(default_factory=Exact, flag="accept", help="the acceptance rule")
    name = "toy"
    walk = "chain"
    pad = 1

    def decode(self, ctx) -> None:
        x = ctx.target.prefill().sample(ctx.generator)
        ctx.accept(Verdict.sampled(x))

        def round_() -> None:
            law = ctx.target.forward(x[:, None], (ctx.n - 1)[:, None])
            x.copy_(law[:, 0].sample(ctx.generator))
            ctx.accept(Verdict.sampled(x))

        ctx.run(round_, rounds=ctx.L - 1)
'''


def test_a_new_method_is_its_own_file_and_one_registry_line(monkeypatch, tmp_path):
    """A toy method in its own module plus one ``METHODS`` line: it builds from a spec, its option gets
    a flag and a docs table row, a rule without its walk is refused, and it runs."""
    (tmp_path / "toy_method.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.METHODS, "toy", "toy_method:Toy")  # the one registry line
    toy = registry.method_from_spec("toy:stride=3:accept=lantern:k=4")
    assert toy.stride == 3 and toy.acceptance == sv.Lantern(k=4) and registry.spec_of(toy) == "toy:stride=3:accept=lantern:k=4"
    from specvis.cli import _method, build_parser

    assert _method(build_parser().parse_args(["generate", "--method", "toy", "--stride", "5"])).stride == 5
    with pytest.raises(ValueError, match="method toy has no option 'window'"):
        registry.method_from_spec("toy:window=3")
    option_tables = scripts_module("option_tables")
    assert "| stride | --stride | int | 2 | an integer >= 1 | a toy option |" in option_tables.tables()
    pipe = sv.load("random-tiny")
    stream = {"noise": "stream"}  # the toy draws from the call's seeded stream, as AR does under stream noise
    out = pipe([0, 1], "toy", seed=3, sampling=stream)
    assert torch.equal(out.tokens, pipe([0, 1], sv.AR(), seed=3, sampling=stream).tokens)  # the toy is AR



def scripts_module(name: str):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def test_the_docs_option_tables_are_current():
    """docs/guide/methods.md holds the tables ``scripts/option_tables.py`` generates from the
    declarations: a field added, renamed or re-documented without regenerating them fails here."""
    tables = scripts_module("option_tables")
    text = tables.DOC.read_text()
    assert tables.current(text) == text, "run: python scripts/option_tables.py"
    for cls, info in OPTIONS:  # every option has its row
        assert f"| {info.name} | " in text, f"{cls.__name__}.{info.name}"
