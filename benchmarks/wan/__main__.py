"""``python -m benchmarks.wan cleanup``: remove namespaces and forwarders left by crashed harness runs."""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks.wan.netns import DEFAULT_PREFIX, cleanup_stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wan", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    clean = sub.add_parser("cleanup", help="delete stale aur-<pid>-* namespaces whose creating process is gone")
    clean.add_argument("--prefix", default=DEFAULT_PREFIX)
    clean.add_argument("--include-live", action="store_true", help="also those of running harnesses (careful)")
    args = parser.parse_args(argv)
    removed = cleanup_stale(args.prefix, include_live=args.include_live)
    json.dump({"removed": removed}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
