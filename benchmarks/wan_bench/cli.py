"""Command line of ``python -m benchmarks wan`` (kept free of heavy imports until it runs)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from benchmarks.wan_bench.parts import PART_NAMES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    parser.add_argument("--quick", action="store_true",
                        help="smaller model, fewer points (about three minutes; what the test runs)")
    parser.add_argument("--out", default="runs/bench-wan", help="directory for plots, logs and result.json")
    parser.add_argument("--parts", default=None,
                        help=f"comma-separated subset of {','.join(PART_NAMES)} (default: all; with --quick all but "
                             "e2e, which alone takes about four minutes even when small)")
    parser.add_argument("--e2e-modes", default=None,
                        help="comma-separated modes of part 5 among ideal,delta,full,delta_sf (default: "
                             "ideal,delta,full; delta_sf: actors wait for the regional manifest, no relay cache)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run_from_args(args: argparse.Namespace) -> dict[str, Any]:
    import json
    from dataclasses import replace

    from benchmarks.wan_bench.config import E2E_MODES, full_config, quick_config
    from benchmarks.wan_bench.runner import run

    if not args.quiet:
        logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(message)s")
        logging.getLogger("aurora.bench.wan").setLevel(logging.INFO)
    make = quick_config if args.quick else full_config
    overrides: dict[str, Any] = {"seed": args.seed}
    if args.parts is not None:
        overrides["parts"] = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    if args.e2e_modes is not None:
        modes = tuple(m.strip() for m in args.e2e_modes.split(",") if m.strip())
        unknown = sorted(set(modes) - set(E2E_MODES))
        if unknown or not modes:
            raise SystemExit(f"--e2e-modes: unknown {unknown or 'empty list'}; choose from {','.join(E2E_MODES)}")
        overrides["e2e"] = replace(make().e2e, modes=modes)
    cfg = make(**overrides)
    out = Path(args.out)
    result = run(cfg, out)
    (out / "result.json").write_text(json.dumps(result, indent=2))
    return result
