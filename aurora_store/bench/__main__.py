"""Benchmarks that print one JSON object: ``python -m aurora_store.bench {codec,...} --json``."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aurora_store.bench", description=__doc__)
    sub = parser.add_subparsers(dest="bench", required=True)
    codec = sub.add_parser("codec", help="delta size and encode/apply speed on Adam-step deltas")
    codec.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    codec.add_argument("--lr", type=float, default=1e-6)
    codec.add_argument("--warmup", type=int, default=4)
    codec.add_argument("--repeats", type=int, default=3)
    codec.add_argument("--segment-bytes", type=int, default=4 << 20)
    codec.add_argument("--small", action="store_true", help="a ~20M-parameter model (quick check)")
    args = parser.parse_args(argv)
    if args.bench == "codec":
        from aurora_store.bench import codec as bench
        from aurora_store.bench.synthetic import QWEN3_BENCH_CONFIG

        config = dict(QWEN3_BENCH_CONFIG)
        if args.small:
            config.update(num_hidden_layers=1, vocab_size=4096)
        result = bench.run(config, lr=args.lr, warmup=args.warmup, repeats=args.repeats,
                           segment_bytes=args.segment_bytes)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
