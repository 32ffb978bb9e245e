"""The ``specvis serve`` command line (its parser imports nothing of the server: the ``serve`` extra is
needed only to run it)."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve", help="an image-generation server: OpenAI's images API with continuous batching (needs specvis[serve])",
        description="Serve one model over HTTP (OpenAI's POST /v1/images/generations, GET /v1/models, /health, "
                    "/metrics). Requests share the engine's rows (continuous batching); a request names only "
                    "the served model.")
    p.add_argument("--model", default="emoji", help="bundle name, checkpoint directory or Hub id, fixed at start")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one)")
    p.add_argument("--max-batch", type=int, default=8, help="rows decoded at once, 1..1024 (default 8)")
    p.add_argument("--max-queue", type=int, default=256, help="images waiting at most, 1..1000000 (default 256); "
                                                               "past it 429 with Retry-After")
    p.add_argument("--method", default="auto", help="auto (default: per decode, AR or SJD, whichever was "
                                                    "measured fastest at its rows) or a spec such as ar or "
                                                    "sjd:window=16")
    p.add_argument("--calibration-images", type=int, default=4,
                   help="images auto's start-up cost model times at each row count, 1..64 (default 4; fewer "
                        "start sooner, more choose more surely between methods close in speed)")
    p.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY (also SPECVIS_API_KEY)")
    p.add_argument("--grace", type=float, default=30.0, help="seconds to finish accepted work on SIGTERM (0..3600, default 30)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], help="weights and KV cache (default: the model's)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    return p



def main(a: argparse.Namespace) -> int:
    try:
        from . import server
    except ImportError as e:
        raise ValueError(f"specvis serve needs the serve extra: pip install 'specvis[serve]' ({e})") from None
    return server.main(a)
