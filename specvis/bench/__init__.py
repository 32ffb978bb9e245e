"""Benchmark harness: speed, acceptance and (later) quality of every method on one pipeline."""

from .runner import run_bench

__all__ = ["run_bench"]
