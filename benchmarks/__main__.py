"""Benchmarks that print one JSON object: ``python -m benchmarks {codec,transfer,...} --json``.

Run from the repository root: ``benchmarks`` sits beside the installed packages, not inside them (it may
import both ``aurora_store`` and ``workers``; the library never imports it).

Each benchmark module owns its options (``add_arguments``) and its run (``run_from_args``); they are imported
only when chosen, because some pull in vLLM or need root.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from aurora_store.errors import ConfigError, ObjectNotFoundError

BENCHMARKS: dict[str, tuple[str, str]] = {
    "codec": ("benchmarks.codec", "delta size and encode/apply speed on Adam-step deltas"),
    "transfer": ("benchmarks.transfer", "upload/download over 1 vs S streams: local S3 server and a directory"),
    "extract": ("benchmarks.extract", "sharded trainer: per-step extraction + upload, 1 vs N ranks"),
    "activate": ("benchmarks.activate", "vLLM: in-place activation vs a full weight reload (needs vLLM)"),
    "control_plane": ("benchmarks.control_plane", "control plane under N simulated actors: dispatch latency, "
                                                  "settles/s, Redis load, safety"),
    "vllm_backend": ("benchmarks.vllm_backend", "vLLM: the aurora backend's in-place scatter vs vLLM's NaN-masked "
                                                "sparse patch (needs vLLM)"),
    "logprob_check": ("benchmarks.logprob_check", "trainer's logprob check: honest bf16 noise, false rejections, "
                                                  "forged rollouts refused"),
    "scale": ("benchmarks.scale", "publish / activate / snapshot at real Qwen3 sizes, growth exponents"),
    "element_order": ("benchmarks.element_order", "gpt-oss-shaped experts: an element order's reordering copy and "
                                                  "position map vs a memcpy and a plain scatter"),
    "wan": ("benchmarks.wan_bench.cli", "delivery over emulated cross-region links: delta vs full, streams, "
                                        "cut-through, relays, end to end (needs root)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="bench", required=True)
    chosen = argv[0] if argv and argv[0] in BENCHMARKS else None
    for name, (module, help_text) in BENCHMARKS.items():
        subparser = sub.add_parser(name, help=help_text)
        if name == chosen:  # only the chosen one is imported (its options are all argparse needs)
            importlib.import_module(module).add_arguments(subparser)
    args = parser.parse_args(argv)
    try:
        result = importlib.import_module(BENCHMARKS[args.bench][0]).run_from_args(args)
    except (ConfigError, ObjectNotFoundError) as exc:  # bad options or input: said, not a traceback
        parser.exit(2, f"python -m benchmarks {args.bench}: error: {exc}\n")
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
