"""What an element order costs (``python -m benchmarks element_order --json``), on gpt-oss-shaped expert tensors.

A component in an element order of its own (gpt-oss's ``gate_up_proj`` ``[E, H, 2·I]``, vLLM's ``w13``
``[E, 2·I, H]``) costs the trainer one reordering copy per publish (to encode in engine order) and a torch actor
one index computation per write (engine positions → storage indices). Both are measured in one run against the
hardware's own primitives on the same tensor: the copy against a plain copy (``clone``, a memcpy), the actor's
scatter of one step's changed elements against the same scatter into a tensor held in engine order.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

from aurora_store.codec.layout import Component, InferenceTensor, ModelLayout
from aurora_store.codec.order import ElementOrder
from aurora_store.codec.target import TensorTarget


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--experts", type=int, default=4, help="experts E (gpt-oss-20b has 32 per layer)")
    parser.add_argument("--hidden", type=int, default=2880, help="hidden size H (gpt-oss's)")
    parser.add_argument("--inter", type=int, default=2880, help="expert intermediate size I (gpt-oss's)")
    parser.add_argument("--density", type=float, default=0.01, help="share of elements one step changes")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs; the best is reported")
    parser.add_argument("--json", action="store_true", help="(always JSON)")


def _best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(experts: int, hidden: int, inter: int, density: float, repeat: int) -> dict[str, Any]:
    shape = (experts, hidden, 2 * inter)
    order = ElementOrder(shape, shape, (0, 2, 1))
    gen = torch.Generator().manual_seed(0)
    stored = torch.randint(-(1 << 15), 1 << 15, shape, dtype=torch.int16, generator=gen)  # any bits
    engine_shape = (experts, 2 * inter, hidden)

    def layout(component_order: ElementOrder | None) -> ModelLayout:
        return ModelLayout((InferenceTensor("w13", engine_shape, (Component("gate_up_proj", 0, experts,
                                                                            component_order),)),))

    to_engine_s = _best(lambda: order.to_engine(stored), repeat)
    memcpy_s = _best(lambda: stored.clone(), repeat)
    # One step's changed elements, as a delta carries them: sorted engine positions and their new bits.
    count = max(1, int(order.numel * density))
    positions = torch.sort(torch.randperm(order.numel, generator=gen)[:count]).values
    bits = torch.randint(-(1 << 15), 1 << 15, (count,), dtype=torch.int16, generator=gen)
    ordered = TensorTarget.from_state(layout(order), {"gate_up_proj": stored.view(torch.bfloat16).clone()})
    plain = TensorTarget.from_state(layout(None), {"gate_up_proj": order.to_engine(stored).view(torch.bfloat16)
                                                   .reshape(engine_shape)})
    train_index_s = _best(lambda: order.train_index(positions), repeat)
    scatter_ordered_s = _best(lambda: ordered.scatter("w13", positions, bits), repeat)
    scatter_plain_s = _best(lambda: plain.scatter("w13", positions, bits), repeat)
    # Both targets now hold the same engine-order bits: the reordering is exact.
    exact = bool(torch.equal(ordered.fused_bits("w13"), plain.fused_bits("w13")))
    return {
        "shape": list(shape), "engine_shape": list(engine_shape), "elements": order.numel, "changed": count,
        "to_engine_s": round(to_engine_s, 4), "memcpy_s": round(memcpy_s, 4),
        "to_engine_over_memcpy": round(to_engine_s / memcpy_s, 2),
        "train_index_s": round(train_index_s, 4),
        "scatter_ordered_s": round(scatter_ordered_s, 4), "scatter_plain_s": round(scatter_plain_s, 4),
        "scatter_ordered_over_plain": round(scatter_ordered_s / scatter_plain_s, 2),
        "bit_exact": exact, "threads": torch.get_num_threads(),
    }


def run_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return measure(args.experts, args.hidden, args.inter, args.density, args.repeat)
