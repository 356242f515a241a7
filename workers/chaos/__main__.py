"""``make chaos``: run every scenario and print, as the last line, one JSON object with the figures."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from aurora_store import logs
from workers import lifecycle
from workers.chaos.harness import ScenarioResult
from workers.chaos.scenarios import SCENARIOS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.chaos", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="shorter runs (what make test uses)")
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), help="run only these scenarios")
    parser.add_argument("--keep", metavar="DIR", help="keep run directories (logs, buckets) under DIR")
    args = parser.parse_args(argv)
    logs.configure("chaos", level=30)
    # SIGTERM/SIGINT unwind through the running scenario's `with` blocks, which stop its cluster and servers.
    life = lifecycle.install("chaos", harness=True)
    return life.run(lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    root = Path(args.keep or tempfile.mkdtemp(prefix="aurora-chaos-"))
    results: dict[str, dict] = {}
    try:
        for name in args.only or SCENARIOS:
            started = time.monotonic()
            print(f"chaos: {name} …", file=sys.stderr, flush=True)
            try:
                result = SCENARIOS[name](root / name, args.quick)
            except Exception as exc:  # a scenario that crashes is a failed scenario, reported like the others
                result = ScenarioResult(name, [], invariants={"scenario_completed": False},
                                        notes=[f"{type(exc).__name__}: {exc}", traceback.format_exc()[-2000:]])
            doc = result.as_dict()
            doc["seconds"] = round(time.monotonic() - started, 1)
            results[name] = doc
            print(f"chaos: {name}: {'ok' if result.all_held else 'FAILED'} ({doc['seconds']}s) {doc['figures']}",
                  file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    held = all(r["invariants_held"] for r in results.values())
    print(json.dumps({"scenarios": results, "all_invariants_held": held}, default=str), flush=True)
    return 0 if held else 1


if __name__ == "__main__":
    raise SystemExit(main())
