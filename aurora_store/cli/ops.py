"""``aurora verify``, ``aurora gc``, ``aurora status``: the operators' commands.

The logic lives in :mod:`aurora_store.ops`; this module parses arguments and formats reports.
"""

from __future__ import annotations

import argparse
import sys
import time

from aurora_store.config import CommandDefaults
from aurora_store.errors import ConfigError
from aurora_store.store import DeltaStore, open_bucket
from aurora_store.textfmt import emit_json, human_bytes

EXIT_OK, EXIT_PROBLEMS = 0, 1

VERIFY_EPILOG = """what is checked:
  every delta manifest parses and deltas/<v>.json declares version v; every layout named is stored;
  every segment named exists with the manifest's size; version v is based on v-1 and its
  base_weights_digest is v-1's weights_digest (or snapshot v-1's); every snapshot's files exist with
  their sizes, its digest matches delta v's, and a delta chain leads from it to the latest version.
  --deep also downloads and re-hashes every segment and snapshot file, decodes every segment, and
  replays the deltas from each snapshot, checking that they reproduce the next snapshot's digest.

examples:
  aurora verify runs/demo/buckets/us-east
  aurora verify 's3://runs/exp1?endpoint_url=http://127.0.0.1:8333' --deep
  aurora verify ./bucket --json | jq '.problems[] | select(.code == "segment_missing")'

exit codes: 0 clean; 1 problems found (each names the version, the object and the mismatch);
            2 error (bucket missing or empty, credentials, bad arguments)"""

GC_EPILOG = """what is kept:
  the newest N snapshots; every delta after the oldest kept snapshot, every segment those deltas name
  and every layout a kept manifest names; all history rows, run.json and runlog/ exports;
  segments no manifest names at all (they may belong to a version being published right now) unless
  --prune-orphans.
what is deleted, in this order (so no listed manifest ever names a deleted object):
  manifests of older snapshots, delta manifests up to the oldest kept snapshot, the older snapshots'
  files, segments only deleted deltas named, then layouts nothing kept names.
gc first checks the bucket like `aurora verify` and refuses, deleting nothing, if anything it would keep
is broken. Collect the source bucket before the regional ones (relays re-copy what a region lacks). On a
live run keep at least 2 snapshots: an actor that falls behind the oldest kept snapshot has to reload one.

examples:
  aurora gc runs/demo/buckets/us-east --keep-snapshots 2 --dry-run
  aurora gc 's3://runs/exp1?endpoint_url=http://127.0.0.1:8333' --keep-snapshots 3 --json

exit codes: 0 collected (or planned, with --dry-run); 1 refused: problems in what would be kept
            (listed; nothing deleted); 2 error"""

STATUS_EPILOG = """columns:
  actors: version = active version, staged = fetched and verified but not yet active, leases = leases
  held now, source = the bucket it reads (regional or source), heartbeat = age of its last heartbeat.
  relays: version = newest version forwarded, copied = bytes copied across regions, cache hits = hot
  cache hit ratio. States expire ~10 s after a process stops heartbeating.

examples:
  aurora status --redis redis://127.0.0.1:6379/0 --run demo
  aurora status --watch                       # AURORA_REDIS, the only run in it; Ctrl-C to stop
  aurora status --redis rediss://:secret@redis.internal:6380/0 --run exp1 --json

exit codes: 0 ok (also when --watch is stopped with Ctrl-C); 2 error (Redis unreachable, no such run)"""


def register(sub: argparse._SubParsersAction) -> None:
    env = CommandDefaults.from_env()
    fmt = argparse.RawDescriptionHelpFormatter
    verify = sub.add_parser("verify", help="check that every version in a bucket is complete and chained",
                            description="Check a bucket's manifests, segments, delta chain and snapshots.",
                            epilog=VERIFY_EPILOG, formatter_class=fmt)
    verify.add_argument("bucket", help="bucket directory or URL (file://, s3://, gs://, memory://)")
    verify.add_argument("--deep", action="store_true",
                        help="re-download and re-hash all bytes and replay the chain between snapshots")
    verify.add_argument("--json", action="store_true", help='print one JSON object {"ok", "problems", "checked"}')
    verify.add_argument("--public-key", default=env.trainer_public_key,
                        help="trainer's Ed25519 public key (file or base64): every manifest must be signed by it")
    verify.set_defaults(handler=cmd_verify)

    gc = sub.add_parser("gc", help="delete what no retained snapshot's chain needs",
                        description="Keep the newest N snapshots and everything needed to reach the latest "
                                    "version from them; delete the rest.",
                        epilog=GC_EPILOG, formatter_class=fmt)
    gc.add_argument("bucket", help="bucket directory or URL")
    gc.add_argument("--keep-snapshots", type=int, required=True, metavar="N", help="snapshots to keep (≥ 1)")
    gc.add_argument("--dry-run", action="store_true", help="print what would be deleted, delete nothing")
    gc.add_argument("--prune-orphans", action="store_true",
                    help="also delete segments no manifest names (only while no trainer publishes)")
    gc.add_argument("--grace", type=float, default=600.0, metavar="SECONDS",
                    help="never delete a segment written less than this long ago: a publish in progress may be "
                         "reusing it (default 600; a publish must finish within it)")
    gc.add_argument("--list", action="store_true", help="print every key deleted, not just the summary")
    gc.add_argument("--json", action="store_true", help="print one JSON object")
    gc.set_defaults(handler=cmd_gc)

    status = sub.add_parser("status", help="live table of actors, relays and the trainer",
                            description="Show the live states of one run from the Redis control plane.",
                            epilog=STATUS_EPILOG, formatter_class=fmt)
    status.add_argument("--redis", default=env.redis,
                        help="Redis URL (default: AURORA_REDIS)")
    status.add_argument("--run", default=env.run,
                        help="run name (default: AURORA_RUN, else the only run in Redis)")
    status.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    status.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    status.add_argument("--count", type=int, help="with --watch: stop after this many refreshes")
    status.add_argument("--json", action="store_true", help="print one JSON object (one per line with --watch)")
    status.set_defaults(handler=cmd_status)


def _store(url: str) -> DeltaStore:
    return DeltaStore(open_bucket(url))


# --- verify ----------------------------------------------------------------------------------------


def cmd_verify(args: argparse.Namespace) -> int:
    from aurora_store.ops.verify import verify_bucket

    hook = None
    if args.public_key:
        from aurora_store.trust import Verifier

        hook = Verifier.load(args.public_key)
    report = verify_bucket(_store(args.bucket), deep=args.deep, verify_manifest=hook)
    if args.json:
        emit_json(report.to_json())
        return EXIT_OK if report.ok else EXIT_PROBLEMS
    c = report.checked
    line = (f"checked {report.url}: {c['deltas']} delta(s), {c['snapshots']} snapshot(s), {c['segments']} "
            f"segment(s) ({human_bytes(c['segment_bytes'])}), {c['snapshot_files']} snapshot file(s), "
            f"{c['layouts']} layout(s)")
    if report.deep:
        line += (f"; deep: {human_bytes(c['hashed_bytes'])} of segments re-hashed, {c['replayed_versions']} "
                 f"version(s) replayed, {c['snapshots_reproduced']} snapshot(s) reproduced")
    print(line)
    if c.get("unreferenced_segments"):
        print(f"note: {c['unreferenced_segments']} segment(s) are named by no manifest (a publish in progress, or "
              f"leftovers `aurora gc --prune-orphans` removes)")
    if report.ok:
        print("OK")
        return EXIT_OK
    print(f"PROBLEMS ({len(report.problems)}):")
    for problem in report.problems:
        print(f"  {problem}")
    return EXIT_PROBLEMS


# --- gc --------------------------------------------------------------------------------------------


def cmd_gc(args: argparse.Namespace) -> int:
    from aurora_store.errors import GcRefusedError
    from aurora_store.ops.gc import Kind, collect_garbage

    try:
        report = collect_garbage(_store(args.bucket), args.keep_snapshots, dry_run=args.dry_run,
                                 prune_orphans=args.prune_orphans, grace_s=args.grace)
    except GcRefusedError as exc:
        if args.json:
            emit_json({"ok": False, "refused": True, "message": str(exc),
                       "problems": [p.to_json() for p in exc.problems]})
        else:
            print(f"aurora gc: {exc}", file=sys.stderr)
            for problem in exc.problems:
                print(f"  {problem}", file=sys.stderr)
        return EXIT_PROBLEMS
    if args.json:
        emit_json(report.to_json())
        return EXIT_OK
    plan = report.plan
    verb = "would delete" if report.dry_run else "deleted"
    kept = f"deltas {plan.kept_deltas[0]}..{plan.kept_deltas[-1]}" if plan.kept_deltas else "no deltas"
    print(f"{plan.url}: keeping snapshot(s) {_versions(plan.retained_snapshots) or 'none'} "
          f"(newest {plan.keep_snapshots}) and {kept}")
    sections: tuple[tuple[Kind, str, str], ...] = (
            ("snapshot_manifest", "snapshot manifest(s)", _versions(plan.removed_snapshots)),
            ("delta_manifest", "delta manifest(s)", _versions(plan.removed_deltas)),
            ("snapshot_file", "snapshot file(s)", ""), ("segment", "segment(s)", ""),
            ("orphan_segment", "orphan segment(s)", ""), ("layout", "layout(s)", ""))
    for kind, label, detail in sections:
        items = plan.of_kind(kind)
        if items:
            print(f"  {verb} {len(items)} {label}{f' ({detail})' if detail else ''}: "
                  f"{human_bytes(sum(d.size for d in items))}")
            if args.list:
                for d in items:
                    print(f"    {d.key}  {d.size}")
    if plan.orphan_segments and not plan.prune_orphans:
        print(f"  kept {len(plan.orphan_segments)} orphan segment(s) named by no manifest (--prune-orphans)")
    print(f"{'would free' if report.dry_run else 'freed'} {human_bytes(plan.bytes_freed)} in "
          f"{len(plan.deletions)} object(s){' (dry run: nothing deleted)' if report.dry_run else ''}")
    return EXIT_OK


def _versions(versions: tuple[int, ...]) -> str:
    if not versions:
        return ""
    if len(versions) > 3 and versions == tuple(range(versions[0], versions[-1] + 1)):
        return f"{versions[0]}..{versions[-1]}"
    return ", ".join(map(str, versions))


# --- status ----------------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    from aurora_store.bus import ControlPlane
    from aurora_store.ops.status import read_status, render_status, resolve_run

    if not args.redis:
        raise ConfigError("no Redis URL: pass --redis or set AURORA_REDIS")
    if args.interval <= 0:
        raise ConfigError("--interval must be positive")
    plane = ControlPlane(args.redis, resolve_run(args.redis, args.run), wait_s=2.0)
    clear = args.watch and not args.json and sys.stdout.isatty()
    shown = 0
    try:
        while True:
            status = read_status(plane)
            if args.json:
                emit_json(status.to_json())
            else:
                if clear:
                    sys.stdout.write("\x1b[H\x1b[2J")
                print(render_status(status))
                if args.watch:
                    print()
            sys.stdout.flush()
            shown += 1
            if not args.watch or (args.count is not None and shown >= args.count):
                return EXIT_OK
            time.sleep(args.interval)
    except KeyboardInterrupt:
        if args.watch:
            return EXIT_OK
        raise
    finally:
        plane.close()
