"""``specvis serve`` through the official ``openai`` client against a server on 127.0.0.1 and a free port
(uvicorn in a thread, ``serve_harness.Served``): images, n, sizes, formats, specvis's body fields,
streaming, errors as the client's exceptions, 32 concurrent mixed requests sharing rows, FIFO, the
queue bound, the API key, disconnects, and SIGTERM on a ``specvis serve`` process."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from PIL import Image

from serve_harness import Served
from specvis.serve.engine import Key, Ticket

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def t2i():
    with Served("emoji-t2i", max_batch=4, method="ar") as s:
        yield s


@pytest.fixture(scope="module")
def guarded():
    with Served("emoji", max_batch=2, max_queue=2, method="ar", api_key="sekrit") as s:
        yield s


def picture(b64: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(b64)))


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def wait_idle(engine, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not engine.idle:
        assert time.monotonic() < deadline, "the engine did not go idle"
        time.sleep(0.05)


def test_images_of_the_asked_size_n_and_body_fields(t2i):
    r = t2i.client().images.generate(model="emoji-t2i", prompt="a red heart", n=2, size="32x32",
                                      extra_body={"seed": 5, "method": "sjd:window=8", "guidance_scale": 2.0,
                                                  "temperature": 0.9, "top_k": 100, "top_p": 0.95,
                                                  "negative_prompt": "a blue square"})
    assert len(r.data) == 2
    for k, d in enumerate(r.data):
        image = picture(d.b64_json)
        assert (image.format, image.size) == ("PNG", (32, 32))
        info = d.model_extra["specvis"]
        assert info["seed"] == 5 + k
        assert info["method"].startswith("sjd") and "window=8" in info["method"]
        assert 0 < info["target_forwards"] <= 64 and info["mean_accepted_length"] == 64 / info["target_forwards"]
        assert info["queued_s"] >= 0 and info["decode_s"] > 0


@pytest.mark.parametrize("fmt,pil", [("jpeg", "JPEG"), ("webp", "WEBP")])
def test_output_formats(t2i, fmt, pil):
    r = t2i.client().images.generate(prompt="a cat", size="48x48", output_format=fmt)
    image = picture(r.data[0].b64_json)
    assert (image.format, image.size) == (pil, (48, 48))


def test_class_models_take_a_class_name_or_number(guarded):
    c = guarded.client(api_key="sekrit")
    names = guarded.pipe.class_names
    for prompt in (names[2].upper(), "2"):
        r = c.images.generate(prompt=prompt, size="64x64")
        assert picture(r.data[0].b64_json).size == (64, 64)
    with pytest.raises(openai.BadRequestError, match="class-conditional"):
        c.images.generate(prompt="a cat")


def test_streaming_yields_partial_images_then_the_image(t2i):
    events = list(t2i.client().images.generate(prompt="a smiling face", size="32x32", stream=True, partial_images=2))
    assert [e.type for e in events] == ["image_generation.partial_image"] * 2 + ["image_generation.completed"]
    assert [e.partial_image_index for e in events[:2]] == [0, 1]
    first, last = picture(events[0].b64_json), picture(events[-1].b64_json)
    assert first.size == last.size == (32, 32)
    assert first.getpixel((16, 31)) == (128, 128, 128)  # the rows not committed yet are grey


BAD = [  # (body, status, field or text the one-line message names)
    (b"{", 400, "JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"prompt": 3}', 400, "prompt"),
    (b'{"prompt": "x", "n": 0}', 400, "n"),
    (b'{"prompt": "x", "n": 1000000}', 400, "n"),
    (b'{"prompt": "x", "n": "2"}', 400, "n"),
    (b'{"prompt": "x", "n": 1.5}', 400, "n"),
    (b'{"prompt": "x", "model": "dall-e-3"}', 404, "model"),
    (b'{"prompt": "x", "size": "1024x1024"}', 400, "32x32"),
    (b'{"prompt": "x", "method": "nope"}', 400, "method"),
    (b'{"prompt": "x", "method": "eagle"}', 400, "method"),
    (b'{"prompt": "x", "seed": -1}', 400, "seed"),
    (b'{"prompt": "x", "guidance_scale": NaN}', 400, "NaN"),
    (b'{"prompt": "x", "guidance_scale": 1e999}', 400, "guidance_scale"),
    (b'{"prompt": "x", "temperature": -1}', 400, "temperature"),
    (b'{"prompt": "x", "top_p": 0}', 400, "top_p"),
    (b'{"prompt": "x", "top_k": true}', 400, "top_k"),
    (b'{"prompt": "x", "response_format": "url"}', 400, "response_format"),
    (b'{"prompt": "x", "output_format": "gif"}', 400, "output_format"),
    (b'{"prompt": "x", "partial_images": 4}', 400, "partial_images"),
    (b'{"prompt": "x", "stream": "yes"}', 400, "stream"),
    (b'{"prompt": "x", "timeout": 0}', 400, "timeout"),
    (b'{"prompt": "x", "colour": "red"}', 400, "colour"),
    (b'{"prompt": ""}', 400, "prompt"),
    (b'{"prompt": "' + b"x" * 5000 + b'"}', 400, "prompt"),
    (b'{"prompt": "' + b"word " * 700 + b'"}', 400, "prompt"),  # under the characters' bound, over the model's tokens
    (b'{"prompt": "' + b"x" * 70000 + b'"}', 413, "bytes"),
    (b"[" * 5000, 400, "JSON"),  # nested past Python's recursion limit
    (b'{"prompt": "x", "temperature": 1e-300}', 400, "temperature"),
    (b'{"prompt": "x", "method": "' + b"m" * 5000 + b'"}', 400, "method"),
    (b'{"prompt": "x", "' + b"k" * 5000 + b'": 1}', 400, "unknown field"),
]


def test_bad_requests_are_one_line_4xx_and_the_server_keeps_serving(t2i):
    with httpx.Client(base_url=t2i.url, timeout=60) as h:
        for body, status, named in BAD:
            r = h.post("/v1/images/generations", content=body, headers={"content-type": "application/json"})
            assert r.status_code == status, (body[:60], r.text)
            message = r.json()["error"]["message"]
            assert named.lower() in message.lower() and "\n" not in message and len(message) < 400, (body[:60], message)
        r = h.get("/nowhere")
        assert r.status_code == 404 and "error" in r.json()
    c = t2i.client()
    with pytest.raises(openai.BadRequestError):
        c.images.generate(prompt="x", n=0)
    with pytest.raises(openai.NotFoundError):
        c.images.generate(prompt="x", model="dall-e-3")
    r = c.images.generate(prompt="a sun", size="32x32")
    assert picture(r.data[0].b64_json).size == (32, 32)


def test_a_request_past_its_timeout_is_408_and_freed(t2i):
    with httpx.Client(base_url=t2i.url, timeout=60) as h:
        r = h.post("/v1/images/generations", json={"prompt": "a cat", "size": "64x64", "timeout": 0.05})
    assert r.status_code == 408 and r.json()["error"]["code"] == "timeout"
    wait_idle(t2i.engine)


def test_an_image_is_a_function_of_its_seed_alone_or_among_others_as_offline(t2i):
    """Keyed noise: image k of a request with seed s is offline ``pipe(..., seed=s)``'s image k (AR under
    the same sampling), served alone with SJD or admitted into a running decode among other requests."""
    import numpy as np

    import specvis as sv
    from specvis.serve.images import render

    pipe = sv.load("emoji-t2i")
    sampling = dataclasses.replace(pipe.default_sampling, noise="keyed")
    out = pipe(prompts=["a red heart"] * 2, sampling=sampling, seed=40, height=8, width=8, method="ar", decode=False)
    want = [np.asarray(render(pipe, out.tokens[k], (8, 8))) for k in range(2)]
    c = t2i.client()

    def ours(method: str) -> list:
        r = c.images.generate(prompt="a red heart", n=2, size="32x32", extra_body={"seed": 40, "method": method})
        return [np.asarray(picture(d.b64_json).convert("RGB")) for d in r.data]

    wait_idle(t2i.engine)
    assert all(np.array_equal(a, b) for a, b in zip(ours("sjd"), want))  # alone
    assert all(np.array_equal(a, b) for a, b in zip(ours("auto"), want))  # auto on a server pinned to AR
    others = [threading.Thread(target=lambda i=i: c.images.generate(
        prompt=("a cat", "a sun", "a dog")[i % 3], n=2, size="32x32", extra_body={"seed": 7 + 9 * i, "method": "sjd"}))
        for i in range(4)]
    for t in others:
        t.start()
    deadline = time.monotonic() + 60
    while metric(t2i.engine.metrics.text().decode(), "specvis_rows_in_flight") < 1:  # ours comes while theirs decode
        assert time.monotonic() < deadline
        time.sleep(0.01)
    among = ours("sjd")
    for t in others:
        t.join(120)
    assert all(np.array_equal(a, b) for a, b in zip(among, want))


def test_32_concurrent_mixed_requests_complete_sharing_rows(t2i):
    c = t2i.client()
    before = t2i.engine.metrics.text().decode()
    results, errors = {}, []

    def one(i: int) -> None:
        try:
            n, size, method = 1 + i % 2, ("32x32", "48x48")[i % 8 == 7], ("ar", "sjd")[i % 3 == 0]
            r = c.images.generate(prompt=("a red heart", "a cat", "a sun")[i % 3], n=n, size=size,
                                  extra_body={"seed": i, "method": method})
            results[i] = (n, size, [picture(d.b64_json).size for d in r.data])
        except Exception as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors and len(results) == 32
    for n, size, sizes in results.values():
        w, h = map(int, size.split("x"))
        assert sizes == [(w, h)] * n
    after = t2i.engine.metrics.text().decode()
    rounds = metric(after, "specvis_rows_per_round_count") - metric(before, "specvis_rows_per_round_count")
    single = metric(after, 'specvis_rows_per_round_bucket{le="1.0"}') - metric(before, 'specvis_rows_per_round_bucket{le="1.0"}')
    assert rounds > 0 and single < rounds  # some rounds decoded more than one row
    images = metric(after, "specvis_images_total") - metric(before, "specvis_images_total")
    assert images == sum(n for n, _, _ in results.values())


def test_no_request_waits_behind_a_later_one(t2i):
    """FIFO over mixed keys: images start in the order their requests were queued."""
    engine = t2i.engine
    wait_idle(engine)
    starts, lock = {}, threading.Lock()

    def sink(i):
        def put(event):
            if event[0] == "image":
                with lock:
                    starts[(i, event[1])] = event[3]["queued_s"] + jobs[i].arrived
        return put

    served = t2i.app.state.served
    jobs = []
    for i in range(10):
        sampling = served.default_sampling if i % 3 else dataclasses.replace(served.default_sampling, cfg_scale=2.0)
        grid = served.sizes[("32x32", "48x48")[i % 2]]
        jobs.append(Ticket("a cat", 1 + i % 2, i, Key(("ar", "sjd")[i % 4 == 0], sampling, grid), sink(i)))
    for job in jobs:
        engine.submit(job)
    wait_idle(engine)
    deadline = time.monotonic() + 60
    while len(starts) < sum(j.n for j in jobs) and time.monotonic() < deadline:
        time.sleep(0.05)
    order = [starts[(i, k)] for i, job in enumerate(jobs) for k in range(job.n)]
    assert order == sorted(order)


def test_key_queue_bound_and_health(guarded):
    with httpx.Client(base_url=guarded.url, timeout=60) as h:
        assert h.get("/health").status_code == 200  # no key needed
        for path in ("/v1/models", "/metrics"):
            r = h.get(path)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            assert h.get(path, headers={"authorization": "Bearer sekrit-not"}).status_code == 401
            assert h.get(path, headers={"authorization": "Bearer sekrit"}).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        guarded.client(api_key="wrong").images.generate(prompt="1")
    with pytest.raises(openai.RateLimitError) as e:
        guarded.client(api_key="sekrit").images.generate(prompt="1", n=3)  # more images than the queue holds
    assert e.value.response.headers["retry-after"] == "1"
    assert 'specvis_rejected_requests_total{reason="queue_full"} 1.0' in guarded.engine.metrics.text().decode()


def test_a_client_that_leaves_frees_its_rows(t2i):
    """A stream closed after its first partial image: its row is freed at the next round boundary
    (the decode ends long before the image's 256 rounds) and no image is counted."""
    engine = t2i.engine
    wait_idle(engine)
    before = engine.metrics.text().decode()
    with httpx.Client(base_url=t2i.url, timeout=60) as h:
        with h.stream("POST", "/v1/images/generations",
                      json={"prompt": "a cat", "size": "64x64", "stream": True, "partial_images": 3}) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    assert json.loads(line[5:])["type"] == "image_generation.partial_image"
                    break
    wait_idle(engine)
    after = engine.metrics.text().decode()
    assert metric(after, "specvis_images_total") == metric(before, "specvis_images_total")
    rounds = metric(after, "specvis_rows_per_round_count") - metric(before, "specvis_rows_per_round_count")
    assert 64 <= rounds < 200  # the first partial is due at 64 of 256 tokens


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))


def load_round(c, url: str) -> None:
    """Four requests of two images and two streams left after their first partial image, at once."""
    def leave():
        with httpx.stream("POST", url + "/v1/images/generations", headers={"authorization": "Bearer k"}, timeout=120,
                          json={"prompt": "a cat", "size": "48x48", "stream": True, "partial_images": 2}) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    return

    work = [lambda: c.images.generate(prompt="a sun", size="32x32", n=2) for _ in range(4)] + [leave, leave]
    threads = [threading.Thread(target=w) for w in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)


def test_sigterm_drains_answers_every_accepted_request_and_exits_0():
    """A ``specvis serve`` process under load (no leak over two rounds of requests and disconnects),
    then SIGTERM: new requests get 503, every accepted one gets its images, exit status 0."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "SPECVIS_API_KEY": "k"}
    proc = subprocess.Popen([sys.executable, "-m", "specvis.cli", "serve", "--model", "emoji-t2i", "--port", str(port),
                             "--max-batch", "2", "--method", "ar", "--grace", "120", "--threads", "1",
                             "--calibration-images", "1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # a bound, not a timing: the start measures auto's cost model
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.2)
        c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=300)
        load_round(c, url)  # no leak: a second round of the same load leaves the resident memory within 10%
        first = rss_kib(proc.pid)
        load_round(c, url)
        assert rss_kib(proc.pid) <= 1.1 * first
        answers, errors = [], []

        def one(i):
            try:
                answers.append(len(c.images.generate(prompt="a sun", size="64x64", n=2).data))
            except Exception as e:  # reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        while not re.search(r"^specvis_rows_in_flight [1-9]", httpx.get(url + "/metrics", headers={
                "authorization": "Bearer k"}).text, re.M):
            assert time.monotonic() < deadline + 60
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        late = httpx.post(url + "/v1/images/generations", json={"prompt": "a sun"}, headers={"authorization": "Bearer k"},
                          timeout=30)
        assert late.status_code == 503 and "shutting down" in late.json()["error"]["message"]
        for t in threads:
            t.join(300)
        assert proc.wait(120) == 0
        assert not errors and answers == [2, 2, 2]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_auto_takes_the_method_measured_fastest_at_the_rows_of_the_decode():
    import specvis as sv
    from specvis.serve.engine import Engine

    engine = Engine(sv.load("emoji"), max_batch=8, method="auto")
    engine.costs = {"ar": {1: 2.0, 2: 1.2, 4: 0.7, 8: 0.5}, "sjd": {1: 1.0, 2: 0.9, 4: 0.8, 8: 0.8},
                    "sjd:init=vertical-sample": {1: 0.9, 2: 1.0, 4: 0.9, 8: 0.9}}
    assert [engine.choose(r) for r in (1, 2, 3, 4, 6, 8)] == ["sjd:init=vertical-sample", "sjd", "ar", "ar", "ar", "ar"]
    # a decode of R rows runs the candidate chosen at R (its spec reported; a pinned spec runs as asked)
    sampling = dataclasses.replace(engine.pipe.default_sampling, noise="keyed")
    for rows, spec in ((1, "sjd:init=vertical-sample"), (2, "sjd"), (5, "ar")):
        method, name = engine._resolve("auto", sampling, rows)
        assert name == spec and method.name == spec.split(":")[0] and engine._auto_method == spec
    assert engine._resolve("sjd:window=8", sampling, 1)[1] == "sjd:window=8" and engine._auto_method is None


def test_the_cost_model_times_each_row_count_on_several_seeds_the_candidates_in_turn():
    """At one row a single image misleads (random-init SJD wins on seed 0 here, vertical-sample on every
    other): the cost model averages ``CALIBRATION_IMAGES`` images per row count, new seeds per decode, each
    decode's seeds timed under every candidate in turn."""
    import specvis as sv
    from specvis.serve.engine import AUTO_CANDIDATES, CALIBRATION_IMAGES, Engine

    engine = Engine(sv.load("emoji"), max_batch=8, method="auto", calibration_seed=10)
    per_image = {"ar": lambda s: 2.0, "sjd": lambda s: 1.0 if s == 10 else 1.2,
                 "sjd:init=vertical-sample": lambda s: 1.1 if s == 10 else 0.9}
    calls = []

    def fake(spec, rows, sampling, seed):
        calls.append((spec, rows, seed))
        return sum(per_image[spec](seed + k) / rows ** 0.5 for k in range(rows))
    engine._time_decode = fake
    costs = engine.costs = engine._measure(engine.pipe.default_sampling)
    timed = calls[2:]  # after one untimed warm-up decode of ar and one of sjd
    assert [c[0] for c in calls[:2]] == ["ar", "sjd"]
    expected = [(spec, r, 10 + d * r) for r in (1, 2, 4, 8) for d in range(-(-CALIBRATION_IMAGES // r))
                for spec in AUTO_CANDIDATES]
    assert timed == expected
    assert costs["sjd"][1] == pytest.approx((1.0 + 1.2 * 3) / 4) and costs["ar"][8] == pytest.approx(2.0 / 8 ** 0.5)
    assert engine.choose(1) == "sjd:init=vertical-sample"


@pytest.mark.parametrize("method", ["auto", "sjd:window=8"])
def test_auto_measures_its_cost_model_at_start_and_serves_with_it(method):
    """Whatever the server's method, the cost model is measured at start, and a request asking for auto
    runs the candidate it chooses at one row (a decode of one request of one image holds one row)."""
    from specvis.serve.engine import AUTO_CANDIDATES

    with Served("emoji-t2i", max_batch=2, method=method) as s:
        costs = s.engine.costs
        assert set(costs) == set(AUTO_CANDIDATES) and all(set(t) == {1, 2} and min(t.values()) > 0 for t in costs.values())
        r = s.client().images.generate(prompt="a cat", size="32x32", extra_body={"method": "auto"})
        assert r.data[0].model_extra["specvis"]["method"] == "auto"
        text = s.engine.metrics.text().decode()
        assert metric(text, f'specvis_auto_rounds_total{{method="{s.engine.choose(1)}"}}') > 0


@pytest.mark.parametrize("flags,named", [(["--max-batch", "0"], "max_batch"), (["--max-queue", "-1"], "max_queue"),
                                         (["--method", "nope"], "nope"), (["--method", "eagle"], "eagle"),
                                         (["--port", "70000"], "port"), (["--grace", "-1"], "grace"),
                                         (["--threads", "0"], "threads"), (["--model", "nosuchmodel"], "nosuchmodel"),
                                         (["--calibration-images", "0"], "calibration_images"),
                                         (["--calibration-images", "65"], "calibration_images")])
def test_bad_serve_flags_exit_2_with_one_line(flags, named):
    r = subprocess.run([sys.executable, "-m", "specvis.cli", "serve", *flags], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and named in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
