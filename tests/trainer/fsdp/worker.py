"""One trainer run without Redis, driven by the tests: the real sharded policy, learner, checkpoint,
per-rank publisher and sharded snapshot writer on synthetic GRPO batches.

    torchrun --standalone --nproc-per-node 2 -m tests.trainer.fsdp.worker SPEC.json     (or plain python: one rank)

SPEC (JSON): bucket, checkpoint_dir, out, steps, compute_dtype, snapshot_at, resume_from (a step whose
checkpoint is copied aside and resumed into a fresh model after the run), foreign_checkpoint (a checkpoint
directory to try loading, expecting a world-size error). Every rank writes into ``out``: its published bf16
rows per version, what crossed ranks during each publish and during a training step (audit), the step
statistics, and the result of resuming.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from aurora_store.codec import CodecParams, ModelLayout
from aurora_store.codec.sharding import rows_digest
from aurora_store.codec.weights_digest import ZERO, WeightsDigest
from aurora_store.errors import ConfigError
from aurora_store.store import DeltaStore, object_names
from aurora_store.store.publisher import VersionPublisher
from tests.trainer.fsdp.audit import install
from workers.publish.delta import RankPublisher
from workers.publish.ranks import Ranks
from workers.publish.snapshot import write_sharded_snapshot
from workers.rl.grpo import GRPOConfig, Sample
from workers.rl.model import DEFAULT_CONFIG, build_model, side_files
from workers.rl.task import build_tokenizer
from workers.trainer import checkpoint
from workers.trainer.learner import ShardedLearner
from workers.trainer.policy import ShardedPolicy, frozen_reference

#: vocab 33: the embedding's rows do not split evenly over 2 ranks (17 + 16).
MODEL_CONFIG = {**DEFAULT_CONFIG, "vocab_size": 33}


def batch(step: int) -> list[Sample]:
    """3 prompts × 3 samples = 9 (uneven over 2 ranks), deterministic per step."""
    rng = random.Random(step)
    samples = []
    for prompt in range(3):
        prompt_ids = tuple(rng.randrange(3, 33) for _ in range(rng.randrange(4, 8)))
        for _ in range(3):
            completion = tuple(rng.randrange(3, 33) for _ in range(rng.randrange(1, 6)))
            samples.append(Sample(prompt_ids, completion, tuple(-rng.uniform(2.0, 4.0) for _ in completion),
                                  float(rng.random() < 0.5), f"p{step}-{prompt}"))
    return samples


class Run:
    def __init__(self, spec: dict, ranks: Ranks) -> None:
        self.spec, self.ranks = spec, ranks
        self.out = Path(spec["out"])
        self.layout = ModelLayout.from_config(MODEL_CONFIG)
        self.store = DeltaStore(spec["bucket"], create=True)
        self.publisher = VersionPublisher(self.store, self.layout, CodecParams(segment_bytes=16 << 10), streams=2)
        self.announced: list[tuple[int, str, bool]] = []  # (version, segment, manifest already there?)
        self.publishing = 0
        self.rank_publisher = RankPublisher(ranks, self.publisher, announce=self._announce)

    def _announce(self, ref) -> None:
        self.announced.append((self.publishing, ref.digest, self.store.bucket.exists(object_names.delta(
            self.publishing))))

    def build(self) -> tuple[ShardedPolicy, ShardedLearner]:
        model = build_model(MODEL_CONFIG, seed=0)
        policy = ShardedPolicy.shard(model, self.layout, self.ranks, compute_dtype=self.spec["compute_dtype"])
        return policy, ShardedLearner(model, GRPOConfig(lr=1e-3, epochs=2), self.ranks)

    def kl(self) -> dict:
        """GRPO with the KL term: the bf16 reference is sharded like the policy; two steps' statistics."""
        from torch.distributed.tensor import DTensor

        model = build_model(MODEL_CONFIG, seed=0)
        reference = frozen_reference(model, self.ranks)
        ShardedPolicy.shard(model, self.layout, self.ranks, compute_dtype=self.spec["compute_dtype"])
        learner = ShardedLearner(model, GRPOConfig(lr=1e-3, epochs=2, kl_coef=self.spec["kl_coef"]), self.ranks,
                                 reference)
        params = list(reference.parameters())
        local = [p.to_local() if isinstance(p, DTensor) else p for p in params]
        out = {"reference": {"dtypes": sorted({str(p.dtype) for p in local}),
                             "sharded": all(isinstance(p, DTensor) for p in params),
                             "local_numel": sum(p.numel() for p in local),
                             "full_numel": sum(p.numel() for p in params),
                             "frozen": not any(p.requires_grad for p in params)}, "stats": []}
        for step in (1, 2):
            stats = learner.step(batch(step))
            out["stats"].append({"loss": stats.loss, "kl": stats.kl, "grad_norm": stats.grad_norm,
                                 "tokens": stats.tokens})
        return out

    def summed_digest(self, rows) -> WeightsDigest | None:
        parts = self.ranks.gather(str(rows_digest(self.layout, rows)), "digest")
        return sum((WeightsDigest.parse(p) for p in parts), ZERO) if parts is not None else None

    def dump_rows(self, version: int, rows) -> None:
        where = self.out / "published" / f"v{version}"
        where.mkdir(parents=True, exist_ok=True)
        save_file({n: r.tensor for n, r in rows.items()}, str(where / f"rank{self.ranks.rank}.safetensors"))
        (where / f"rank{self.ranks.rank}.json").write_text(json.dumps({n: r.start for n, r in rows.items()}))

    def main(self) -> dict:
        spec, ranks, audit = self.spec, self.ranks, install()
        policy, learner = self.build()
        policy.published = policy.cast_rows()
        digest = WeightsDigest.parse(self.ranks.broadcast(str(self.summed_digest(policy.published)), "digest"))
        self.dump_rows(0, policy.published)
        tokenizer = build_tokenizer()
        write_sharded_snapshot(ranks, self.store, 0, self.layout, policy.published, digest,
                               extra_files=side_files(MODEL_CONFIG, tokenizer) if ranks.leader else None)
        result: dict = {"stats": [], "publish_audit": [], "publish_metadata_bytes": [], "versions": {}}
        checkpoints = checkpoint.Checkpoints(spec["checkpoint_dir"], ranks)
        for step in range(1, spec["steps"] + 1):
            samples = [Sample(*s) for s in ranks.broadcast(
                [[list(s.prompt_ids), list(s.completion_ids), list(s.old_logprobs), s.reward, s.group]
                 for s in batch(step)] if ranks.leader else None, "samples")]
            with audit.watching():
                stats = learner.step(samples)
            result["train_audit"] = audit.as_json()
            audit.calls.clear()
            audit.bytes.clear()
            result["stats"].append({"loss": stats.loss, "grad_norm": stats.grad_norm, "tokens": stats.tokens})
            checkpoints.save(policy, learner.optimizer,
                             checkpoint.CheckpointInfo(step, step, [], 0, world_size=ranks.world))
            ranks.barrier()  # every rank's shard is durable (rank 0's save waits for them all)
            if step == spec.get("resume_from"):
                if ranks.leader:
                    where = checkpoint.step_dir(spec["checkpoint_dir"], step)
                    shutil.copytree(where, self.out / "resume-ckpt" / where.name)
                    result["checkpoint_files"] = sorted(str(p.relative_to(where)) for p in where.rglob("*"))
                ranks.barrier()
            new = policy.cast_rows()
            self.publishing = step
            with audit.watching():
                outcome = self.rank_publisher.publish(step, step - 1, digest, policy.published, new)
            result["publish_audit"].append(audit.as_json())
            result["publish_metadata_bytes"].append(outcome.metadata_bytes)
            audit.calls.clear()
            audit.bytes.clear()
            policy.published, digest = new, outcome.digest
            self.dump_rows(step, new)
            scratch = self.summed_digest(new)
            if ranks.leader:
                result["versions"][step] = {"manifest_digest": str(digest), "scratch_digest": str(scratch),
                                            "ranks": [t.to_json() for t in outcome.ranks]}
            if step == spec.get("snapshot_at"):
                write_sharded_snapshot(ranks, self.store, step, self.layout, policy.published, digest,
                                       extra_files=side_files(MODEL_CONFIG, tokenizer) if ranks.leader else None)
        result["announced"] = self.announced
        if spec.get("resume_from"):
            result["resumed"] = self.resume(spec["resume_from"])
        if spec.get("foreign_checkpoint"):
            result["foreign"] = self.load_foreign(spec["foreign_checkpoint"])
        result["traffic"] = dict(ranks.traffic)
        return result

    def resume(self, at: int) -> dict:
        """A fresh model and optimizer restored from the checkpoint of step ``at`` must train on to exactly the
        versions the run published."""
        policy, learner = self.build()
        info = checkpoint.load(self.out / "resume-ckpt", policy, learner.optimizer, self.ranks)
        out = {"info_step": info.step, "digests": {}}
        for step in range(at + 1, self.spec["steps"] + 1):
            learner.step(batch(step))
            out["digests"][step] = str(self.summed_digest(policy.cast_rows()))
        return out

    def load_foreign(self, directory: str) -> str:
        policy, learner = self.build()
        try:
            checkpoint.load(directory, policy, learner.optimizer, self.ranks)
        except ConfigError as exc:
            return str(exc)
        return ""


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    torch.manual_seed(0)
    ranks = Ranks.from_env()
    try:
        run = Run(spec, ranks)
        result = run.kl() if spec.get("kl_coef") else run.main()
    except BaseException:
        ranks.close()
        raise
    Path(spec["out"]).mkdir(parents=True, exist_ok=True)
    Path(spec["out"], f"result-rank{ranks.rank}.json").write_text(json.dumps(result, indent=1))
    return ranks.finish(0)  # a sharded rank leaves without interpreter finalization, as the trainer does


if __name__ == "__main__":
    raise SystemExit(main())
