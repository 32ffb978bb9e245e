"""``specvis.serve.ray``: two CPU replicas behind Ray Serve's proxy answer the official openai client.
Skipped only where Ray is not installed or cannot start here (the reason is given)."""

from __future__ import annotations

import base64
import io
import socket

import httpx
import openai
import pytest
from PIL import Image

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'specvis[ray]')")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_url():
    from ray import serve

    from specvis.serve.ray import deployment

    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    except Exception as e:  # the machine cannot run Ray: say why
        pytest.skip(f"Ray cannot start here: {e}")
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(deployment("emoji-t2i", num_replicas=2, num_cpus=1, max_batch=2, method="ar", threads=1,
                             calibration_images=1),
                  route_prefix="/", name="specvis")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_replicas_answer_the_openai_client(ray_url):
    c = openai.OpenAI(base_url=ray_url + "/v1", api_key="unused", max_retries=0, timeout=300)
    r = c.images.generate(model="emoji-t2i", prompt="a red heart", n=2, size="32x32", extra_body={"seed": 1})
    assert [Image.open(io.BytesIO(base64.b64decode(d.b64_json))).size for d in r.data] == [(32, 32)] * 2
    with pytest.raises(openai.BadRequestError):
        c.images.generate(prompt="x", n=0)
    pids = set()
    with httpx.Client(base_url=ray_url, timeout=60) as h:
        for _ in range(60):  # Ray's router spreads requests over the replicas
            pids.add(h.get("/health").json()["pid"])
            if len(pids) == 2:
                break
    assert len(pids) == 2
