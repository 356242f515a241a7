"""The step loop, one-step asynchronous: rollouts for step k+1 are generated on version k-1 while step k
trains. Rank 0 dispatches and collects (:mod:`.dispatch`) and broadcasts each step's samples; every rank
trains on its slice, checkpoints its shard and publishes its rows."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, cast

from aurora_store.bus.messages import RolloutResult
from aurora_store.errors import BusError, NoEligibleActors
from aurora_store.sched import StepLedger
from workers.publish.ranks import Ranks
from workers.rl.grpo import Sample
from workers.rl.task import AdditionTask, MathFileTask
from workers.trainer import checkpoint
from workers.trainer.cli import TrainerConfig
from workers.trainer.leader import Leader
from workers.trainer.publishing import Publishing
from workers.trainer.rollout_check import GroupVerdict, RolloutCheck, ScoredSample
from workers.trainer.state import Progress, Started

log = logging.getLogger("aurora.trainer")

#: Rounds of re-leasing the prompts whose results failed the logprob check before such results are dropped from
#: the step instead; and the rounds after which a step where every result keeps failing gives up.
CHECK_ROUNDS = 3
CHECK_ROUNDS_MAX = 20


class StepLoop:
    def __init__(self, config: TrainerConfig, ranks: Ranks, task: AdditionTask | MathFileTask, tokenizer: Any,
                 started: Started, publishing: Publishing, progress: Progress, leader: Leader | None, *,
                 stopping: Callable[[], bool]) -> None:
        self.config = config
        self.ranks = ranks
        self.task = task
        self.tokenizer = tokenizer
        self.started = started
        self.publishing = publishing
        self.progress = progress
        self.leader = leader
        self.stopping = stopping  # set by a stop signal: finish the step under way, or abandon the one collected
        self.check = self._rollout_check()

    def run(self) -> None:
        """Train from the step after ``progress.step`` to ``--steps`` (or until told to stop)."""
        cfg = self.config
        leader = self.leader
        progress = self.progress
        start_step = progress.step
        # Rollouts for step k+1 are generated on version k-1 while step k trains. The first batch (and the
        # first one after a restart, when actors may already run the newest version) uses the newest version.
        pending = self._dispatch(leader, start_step + 1, progress.version, first=True) \
            if leader is not None and start_step < cfg.steps else None
        self._hold_published()  # the version just dispatched (the newest published)
        for step in range(start_step + 1, cfg.steps + 1):
            batch, current, wait_s = None, None, 0.0
            if leader is not None and not self.stopping() and pending is not None:
                t0 = time.monotonic()
                if self._collect(leader, pending) and self._verify(leader, pending):
                    wait_s = time.monotonic() - t0
                    current = pending
                    if step < cfg.steps:
                        pending = self._dispatch(leader, step + 1, progress.version)
                    batch = [_sample_to_json(s) for s in self._samples(current)]
            batch = self.ranks.broadcast(batch, "samples")  # None: rank 0 is stopping
            if batch is None:
                break
            t1 = time.monotonic()
            stats = self.started.learner.step([_sample_from_json(s) for s in batch])
            train_s = time.monotonic() - t1
            progress.step = step
            progress.rewards.append(stats.mean_reward)
            if self.started.checkpoints.due(step):  # in the background; before publishing, as the resume expects
                self.started.save_checkpoint(self._info(progress.version + 1))
            # The batch dispatched last (trained next step) was leased on the version published now: the
            # check keeps its weights before the publish replaces them in place.
            self._hold_published()
            outcome = self.publishing.publish(self.started.policy, progress.version + 1)
            if leader is not None and current is not None:  # rank 0 collected this step's batch
                leader.report.record(step, progress.version, current, stats, wait_s, train_s, outcome)
        if self.started.checkpoints.last_step != progress.step:  # the last step trained (run ends, or stopped)
            self.started.save_checkpoint(self._info(progress.version))
        self.started.checkpoints.wait()

    def _info(self, version: int) -> checkpoint.CheckpointInfo:
        """The checkpoint of the step just trained, whose weights are (or are about to be published as) ``version``."""
        progress, leader = self.progress, self.leader
        counters = leader.dispatcher.stats.as_counters() if leader is not None else {}
        return checkpoint.CheckpointInfo(progress.step, version, list(progress.rewards), self.config.seed, counters,
                                         self.ranks.world)

    def _dispatch(self, leader: Leader, step: int, version: int, *, first: bool = False) -> StepLedger | None:
        """Dispatch ``step`` on ``version``; ``None`` if the trainer was told to stop while waiting for actors.
        ``first``: this process's first dispatch, which waits for ``--min-actors``."""
        try:
            return leader.dispatcher.start_step(step, version, str(self.publishing.digest_of(version)),
                                                self.task.prompts(step, self.config.batch_size),
                                                group_size=self.config.group_size,
                                                max_new_tokens=self.task.max_new_tokens,
                                                wait_s=self.config.step_timeout_s, stop=self.stopping,
                                                quorum=self.config.min_actors if first else 1)
        except NoEligibleActors:
            if not self.stopping():
                raise
            return None

    def _collect(self, leader: Leader, ledger: StepLedger) -> bool:
        """Settle ``ledger``; ``False`` when stopping first (a control plane that is down then ends the step
        as abandoned instead of failing the trainer: a restart redoes it from the checkpoint)."""
        try:
            return leader.dispatcher.collect(ledger, timeout_s=self.config.step_timeout_s,
                                             tick=lambda: leader.announce_state(self.progress), stop=self.stopping)
        except BusError:
            if not self.stopping():
                raise
            log.warning("control plane unreachable while stopping: step %d abandoned", ledger.step)
            return False

    def _rollout_check(self) -> RolloutCheck | None:
        """The logprob check where it can run: on a leader that holds every published weight (one rank)."""
        tolerance = self.config.logprob_tolerance
        if self.leader is None or not tolerance:
            return None
        if self.ranks.sharded:
            log.warning("logprob check off: a sharded trainer's rank 0 holds only its rows of each version")
            return None
        model = self.started.policy.model
        vocab_size = int(cast(Any, model).config.vocab_size)  # a transformers model (PolicyModel.load)
        return RolloutCheck(model, vocab_size=vocab_size, tolerance=tolerance)

    def _hold_published(self) -> None:
        if self.check is not None:
            self.check.hold({name: rows.tensor for name, rows in self.started.policy.published.items()},
                            self.progress.version)

    def _verify(self, leader: Leader, ledger: StepLedger) -> bool:
        """Take back every accepted result whose tokens were not sampled from the leased version (the logprob
        check) and collect those prompts again, until every result passes; after ``CHECK_ROUNDS`` rounds the
        prompts still failing leave the step instead (unless none would be left). ``False`` when stopping
        during a re-collection."""
        check = self.check
        if check is None:
            return True
        if check.version != ledger.version:  # cannot happen in the loop's order; never train on unchecked
            raise RuntimeError(f"logprob check holds version {check.version}, step {ledger.step} was leased on "
                               f"{ledger.version}")
        checked: set[str] = set()
        for round_ in range(1, CHECK_ROUNDS_MAX + 1):
            fresh = {p: r for p, r in ledger.accepted.items() if p not in checked}
            groups = {p: self._scored(ledger, p, r) for p, r in fresh.items()}
            failed = [v for v in check.judge(groups, ledger.temperature) if not v.accepted] if groups else []
            checked.update(fresh)
            if not failed:
                return True
            keep = round_ < CHECK_ROUNDS or len(failed) == len(ledger.accepted)
            for verdict in failed:
                checked.discard(verdict.prompt_id)
                leader.dispatcher.take_back(ledger, verdict.prompt_id, "logprobs", check=verdict.reason,
                                            statistic=round(min(verdict.worst, 1e9), 6), tolerance=check.tolerance,
                                            length=verdict.length, evidence=_evidence_to_json(verdict))
                if not keep:  # leased again for rounds on end: the step goes on without it
                    ledger.drop(verdict.prompt_id)
            if not self._collect(leader, ledger):
                return False
        raise TimeoutError(f"step {ledger.step}: every result failed the logprob check in {CHECK_ROUNDS_MAX} rounds "
                           f"(tolerance {check.tolerance}): every actor forging, or honest bf16 noise of this model "
                           f"above --logprob-tolerance (measure it: python -m benchmarks logprob_check --json)")

    def _scored(self, ledger: StepLedger, prompt_id: str, result: RolloutResult) -> list[ScoredSample]:
        prompt_ids = tuple(self.tokenizer(ledger.prompts[prompt_id].text).input_ids)
        out = []
        for sample in result.samples:
            try:
                out.append(ScoredSample(prompt_ids, tuple(int(t) for t in sample["ids"]),
                                        tuple(float(x) for x in sample["logprobs"])))
            except (KeyError, TypeError, ValueError):  # scored as unscorable: rejected, never raised
                out.append(ScoredSample(prompt_ids, (), ()))
        return out

    def _samples(self, ledger: StepLedger) -> list[Sample]:
        samples = []
        for prompt_id, result in ledger.accepted.items():
            prompt = ledger.prompts[prompt_id]
            prompt_ids = tuple(self.tokenizer(prompt.text).input_ids)
            for sample in result.samples:
                ids = tuple(sample["ids"])
                # Rewarded on what the tokens say, not on the text the actor sent alongside them: the tokens
                # are what the logprob check vouches for and what the step trains on.
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                samples.append(Sample(prompt_ids, ids, tuple(sample["logprobs"]), self.task.reward(prompt, text),
                                      prompt_id))
        return samples


def _evidence_to_json(verdict: GroupVerdict) -> list[list[float]]:
    """The worst sample's furthest tokens as ``[position, token, claimed, recomputed]`` rows (the run log's
    ``evidence``: empty for a sample that could not be scored)."""
    return [[e.position, e.token, round(e.claimed, 6), round(e.recomputed, 6)] for e in verdict.evidence]


def _sample_to_json(sample: Sample) -> list[Any]:
    return [list(sample.prompt_ids), list(sample.completion_ids), list(sample.old_logprobs), sample.reward,
            sample.group]


def _sample_from_json(doc: list[Any]) -> Sample:
    prompt_ids, completion_ids, logprobs, reward, group = doc
    return Sample(tuple(prompt_ids), tuple(completion_ids), tuple(logprobs), float(reward), str(group))
