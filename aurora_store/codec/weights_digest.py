"""The weights digest as a value: 128 bits in two 64-bit lanes, added and subtracted lane-wise modulo 2**64,
written ``lthash128:<32 hex digits>``.

Kept apart from :mod:`.digest` (which computes digests with numpy, compiled kernels and torch) so that the
control plane's messages and the processes that only pass digests along (relays, the CLI, server launchers)
import none of those.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aurora_store.errors import FormatError

ALGORITHM = "lthash128"
LANES = 2
_MASK = (1 << 64) - 1
_PATTERN = re.compile(rf"^{ALGORITHM}:([0-9a-f]{{32}})$")


@dataclass(frozen=True)
class WeightsDigest:
    """A 128-bit additive digest (two 64-bit lanes)."""

    lanes: tuple[int, int] = (0, 0)

    def __add__(self, other: WeightsDigest) -> WeightsDigest:
        return WeightsDigest(tuple((a + b) & _MASK for a, b in zip(self.lanes, other.lanes)))  # type: ignore[arg-type]

    def __sub__(self, other: WeightsDigest) -> WeightsDigest:
        return WeightsDigest(tuple((a - b) & _MASK for a, b in zip(self.lanes, other.lanes)))  # type: ignore[arg-type]

    def __str__(self) -> str:
        return f"{ALGORITHM}:" + "".join(f"{lane:016x}" for lane in self.lanes)

    @classmethod
    def parse(cls, text: str) -> WeightsDigest:
        match = _PATTERN.match(text) if isinstance(text, str) else None
        if not match:
            raise FormatError(f"not a {ALGORITHM} digest: {text!r}")
        hexdigits = match.group(1)
        return cls((int(hexdigits[:16], 16), int(hexdigits[16:], 16)))


ZERO = WeightsDigest()
