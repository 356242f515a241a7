"""``aurora layout --config config.json``: what Aurora will ship for a model, before any run — every engine
tensor, the trainer tensors that make it (row stacking, per-expert stacking) and the layout's fingerprint."""

from __future__ import annotations

import argparse

from aurora_store.codec.families import NAME_SETS
from aurora_store.codec.layout import ModelLayout
from aurora_store.textfmt import emit_json

EPILOG = """examples:
  aurora layout --config ./Qwen3-30B-A3B/config.json                # engine tensors and fingerprint
  aurora layout --config config.json --names checkpoint --json      # saved-checkpoint names, as JSON

An architecture without a layout is refused with the reason (exit code 2)."""


def register(sub: argparse._SubParsersAction) -> None:
    layout = sub.add_parser("layout", help="print the layout (engine tensors ← trainer tensors) of a model config",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    layout.add_argument("--config", required=True, help="the model's HF config.json")
    layout.add_argument("--names", choices=NAME_SETS, default="memory",
                        help="trainer-side names: a transformers model's parameters (memory) or a saved "
                             "checkpoint's (they differ for MoE experts)")
    layout.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    layout.add_argument("--json", action="store_true", help="the full layout document and its fingerprint")
    layout.set_defaults(handler=cmd_layout)


def cmd_layout(args: argparse.Namespace) -> int:
    layout = ModelLayout.from_config_file(args.config, args.dtype, names=args.names)
    if args.json:
        emit_json({"fingerprint": layout.fingerprint, "numel": layout.numel, "layout": layout.to_json()})
        return 0
    for tensor in layout.tensors:
        sources = [c.train_name for c in tensor.components]
        shown = sources[0] if len(sources) == 1 else f"{len(sources)} stacked: {sources[0]} … {sources[-1]}"
        if len(sources) in (2, 3):
            shown = " + ".join(sources)
        if sources == [tensor.name]:
            shown = "="
        order = tensor.components[0].order if len(tensor.components) == 1 else None
        if order is not None:  # stored in another order than the engine's (gpt-oss's transposed experts)
            shown += f" {list(order.shape)} as {list(order.view)}, axes {list(order.axes)}"
        print(f"{tensor.name}  {list(tensor.shape)}  ← {shown}")
    for alias, target in layout.aliases:
        print(f"{alias}  tied to {target} (not shipped)")
    print(f"{len(layout.tensors)} engine tensors, {layout.numel:,} elements ({layout.nbytes:,} bytes as "
          f"{args.dtype}); fingerprint {layout.fingerprint}")
    return 0
