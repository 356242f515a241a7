"""Run under ``torchrun --nproc-per-node 2``: shard a model the old way (broadcast the whole model from rank 0,
then ``fully_shard``) and the new way (:func:`workers.trainer.policy.shard_onto`: meta device → ``fully_shard``
→ load shard by shard) and write, per rank, whether every local shard, buffer, the frozen reference and a
forward pass agree bit for bit (rank 1 perturbs its own copy first, as rank 0's warm start would make the
ranks differ, so only the broadcast can make them agree), and whether activation checkpointing leaves two
training step (two epochs) unchanged."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch

from aurora_store.codec import ModelLayout
from workers.publish.ranks import Ranks
from workers.rl.model import DEFAULT_CONFIG, build_model
from workers.trainer.policy import ShardedPolicy, frozen_reference

CONFIGS = {"untied": {**DEFAULT_CONFIG, "vocab_size": 33, "tie_word_embeddings": False},  # 33 rows: uneven
           "tied": {**DEFAULT_CONFIG, "vocab_size": 33, "tie_word_embeddings": True}}


def old_way(model: torch.nn.Module, ranks: Ranks, dtype: torch.dtype) -> torch.nn.Module:
    """What the trainer did before: every rank holds the whole model, takes rank 0's values, then shards."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    with torch.no_grad():
        for param in model.parameters():
            dist.broadcast(param.data, src=0)
    model = model.to(dtype)
    mesh = init_device_mesh("cpu", (ranks.world,))
    policy = MixedPrecisionPolicy(param_dtype=dtype)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def local(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.to_local().detach() for n, p in model.named_parameters()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[n].dtype == b[n].dtype and a[n].shape == b[n].shape and
                                        torch.equal(a[n].view(torch.uint8), b[n].view(torch.uint8)) for n in a)


def compare(config: dict, ranks: Ranks) -> dict:
    model = build_model(config, seed=0)
    if ranks.rank != 0:
        with torch.no_grad():
            for param in model.parameters():
                param.add_(1.0)
    before = copy.deepcopy(model)
    reference_old = old_way(copy.deepcopy(model), ranks, torch.bfloat16)
    reference_new = frozen_reference(model, ranks)
    policy_old = old_way(before, ranks, torch.float32)
    ShardedPolicy.shard(model, ModelLayout.from_config(config), ranks, compute_dtype="float32")
    result = {"params": same(local(policy_old), local(model)),
              "meta_left": [n for n, p in local(model).items() if p.is_meta],
              "buffers": all(torch.equal(a, b) for a, b in zip(policy_old.buffers(), model.buffers(), strict=True)),
              "reference": same(local(reference_old), local(reference_new)),
              "reference_dtypes": sorted({str(p.dtype) for p in local(reference_new).values()}),
              "rows": {n: int(p.shape[0]) for n, p in local(model).items()}}
    ids = torch.tensor([[3, 5, 7, 9, 11, 13]])
    with torch.no_grad():  # (the root's parameters stay gathered after a forward: compare shards first)
        result["forward"] = torch.equal(policy_old(input_ids=ids).logits, model(input_ids=ids).logits)
    result["tied"] = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    return result


def recompute(ranks: Ranks) -> bool:
    """Activation checkpointing (the CUDA default) under FSDP2: a step of two epochs gives exactly the loss and gradient
    norm of keeping the activations."""
    from tests.trainer.fsdp.worker import batch
    from workers.rl.grpo import GRPOConfig
    from workers.trainer.learner import ShardedLearner

    runs = []
    for checkpointing in (False, True):
        model = build_model(CONFIGS["tied"], seed=0)
        ShardedPolicy.shard(model, ModelLayout.from_config(CONFIGS["tied"]), ranks, compute_dtype="float32")
        learner = ShardedLearner(model, GRPOConfig(lr=1e-3, epochs=2), ranks, activation_checkpointing=checkpointing)
        runs.append([(s.loss, s.grad_norm) for s in (learner.step(batch(step)) for step in (1,))])
    return runs[0] == runs[1]


def main() -> int:
    out = Path(sys.argv[1])
    ranks = Ranks.from_env()
    result: dict = {name: compare(config, ranks) for name, config in CONFIGS.items()}
    result["recompute_same_steps"] = recompute(ranks)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{ranks.rank}.json").write_text(json.dumps(result))
    return ranks.finish(0)


if __name__ == "__main__":
    raise SystemExit(main())
