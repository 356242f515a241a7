"""The ``aurora`` command line.

Exit codes: 0 success; 1 a check found problems (``verify``) or ``gc`` refused; 2 bad input or a failed
operation (the message names the cause); 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import sys

from aurora_store import logs
from aurora_store.errors import AuroraError

EXIT_OK, EXIT_PROBLEMS, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130


def build_parser() -> argparse.ArgumentParser:
    from aurora_store.cli import deltas, keygen, layout, ops, plan

    parser = argparse.ArgumentParser(
        prog="aurora", description="Sparse delta checkpoints for RL policy weights.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 ok, 1 problems found (verify) or refused (gc), 2 error, 130 interrupted")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    deltas.register(sub)
    ops.register(sub)
    keygen.register(sub)
    plan.register(sub)
    layout.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure("aurora-cli", level=logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return int(args.handler(args) or EXIT_OK)
    except AuroraError as exc:
        print(f"aurora {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
