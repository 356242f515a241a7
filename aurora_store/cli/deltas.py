"""``aurora diff``, ``aurora patch``, ``aurora log``: deltas between safetensors files and a bucket."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from aurora_store.codec import CodecParams, ModelLayout, TensorTarget, digest_state, pieces_from_states
from aurora_store.codec.weights_digest import WeightsDigest
from aurora_store.config import CommandDefaults, TransferSettings
from aurora_store.errors import AuroraError, ConfigError, LayoutError, VersionExistsError, VersionNotFoundError
from aurora_store.follow import BucketChain, Follower
from aurora_store.store import DeltaStore, object_names, open_bucket
from aurora_store.store.publisher import VersionPublisher
from aurora_store.textfmt import emit_json, human_bytes, table
from aurora_store.trust import Signer, manifest_check

DIFF_EPILOG = """examples:
  aurora diff step4.safetensors step5.safetensors --out ./bucket --version 5 --base 4 --config config.json
  aurora diff a.safetensors b.safetensors --out 's3://runs/exp1?endpoint_url=http://127.0.0.1:8333' \\
      --version 1 --base 0"""
PATCH_EPILOG = """examples:
  aurora patch ./bucket 5 --base-file step4.safetensors --out step5.safetensors
  aurora patch ./bucket 9 --base-file step4.safetensors --base 4 --out step9.safetensors   # replays 5..9"""
LOG_EPILOG = """examples:
  aurora log ./bucket
  aurora log 's3://runs/exp1?endpoint_url=http://127.0.0.1:8333' --json"""


def register(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    env = CommandDefaults.from_env()
    diff = sub.add_parser("diff", help="write the delta NEW - OLD as version V into a bucket",
                          description="Encode the changed bf16/fp16 elements of NEW relative to OLD and publish "
                                      "them as version V (based on B) into DIR_OR_URL.",
                          epilog=DIFF_EPILOG, formatter_class=fmt)
    diff.add_argument("old", help="base weights (.safetensors, training names)")
    diff.add_argument("new", help="new weights (.safetensors, same tensors)")
    diff.add_argument("--out", required=True, help="bucket: directory, file://, s3://, gs:// or memory:// URL")
    diff.add_argument("--version", type=int, required=True, help="version number to publish (≥ 1)")
    diff.add_argument("--base", type=int, required=True, help="version OLD corresponds to (< V)")
    diff.add_argument("--config", help="HF config.json: ship in the fused inference layout (qkv_proj, gate_up_proj)")
    diff.add_argument("--segment-bytes", type=int, default=CodecParams().segment_bytes)
    diff.add_argument("--values", choices=["delta16", "raw"], default="delta16")
    diff.add_argument("--no-entropy", action="store_true", help="skip the zstd stage")
    diff.add_argument("--streams", type=int, help="parallel upload streams (default AURORA_STREAMS or 4)")
    diff.add_argument("--signing-key", default=env.signing_key,
                      help="trainer's Ed25519 signing key (file or base64; default AURORA_SIGNING_KEY): sign the "
                           "manifest")
    diff.add_argument("--run", default=env.run,
                      help="run name recorded (and signed) in the manifest's producer (default AURORA_RUN)")
    diff.add_argument("--json", action="store_true", help="print one JSON object")
    diff.set_defaults(handler=cmd_diff)

    patch = sub.add_parser("patch", help="apply published versions to a safetensors file",
                           description="Reproduce version V bit for bit from a base file and the bucket.",
                           epilog=PATCH_EPILOG, formatter_class=fmt)
    patch.add_argument("bucket", help="bucket directory or URL")
    patch.add_argument("version", type=int)
    patch.add_argument("--base-file", required=True, help=".safetensors holding the base version")
    patch.add_argument("--base", type=int, help="version of --base-file (default: V's declared base)")
    patch.add_argument("--out", required=True, help="output .safetensors")
    patch.add_argument("--streams", type=int)
    patch.add_argument("--public-key", default=env.trainer_public_key,
                       help="trainer's Ed25519 public key (file or base64; default AURORA_TRAINER_PUBLIC_KEY): every "
                            "manifest applied must be signed by it, checked before any segment is fetched")
    patch.add_argument("--run", default=env.run,
                       help="refuse manifests whose producer names another run (default AURORA_RUN)")
    patch.add_argument("--json", action="store_true")
    patch.set_defaults(handler=cmd_patch)

    log = sub.add_parser("log", help="list published versions with sizes and densities",
                         epilog=LOG_EPILOG, formatter_class=fmt)
    log.add_argument("bucket")
    log.add_argument("--json", action="store_true")
    log.set_defaults(handler=cmd_log)


def load_safetensors(path: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    try:
        with safe_open(path, framework="pt") as handle:
            return {k: handle.get_tensor(k) for k in handle.keys()}, dict(handle.metadata() or {})  # noqa: SIM118
    except FileNotFoundError:
        raise ConfigError(f"no such file: {path}") from None
    except Exception as exc:  # safetensors raises its own SafetensorError for malformed files
        if isinstance(exc, AuroraError):
            raise
        raise ConfigError(f"{path} is not a readable safetensors file: {exc}") from None


def _settings(streams: int | None) -> TransferSettings:
    return TransferSettings.from_env().with_overrides(streams=streams)


def cmd_diff(args: argparse.Namespace) -> int:
    # Preflight: everything that can be refused is refused before the first byte is written to the bucket.
    if args.version < 1 or not 0 <= args.base < args.version:
        raise ConfigError(f"need 0 <= --base < --version, got base {args.base}, version {args.version}")
    object_names.delta(args.version)  # raises for a version outside the 12-digit range
    old, _ = load_safetensors(args.old)
    new, _ = load_safetensors(args.new)
    if set(old) != set(new):
        raise LayoutError(f"{args.old} and {args.new} hold different tensors: "
                          f"{sorted(set(old) ^ set(new))[:8]}")
    layout = ModelLayout.from_config_file(args.config) if args.config else ModelLayout.identity(old)
    layout.check_state(old)
    layout.check_state(new)
    sign = Signer.load(args.signing_key) if args.signing_key else None
    settings = _settings(args.streams)
    store = DeltaStore(open_bucket(args.out, create=True, settings=settings), settings)
    base_digest = digest_state(layout, old)
    if store.bucket.exists(object_names.delta(args.version)):
        raise VersionExistsError(f"version {args.version} is already published in {store.url}")
    _check_base_matches_bucket(store, args.base, base_digest, args.old)
    params = CodecParams(segment_bytes=args.segment_bytes, values=args.values,
                         entropy="none" if args.no_entropy else "zstd")
    producer = {"tool": "aurora diff", "old": os.path.basename(args.old), "new": os.path.basename(args.new)}
    if args.run:
        producer["run"] = args.run
    publisher = VersionPublisher(store, layout, params, settings.streams, producer=producer, sign=sign)
    report = publisher.publish(args.version, args.base, base_digest, pieces_from_states(layout, old, new))
    m = report.manifest
    doc = {"version": m.version, "base_version": m.base_version, "changed": m.changed_total,
           "elements": m.elements, "density": m.density, "segments": report.segments,
           "delta_bytes": report.total_bytes, "full_bytes": layout.nbytes,
           "bytes_per_changed": report.total_bytes / m.changed_total if m.changed_total else None,
           "weights_digest": m.weights_digest, "encode_s": report.encode_s, "publish_s": report.total_s,
           "bucket": store.url}
    if args.json:
        emit_json(doc)
    else:
        print(f"published version {m.version} (base {m.base_version}) to {store.url}: "
              f"{m.changed_total} of {m.elements} elements changed ({100 * m.density:.3f}%), "
              f"{report.segments} segment(s), {human_bytes(report.total_bytes)} vs {human_bytes(layout.nbytes)} full, "
              f"{report.total_s:.2f}s")
    return 0


def _check_base_matches_bucket(store: DeltaStore, base: int, base_digest: WeightsDigest, path: str) -> None:
    """If the bucket already knows version ``base``, OLD must be exactly those weights."""
    try:
        known = store.manifest(base).weights_digest
    except VersionNotFoundError:
        return
    if known != str(base_digest):
        raise ConfigError(f"{path} is not version {base} of {store.url}: its digest {base_digest} differs from "
                          f"the published {known}")


def cmd_patch(args: argparse.Namespace) -> int:
    check = manifest_check(args.public_key, args.run)
    out = Path(args.out)
    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory; give a file name")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: directory {out.parent} does not exist")
    settings = _settings(args.streams)
    store = DeltaStore(open_bucket(args.bucket, settings=settings), settings)
    manifest = store.manifest(args.version)
    base = manifest.base_version if args.base is None else args.base
    if not 0 <= base < args.version:
        raise ConfigError(f"--base must be below {args.version}, got {base}")
    if check is not None:  # every manifest of the chain, before its layout or any segment is fetched
        for version in range(base + 1, args.version + 1):
            check(store.manifest(version))
    layout = store.layout(manifest.layout_fingerprint)
    state, metadata = load_safetensors(args.base_file)
    extra = set(state) - set(layout.train_names) - {a for a, _ in layout.aliases}
    if extra:
        raise LayoutError(f"{args.base_file} holds tensors the delta's layout does not: {sorted(extra)[:8]}")
    target = TensorTarget.from_state(layout, {n: state[n] for n in layout.train_names}, version=base)
    follower = Follower(BucketChain(store), verify=check, streams=settings.streams, progress=sys.stderr.isatty())
    follower.attach(target)
    report = follower.follow_to(args.version, snapshots=False)  # the chain from the base file, delta by delta
    for alias, source in layout.aliases:  # keep tied tensors tied, as in the input file
        if alias in state:
            state[alias] = state[source]
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        save_file(state, str(tmp), metadata=metadata or None)
        os.replace(tmp, out)
    except Exception as exc:  # safetensors raises its own error type for I/O failures
        tmp.unlink(missing_ok=True)
        if isinstance(exc, AuroraError):
            raise
        raise ConfigError(f"cannot write {out}: {exc}") from None
    doc = {"version": args.version, "base_version": base, "applied": [step.version for step in report.steps],
           "weights_digest": str(target.digest), "out": str(out)}
    if args.json:
        emit_json(doc)
    else:
        print(f"wrote version {args.version} to {out} (applied {len(report.steps)} delta(s) from version {base}; "
              f"digest {target.digest})")
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    from aurora_store.store import history

    store = DeltaStore(open_bucket(args.bucket))
    table_ = history.load(store)
    rows = table_.to_pylist() if table_.num_rows else history.rows_from_manifests(store).to_pylist()
    recorded = {r["version"] for r in rows}
    missing = [v for v in store.versions() if v not in recorded]  # e.g. history row lost: fall back to manifests
    if missing:
        extra = history.rows_from_manifests(store).to_pylist()
        rows += [r for r in extra if r["version"] in missing]
        rows.sort(key=lambda r: r["version"])
    snapshots = store.snapshot_versions()
    if args.json:
        for row in rows:
            row["tensor_changed"] = dict(row["tensor_changed"] or [])
        emit_json({"bucket": store.url, "versions": rows, "snapshots": snapshots})
        return 0
    display = [{"version": r["version"], "base": r["base_version"], "segments": r["segments"],
                "bytes": human_bytes(r["delta_bytes"] + r["manifest_bytes"]), "changed": r["changed"],
                "density": f"{100 * r['density']:.3f}%", "encode_s": r["encode_s"], "publish_s": r["publish_s"],
                "created": (r["created_at"] or "")[:19]} for r in rows]
    print(table(display, ["version", "base", "segments", "bytes", "changed", "density", "encode_s", "publish_s",
                          "created"]))
    if snapshots:
        print(f"snapshots: {', '.join(map(str, snapshots))}")
    return 0

