"""``specvis demo``: a local Gradio page that runs one method against AR and shows both images side by side.

Install the extra (``pip install -c constraints-cpu.txt -e ".[demo]"``), then ``specvis demo [--port 7860]``
and open http://127.0.0.1:7860. The page takes a model, a class (class-conditional models) or a text prompt
(text-to-image models), a method with its options in the bench spec syntax (``window=16:coupling=maximal``),
an acceptance rule and a seed. Generate runs AR, then the method, on the same seed and shows the two
images, the wall time of each, the speedup, the tokens per target forward (mean accepted length) and
the method's acceptance heatmap (``Stats.accept_map``). Bad input is one line on the page.

Models: the page offers the installed bundles (``specvis models``) and the checkpoints the operator
names at launch (``specvis demo --model DIR_OR_HUB_ID``, repeatable; the first is preselected), and
loads nothing else: a page served to others (``--host 0.0.0.0``) must not open arbitrary paths of the
server, so any other name gets the same one line, whether or not such a file exists.

The command-line wiring lives in ``specvis.cli``: ``add_parser(subparsers)`` adds the ``demo`` command
and ``main(args)`` runs it. Gradio is imported only when the page is built.
"""

from __future__ import annotations

import argparse
import html
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

DEFAULT_PORT = 7860
DEFAULT_SPEC = "window=16"
NEEDS_GRADIO = "the demo needs gradio: pip install 'specvis[demo]' (with -c constraints-cpu.txt on CPU-only machines)"


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``demo`` command to ``specvis``'s subparsers."""
    p = subparsers.add_parser(
        "demo", help="local web page: one method against AR, side by side (needs specvis[demo])",
        description="A web page that runs one method against AR, side by side. It offers the installed bundles "
                    "and the checkpoints named by --model at launch, and loads nothing else: a path or Hub id "
                    "typed into the page is refused with one line that says nothing about this machine's files.")
    p.add_argument("--model", action="append", metavar="MODEL",
                   help="a checkpoint directory or Hub id (or bundle name) the page offers besides the installed "
                        "bundles; repeat for more; the first is preselected (default emoji). The page loads "
                        "only these and the bundles, never a path typed into it")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port on 127.0.0.1 (default {DEFAULT_PORT}; 0: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, this machine only)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    return p


# ---------------------------------------------------------------- the work behind the page (no gradio)


@dataclass
class Result:
    ar_image: Any
    method_image: Any
    heatmap: Any
    ar_stats: Any
    method_stats: Any
    spec: str
    rule: str
    lossless: bool
    max_accept: int

    @property
    def speedup(self) -> float:
        return self.ar_stats.wall_s / max(self.method_stats.wall_s, 1e-9)


class Models:
    """Pipelines loaded once per (name, device), shared by the page's requests. Only the names of
    ``offered`` load: the installed bundles, then ``extra`` (the operator's ``--model`` arguments)."""

    def __init__(self, device: str = "cpu", extra: list[str] | tuple[str, ...] = ()) -> None:
        from .zoo import BUNDLES, installed

        self.device = device
        names = [n for n in BUNDLES if installed(n)] + [str(m).strip() for m in extra if str(m).strip()]
        self.offered = list(dict.fromkeys(names))
        self._cache: dict[str, Any] = {}
        self._lock = threading.Lock()
        # one generation at a time: a run left going by a closed page must not share the CPU with the next
        # one (its timings would be wrong)
        self.busy = threading.Lock()

    def get(self, name: str):
        name = (name or "").strip() if isinstance(name, str) else ""
        if not name:
            raise ValueError(f"choose a model: {', '.join(self.offered)}")
        if name not in self.offered:  # the same words whatever the name is: nothing about the server's files
            raise ValueError(f"this demo offers only the models its operator chose: {', '.join(self.offered)}")
        with self._lock:
            if name not in self._cache:
                from .zoo import load

                self._cache[name] = load(name, self.device)
            return self._cache[name]


def class_choices(pipe) -> list[str]:
    """``"3: animals"`` for each class of a class-conditional pipeline ([] for text models)."""
    if pipe.conditioning != "class":
        return []
    names = list(pipe.class_names or [])
    return [f"{i}: {names[i]}" if i < len(names) else str(i) for i in range(pipe.num_classes)]


def parse_condition(pipe, text: str) -> dict[str, Any]:
    """The keyword arguments of ``pipe(...)`` for the page's class/prompt field: ``classes=[c]`` for a
    class-conditional model (an id, ``"id: name"`` or a class name), ``prompts=[text]`` for a text model."""
    text = (text or "").strip()
    if pipe.conditioning != "class":
        if not text:
            raise ValueError(f"model {pipe.name} is text-to-image: type a text prompt")
        return {"prompts": [text]}
    n = pipe.num_classes
    names = list(pipe.class_names or [])
    if not text:
        raise ValueError(f"model {pipe.name} is class-conditional: give a class, 0..{n - 1}")
    head = text.split(":", 1)[0].strip()
    if head.lstrip("-").isdigit():
        c = int(head)
        if not 0 <= c < n:
            raise ValueError(f"class {c} is out of range; model {pipe.name} has classes 0..{n - 1}")
        return {"classes": [c]}
    lowered = [s.lower() for s in names]
    if text.lower() in lowered:
        return {"classes": [lowered.index(text.lower())]}
    raise ValueError(f"model {pipe.name} is class-conditional and has no class {text!r}: give an id 0..{n - 1} or a class name")


def method_spec(method: str, options: str) -> str:
    """The bench spec of the page's method name and options field (``window=16:coupling=maximal``);
    the options may also start with the method name (a whole bench spec)."""
    method, options = (method or "").strip(), (options or "").strip().strip(":")
    if not method:
        raise ValueError("choose a method")
    if options.split(":", 1)[0] == method:
        return options
    return f"{method}:{options}" if options else method


def parse_number(value, what: str, cast=float):
    """None for an empty field, else the value as ``cast`` (a ValueError naming the field otherwise)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        number = float(value)
        out = cast(number)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{what} must be a finite number, got {value!r:.40}") from None
    if not math.isfinite(number):
        raise ValueError(f"{what} must be a finite number, got {value!r:.40}")
    if cast is int and float(value) != out:
        raise ValueError(f"{what} must be a whole number, got {value!r}")
    return out


def _sampling(pipe, temperature, cfg_scale):
    from .sampling import Sampling

    d = pipe.default_sampling
    t = parse_number(temperature, "temperature")
    c = parse_number(cfg_scale, "cfg scale")
    return Sampling(temperature=d.temperature if t is None else t, top_k=d.top_k, top_p=d.top_p,
                    cfg_scale=d.cfg_scale if c is None else c)


def _enlarge(image, side: int = 256):
    """Nearest-neighbour upscale of a small image to at least ``side`` pixels (pixels stay crisp)."""
    from PIL import Image

    k = max(1, -(-side // max(image.width, image.height)))
    return image.resize((image.width * k, image.height * k), Image.NEAREST) if k > 1 else image


def compare(models: Models, model: str, condition: str, method: str, options: str, accept: str, seed,
            temperature=None, cfg_scale=None, on_phase: Callable[[str, float], None] | None = None,
            on_ar: Callable[[Any, Any], None] | None = None,
            on_tokens: Callable[[str, float], None] | None = None) -> Result:
    """AR, then the method, on one condition with one seed. Every bad input is a ValueError (one line).
    ``on_phase(text, fraction)`` hears each phase as it starts, ``on_ar(image, stats)`` the AR result,
    ``on_tokens(run, fraction)`` each decoding round's committed fraction ("ar" or the method's name)."""
    from .zoo import pipeline_for
    from .methods.ar import AR
    from .registry import describe, method_from_spec, parse_method_spec
    from .viz import heatmaps

    phase = on_phase or (lambda text, frac: None)
    seed = parse_number(seed, "seed", int)
    seed = 0 if seed is None else seed
    spec = method_spec(method, options)
    chosen = method_from_spec(spec, (accept or "exact").strip() or "exact")  # bad options fail before loading
    phase(f"loading model {model.strip()}", 0.05)
    pipe = pipeline_for(models.get(model), ["ar", parse_method_spec(spec)[0]])
    kwargs = parse_condition(pipe, condition)
    sampling = _sampling(pipe, temperature, cfg_scale)
    if not models.busy.acquire(blocking=False):
        phase("waiting for the previous run to finish", 0.1)
        models.busy.acquire()
    try:
        phase("AR: generating", 0.15)
        tick = on_tokens or (lambda run, frac: None)
        ar = pipe(method=AR(), sampling=sampling, seed=seed, progress=lambda f: tick("ar", f), **kwargs)
        big_ar = _enlarge(ar.images[0])
        if on_ar is not None:
            on_ar(big_ar, ar.stats)
        phase(f"{chosen.name}: generating", 0.55)
        acc = pipe(method=chosen, sampling=sampling, seed=seed, progress=lambda f: tick(chosen.name, f), **kwargs)
    finally:
        models.busy.release()
    phase("rendering", 0.95)
    amap = acc.stats.accept_map
    big_acc = _enlarge(acc.images[0])
    cell = max(1, big_acc.width // amap.shape[-1])
    _, _, rule = describe(chosen)
    return Result(big_ar, big_acc, heatmaps(amap[:1], cell=cell)[0], ar.stats, acc.stats, spec, rule,
                  bool(chosen.lossless), int(amap.max()))


def figures_html(r: Result) -> str:
    """The figures table; each number sits in a span with an id (``sv-speedup``, ``sv-tpf`` ...)."""
    a, m = r.ar_stats, r.method_stats

    def num(id_: str, value: float, fmt: str) -> str:
        return f'<span id="{id_}">{value:{fmt}}</span>'

    rows = [
        ("AR", num("sv-ar-wall", a.wall_s, ".3f"), str(a.target_forwards), num("sv-ar-tpf", a.mean_accepted_length, ".2f"), "1.00"),
        (html.escape(r.spec) + f" ({html.escape(r.rule)})", num("sv-method-wall", m.wall_s, ".3f"), str(m.target_forwards),
         num("sv-tpf", m.mean_accepted_length, ".2f"), num("sv-speedup", r.speedup, ".2f")),
    ]
    head = "".join(f"<th>{h}</th>" for h in ("method", "wall time (s)", "target forwards", "tokens per forward", "speedup"))
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    note = (f"{m.tokens} image tokens each; speedup = AR wall time / method wall time (decoding loop only, "
            f"same seed); {'lossless' if r.lossless else 'not lossless: relaxed acceptance'}. "
            f"Heatmap: tokens committed by the target forward that committed each token, "
            f"dark = 1 ... yellow = {r.max_accept}.")
    return f'<table id="sv-figures">{"<tr>" + head + "</tr>"}{body}</table><p>{html.escape(note)}</p>'


def error_line(exc: BaseException) -> str:
    """One line for the page: the message of a ValueError/OSError, the type of anything else."""
    text = " ".join(str(exc).split()) or exc.__class__.__name__
    if not isinstance(exc, (ValueError, OSError)):
        text = f"{exc.__class__.__name__}: {text}"
    return text if len(text) <= 300 else text[:297] + "..."


# ---------------------------------------------------------------- the page


def build_app(model: str | list[str] = "emoji", device: str = "cpu", models: Models | None = None):
    """The Gradio Blocks of the page (not launched). ``model``: the operator's choice (``--model``),
    one name or several; the first is preselected, and the page offers these and the bundles only."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    try:
        import gradio as gr
    except ImportError:
        raise ValueError(NEEDS_GRADIO) from None
    from .registry import ACCEPTANCE, METHODS, available

    chosen = [model] if isinstance(model, str) else list(model or ["emoji"])
    model = chosen[0]
    models = models or Models(device, chosen)
    try:
        first = models.get(model)
        first_classes, first_sampling = class_choices(first), first.default_sampling
    except Exception:  # noqa: BLE001 - the page still opens; Generate reports the problem
        first_classes, first_sampling = [], None
    methods = [m for m in available(METHODS) if m != "ar"]

    def status(text: str, error: bool = False) -> str:
        return f'<p id="sv-status" class="{"sv-error" if error else "sv-ok"}">{html.escape(text)}</p>'

    def on_model(name):
        try:
            pipe = models.get(name)
            choices = class_choices(pipe)
        except Exception as exc:  # noqa: BLE001
            return gr.update(), gr.update(), gr.update(), status(error_line(exc), error=True)
        d = pipe.default_sampling
        temperature, cfg = gr.update(value=d.temperature), gr.update(value=d.cfg_scale)
        if not choices:
            return (gr.update(choices=[], value=""), temperature, cfg,
                    status(f"model {name.strip()}: text-to-image, type a prompt"))
        return (gr.update(choices=choices, value=choices[0]), temperature, cfg,
                status(f"model {name.strip()}: {len(choices)} classes"))

    def on_generate(model_name, condition, method, options, accept, seed, temperature, cfg_scale,
                    progress=gr.Progress()) -> Iterator[tuple]:
        box: dict[str, Any] = {"phase": "starting", "t0": time.perf_counter()}

        def phase(text: str, frac: float) -> None:
            box["phase"], box["frac"], box["t0"] = text, frac, time.perf_counter()
            box.pop("tokens", None)

        def tokens(run: str, frac: float) -> None:  # AR fills 0.15-0.55 of the bar, the method 0.55-0.95
            box["tokens"], box["frac"] = frac, (0.15 if run == "ar" else 0.55) + 0.4 * frac

        def work() -> None:
            try:
                box["result"] = compare(models, model_name, condition, method, options, accept, seed,
                                        temperature, cfg_scale, on_phase=phase, on_tokens=tokens,
                                        on_ar=lambda image, stats: box.update(ar_image=image, ar_wall=stats.wall_s))
            except BaseException as exc:  # noqa: BLE001 - shown on the page
                box["error"] = exc

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        started, keep, shown = time.perf_counter(), gr.update(), False
        yield None, None, None, "", status("starting")  # clear the previous results
        while thread.is_alive():
            thread.join(0.5)
            text = f"{box['phase']}... {time.perf_counter() - box['t0']:.1f} s"
            if "tokens" in box:
                text += f", {100 * box['tokens']:.0f}% of the tokens"
            if "ar_wall" in box:
                text += f" (AR took {box['ar_wall']:.2f} s)"
            progress(box.get("frac", 0.0), desc=text)
            ar_now = box["ar_image"] if "ar_image" in box and not shown else keep
            shown = shown or "ar_image" in box
            yield ar_now, keep, keep, keep, status(text)
        if "error" in box:
            yield keep, None, None, "", status(error_line(box["error"]), error=True)
            return
        r: Result = box["result"]
        yield (r.ar_image, r.method_image, r.heatmap, figures_html(r),
               status(f"done in {time.perf_counter() - started:.1f} s: speedup {r.speedup:.2f}x, "
                      f"{r.method_stats.mean_accepted_length:.2f} tokens per forward"))

    css = ("#sv-ar-image img, #sv-method-image img, #sv-heatmap img {image-rendering: pixelated}"
           " .sv-error {color: #b00020; font-weight: 600} #sv-figures td, #sv-figures th {padding: 2px 10px}")
    with gr.Blocks(title="specvis demo", analytics_enabled=False) as app:
        app.specvis_css = css
        gr.Markdown("## specvis: speculative decoding for autoregressive image generators\n"
                    "AR and the chosen method from the same seed, side by side.")
        with gr.Row():
            model_box = gr.Dropdown(models.offered, value=model, allow_custom_value=False, label="model",
                                    info="the models this page offers (chosen at launch)", elem_id="sv-model")
            condition_box = gr.Dropdown(first_classes, value=first_classes[0] if first_classes else "",
                                        allow_custom_value=True, label="class (or text prompt for text-to-image models)",
                                        elem_id="sv-condition")
            seed_box = gr.Number(value=0, precision=0, label="seed", elem_id="sv-seed")
        with gr.Row():
            method_box = gr.Dropdown(methods, value="sjd", label="method", elem_id="sv-method")
            options_box = gr.Textbox(value=DEFAULT_SPEC, label="method options (bench spec: key=value:key=value)",
                                     placeholder="window=16:coupling=maximal", elem_id="sv-options")
            accept_box = gr.Dropdown(available(ACCEPTANCE), value="exact", label="acceptance rule", elem_id="sv-accept")
            temperature_box = gr.Number(value=first_sampling.temperature if first_sampling else None,
                                        label="temperature (0: greedy)", elem_id="sv-temperature")
            cfg_box = gr.Number(value=first_sampling.cfg_scale if first_sampling else None, label="cfg scale",
                                elem_id="sv-cfg")
        button = gr.Button("Generate", variant="primary", elem_id="sv-generate")
        status_box = gr.HTML(status("ready"), elem_id="sv-status-box")
        with gr.Row():
            ar_image = gr.Image(type="pil", label="AR", interactive=False, elem_id="sv-ar-image")
            method_image = gr.Image(type="pil", label="accelerated", interactive=False, elem_id="sv-method-image")
            heatmap = gr.Image(type="pil", label="acceptance heatmap", interactive=False, elem_id="sv-heatmap")
        figures = gr.HTML("", elem_id="sv-figures-box")
        model_box.change(on_model, [model_box], [condition_box, temperature_box, cfg_box, status_box])
        button.click(on_generate, [model_box, condition_box, method_box, options_box, accept_box, seed_box,
                                   temperature_box, cfg_box],
                     [ar_image, method_image, heatmap, figures, status_box], concurrency_limit=1)
    return app


def serve(model: str | list[str] = "emoji", port: int = DEFAULT_PORT, host: str = "127.0.0.1", device: str = "cpu",
          block: bool = True):
    """Build the page and serve it on ``host:port``; ``block=False`` returns the app (``app.close()`` stops it).
    ``model``: the models offered besides the bundles (``build_app``)."""
    app = build_app(model, device)
    if port == 0:
        import socket

        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    app.launch(server_name=host, server_port=port, prevent_thread_lock=True, share=False, inbrowser=False,
               ssr_mode=False, show_error=False, quiet=True, css=app.specvis_css)
    print(f"specvis demo: http://{host}:{port}  (Ctrl+C stops it)", flush=True)
    if not block:
        return app
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        app.close()
    return app


def main(args: argparse.Namespace | list[str] | None = None) -> int:
    """Run ``specvis demo`` (a parsed namespace from ``add_parser``'s parser, or argv)."""
    if not isinstance(args, argparse.Namespace):
        parser = argparse.ArgumentParser(prog="specvis")
        add_parser(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(["demo", *(args or [])])
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    from .checks import device

    device(args.device, "--device")
    listen_address(args.host)
    try:
        serve(args.model or ["emoji"], args.port, args.host, args.device)
    except OSError as e:  # the address is not this machine's, the port is taken, ...
        raise ValueError(f"--host {args.host} --port {args.port}: cannot listen ({e.strerror or e})") from None
    return 0


def listen_address(host: str) -> str:
    """``--host``: ``localhost`` or an IP address (v4 or v6) to listen on, checked without a name lookup
    (a lookup would send a query off this machine). One line naming --host otherwise."""
    import ipaddress

    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"--host {host!r}: give an IP address to listen on (127.0.0.1, 0.0.0.0, ::) or "
                             "localhost") from None
    return host


if __name__ == "__main__":
    import sys

    try:
        sys.exit(main(sys.argv[1:]))
    except (ValueError, OSError) as e:
        print(f"specvis: error: {e}", file=sys.stderr)
        sys.exit(2)
