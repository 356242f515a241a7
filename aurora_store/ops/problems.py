"""What a bucket check found: one :class:`Problem` per defect, precise enough to act on.

Problems are data, not exceptions: a check keeps going after the first defect so that one run of
``aurora verify`` lists everything that is wrong, and ``aurora gc`` can decide which problems concern the
part of the bucket it would keep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Every problem code, with what it means. Codes are stable (scripts match on them); messages are for people.
CODES: dict[str, str] = {
    "manifest_malformed": "a delta manifest does not parse",
    "manifest_wrong_version": "deltas/<v>.json declares a version other than v",
    "manifest_rejected": "the verify_manifest hook (e.g. a signature check) rejected a manifest",
    "layout_missing": "a manifest names a layout that is not stored",
    "layout_invalid": "a stored layout document is malformed or does not hash to its name",
    "manifest_layout_mismatch": "a manifest disagrees with its layout (element count, tensor names or ranges)",
    "segment_missing": "a manifest names a segment that is not in the bucket",
    "segment_size": "a segment's size differs from its manifest entry (e.g. truncated)",
    "segment_digest": "a segment's bytes do not hash to its name (--deep)",
    "segment_corrupt": "a segment's structure is invalid or differs from its manifest entry (--deep)",
    "chain_base": "a delta's base version is not the version before it",
    "chain_digest": "a delta's base digest differs from the weights digest of the version before it",
    "chain_gap": "a delta's base version is neither a published delta nor a snapshot",
    "snapshot_malformed": "a snapshot manifest does not parse",
    "snapshot_wrong_version": "snapshots/<v>/manifest.json declares a version other than v",
    "snapshot_file_missing": "a snapshot manifest names a file that is not in the bucket",
    "snapshot_file_size": "a snapshot file's size differs from its manifest entry",
    "snapshot_file_digest": "a snapshot file's bytes do not match its SHA-256 (--deep)",
    "snapshot_digest": "a snapshot's weights digest differs from the delta manifest of the same version",
    "snapshot_content": "a snapshot's tensors do not hash to its declared weights digest (--deep)",
    "snapshot_replay": "replaying the deltas from the previous snapshot does not reproduce this snapshot (--deep)",
    "snapshot_stranded": "a snapshot cannot reach the latest version: a delta after it is missing",
    "replay_failed": "a delta could not be decoded or applied to its base (--deep)",
}


@dataclass(frozen=True)
class Problem:
    """One defect. ``version`` is the delta or snapshot version it concerns (``None`` for bucket-wide ones);
    ``key`` the object at fault (a segment digest, a file name, a layout fingerprint) where there is one."""

    code: str
    message: str
    version: int | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"unknown problem code {self.code!r}")

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "version": self.version, "key": self.key, "message": self.message}

    def __str__(self) -> str:
        where = f"version {self.version}: " if self.version is not None else ""
        return f"[{self.code}] {where}{self.message}"
