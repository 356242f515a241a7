"""``aurora keygen``: the trainer's Ed25519 signing key pair."""

from __future__ import annotations

import argparse

from aurora_store.textfmt import emit_json
from aurora_store.trust import Verifier, key_id, write_keypair

EPILOG = """examples:
  aurora keygen --out ~/.aurora                      # writes trainer.key (0600) and trainer.pub
  python -m workers.trainer --signing-key ~/.aurora/trainer.key ...
  python -m workers.actor --trainer-public-key ~/.aurora/trainer.pub ...   (or AURORA_TRAINER_PUBLIC_KEY)"""


def register(sub: argparse._SubParsersAction) -> None:
    keygen = sub.add_parser("keygen", help="create the trainer's Ed25519 key pair for signing manifests",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    keygen.add_argument("--out", required=True, help="directory for <name>.key and <name>.pub")
    keygen.add_argument("--name", default="trainer")
    keygen.add_argument("--json", action="store_true")
    keygen.set_defaults(handler=cmd_keygen)


def cmd_keygen(args: argparse.Namespace) -> int:
    private, public = write_keypair(args.out, args.name)
    kid = key_id(Verifier.load(str(public)).public_key)
    if args.json:
        emit_json({"private_key": str(private), "public_key": str(public), "key_id": kid})
    else:
        print(f"wrote {private} (keep secret) and {public}; key id {kid}")
    return 0
