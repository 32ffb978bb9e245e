"""Benchmark harness: speed, acceptance and quality of every method on one pipeline."""

from .report import markdown_table, merge_reports
from .runner import run_bench

__all__ = ["run_bench", "markdown_table", "merge_reports"]
