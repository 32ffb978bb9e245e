"""The server's Prometheus metrics (``prometheus-client``), one registry per engine so that several
servers in one process (tests) never share counters. Rates (images/s, tokens/s) are the counters'
``rate()`` in Prometheus."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 300)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
ACCEPT_BUCKETS = (1, 1.25, 1.5, 2, 2.5, 3, 4, 6, 8, 16)


class ServeMetrics:
    """Queue depth, rows in flight (now, and per round as a histogram), images, image tokens and target
    forwards, accepted length per image, time queued and total time per request, rejections by reason."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge("specvis_queue_depth", "images waiting for a row", registry=r)
        self.rows_in_flight = Gauge("specvis_rows_in_flight", "rows decoding an image now", registry=r)
        self.rows_per_round = Histogram("specvis_rows_per_round", "rows holding an image at each round boundary",
                                        buckets=ROW_BUCKETS, registry=r)
        self.images = Counter("specvis_images", "images generated", registry=r)
        self.tokens = Counter("specvis_image_tokens", "image tokens generated", registry=r)
        self.forwards = Counter("specvis_target_forwards", "target forwards taken by the images' rows", registry=r)
        self.accepted = Histogram("specvis_accepted_length", "mean accepted length per image (tokens per forward)",
                                  buckets=ACCEPT_BUCKETS, registry=r)
        self.queued = Histogram("specvis_queue_seconds", "seconds an image waited for a row",
                                buckets=LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("specvis_request_seconds", "seconds from a request's arrival to its last image",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.rejected = Counter("specvis_rejected_requests", "requests refused, by reason", ["reason"], registry=r)
        self.decodes = Counter("specvis_decodes", "decodes started, by the method they ran", ["method"], registry=r)
        self.rounds = Counter("specvis_auto_rounds", "rounds of auto decodes, by the method auto chose", ["method"],
                              registry=r)

    def text(self) -> bytes:
        return generate_latest(self.registry)
