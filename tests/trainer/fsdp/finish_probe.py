"""A rank that takes part in one gloo gather, reports, and ends through :meth:`Ranks.finish` with the exit
code given on the command line (``torchrun … -m tests.trainer.fsdp.finish_probe CODE``, or plain python: one rank).
An ``atexit`` hook tells whether the interpreter was finalized."""

from __future__ import annotations

import atexit
import sys

import torch

from workers.publish.ranks import Ranks


def main() -> int:
    ranks = Ranks.from_env()
    rows = ranks.gather_rows(torch.full((2, 3), float(ranks.rank)), rows=2 * ranks.world, owner=0)
    atexit.register(lambda: print(f"rank {ranks.rank} finalized", flush=True))
    if rows is not None:
        print(f"rank {ranks.rank} gathered {rows[:, 0].tolist()}")
    print(f"rank {ranks.rank} of {ranks.world} done")
    return ranks.finish(int(sys.argv[1]))


if __name__ == "__main__":
    raise SystemExit(main())
