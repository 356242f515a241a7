"""The benchmarks' own error root.

Benchmarks are tools above the library: their failures (no root for network namespaces, a forwarder that
died, bad statistics) are not Aurora errors. Each error also subclasses the builtin a caller would catch.
"""

from __future__ import annotations


class BenchmarkError(Exception):
    """Root of every error raised by the benchmarks and their WAN harness."""
