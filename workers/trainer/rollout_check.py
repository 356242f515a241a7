"""Checking that a result's tokens were sampled from the policy version it claims (the logprob check).

An actor reports, with every completion, the log-probability of each token under the weights it sampled
from; GRPO uses them as the behaviour policy (``old_logprobs``). A sender could instead return tokens it chose
(or sampled from other weights) with log-probabilities it made up: the ratio ``exp(new − old)`` would then
steer the update wherever it likes. The trainer holds the exact bf16 weights of the version it leased (the
published rows), so it recomputes those log-probabilities itself and compares.

Which weights: the loop is one step asynchronous, so the batch trained at step ``k`` was generated on version
``k − 2`` while the master weights are already ``π_{k−1}`` (fp32). The training forward therefore does *not*
run the rollouts' policy; comparing against it would fold one optimizer step into the noise and widen the
tolerance by exactly what a forger could hide in. Instead :class:`RolloutCheck` keeps a bf16 copy of the model
holding the version the step was leased on (:meth:`RolloutCheck.hold` is called with the published rows just
before each publish replaces them) and runs one no-grad forward over the batch: bf16 on both sides, the same
weights bit for bit, so the only difference left is kernel order (incremental decoding with a KV cache on the
actor, one padded forward here).

The statistic is per sequence: the mean absolute difference ``|claimed − recomputed|`` over its completion
tokens. A single token cannot move it far, but honest bf16 noise averages down while a forgery is off on most
tokens (``python -m benchmarks logprob_check --json`` measures both). A result is rejected when any of its
samples exceeds the tolerance, or when a sample cannot even be scored (token outside the vocabulary, lengths
that disagree, a non-finite value).
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger("aurora.trainer.rollout_check")

#: Per-sequence mean |claimed − recomputed| (nats) above which a sample is taken as not sampled from the claimed
#: version. Honest bf16 actors (``python -m benchmarks logprob_check``): torch engine p99.9 ≤ 0.025, max 0.055
#: over 40,000 samples; vLLM CPU engine p99 0.013, max 0.080 over 17,600. 0.1 rejected none of 7,200 honest
#: results and every random-token, copied-logprob and far-version forgery (docs/THREAT_MODEL.md).
DEFAULT_TOLERANCE = 0.1

#: Sequences scored per forward (bounds the ``[rows, length, hidden]`` activations alive at once).
ROWS_PER_FORWARD = 64
#: Completion tokens whose logits exist at once (``[rows, vocab]`` fp32: ~1.2 GB at Qwen3's vocabulary).
LOGIT_ROWS = 2048


@dataclass(frozen=True)
class ScoredSample:
    """One completion to score: the prompt's ids, the completion's ids and the logprobs its sender claims."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    claimed: tuple[float, ...]


#: Tokens a rejected sample reports as its evidence (those whose claim is furthest from the recomputed value).
EVIDENCE_TOKENS = 8


@dataclass(frozen=True)
class TokenEvidence:
    """One completion token of a rejected sample: where it is, what it is, the log-probability its sender
    claimed and the one the held weights give."""

    position: int  # in the completion
    token: int
    claimed: float
    recomputed: float


@dataclass(frozen=True)
class SampleScore:
    """``statistic``: mean |claimed − recomputed| over the completion (``inf`` when it cannot be scored).
    A sample rejected on its log-probabilities carries ``evidence``: its :data:`EVIDENCE_TOKENS` furthest
    tokens, furthest first, and ``length`` its completion's (what an operator needs to tell a forgery from a
    tail of honest noise, which is spread thin over every token)."""

    statistic: float
    reason: str  # "ok", "logprobs" (beyond the tolerance) or "unscorable"
    evidence: tuple[TokenEvidence, ...] = ()
    length: int = 0


@dataclass(frozen=True)
class GroupVerdict:
    """A result's verdict: rejected if any of its samples is; it speaks through its worst sample's score."""

    prompt_id: str
    score: SampleScore  # the group's worst sample's

    @property
    def accepted(self) -> bool:
        return self.score.reason == "ok"

    @property
    def reason(self) -> str:
        return self.score.reason

    @property
    def worst(self) -> float:
        """The largest per-sample statistic of the group."""
        return self.score.statistic

    @property
    def evidence(self) -> tuple[TokenEvidence, ...]:
        """The worst sample's furthest tokens (empty unless it was rejected on its log-probabilities)."""
        return self.score.evidence

    @property
    def length(self) -> int:
        """The worst sample's completion length (0 unless it was rejected on its log-probabilities)."""
        return self.score.length


class RolloutCheck:
    """A bf16 copy of the policy at one published version, and the comparison against it."""

    def __init__(self, model: nn.Module, *, vocab_size: int, tolerance: float = DEFAULT_TOLERANCE,
                 rows_per_forward: int = ROWS_PER_FORWARD) -> None:
        if not (tolerance > 0 and math.isfinite(tolerance)):
            raise ValueError(f"the logprob tolerance must be a positive number, not {tolerance!r}")
        # A copy, cast once: the behaviour weights must not move when the optimizer steps the master weights.
        self.model = copy.deepcopy(model).to(torch.bfloat16).eval()
        for param in self.model.parameters():
            param.requires_grad_(False)
        self.params = dict(self.model.named_parameters())
        self.vocab_size = vocab_size
        self.tolerance = tolerance
        self.rows_per_forward = rows_per_forward
        self.version: int | None = None  # the version whose weights the copy holds

    def hold(self, rows: Mapping[str, torch.Tensor], version: int) -> None:
        """Make the copy hold ``version``'s bf16 weights (``rows``: name → whole tensor, as published).

        Parameters that are not published are not trained either: the copy keeps the values it was made with."""
        unknown = sorted(set(rows) - set(self.params))
        if unknown:
            raise KeyError(f"published rows name weights the model lacks: {unknown[:3]}")
        with torch.no_grad():
            for name, tensor in rows.items():
                self.params[name].copy_(tensor)
        self.version = version

    @torch.no_grad()
    def score(self, samples: Sequence[ScoredSample], temperature: float = 1.0) -> list[SampleScore]:
        """Score every sample against the held version (``temperature``: the lease's, as the actor sampled)."""
        out: list[SampleScore | None] = [None] * len(samples)
        scorable = []
        for i, s in enumerate(samples):
            if self._scorable(s):
                scorable.append(i)
            else:
                out[i] = SampleScore(math.inf, "unscorable")
        for lo in range(0, len(scorable), self.rows_per_forward):
            chunk = scorable[lo:lo + self.rows_per_forward]
            recomputed = self.recompute([samples[i] for i in chunk], temperature)
            for i, values in zip(chunk, recomputed, strict=True):
                claimed = torch.tensor(samples[i].claimed, dtype=torch.float32)
                gaps = (claimed - values).abs()
                stat = float(gaps.mean())
                if stat <= self.tolerance:
                    out[i] = SampleScore(stat, "ok")
                else:
                    out[i] = SampleScore(stat, "logprobs", _evidence(samples[i], values, gaps), len(gaps))
        return [s for s in out if s is not None]

    def recompute(self, samples: Sequence[ScoredSample], temperature: float = 1.0) -> list[torch.Tensor]:
        """Each completion token's log-probability under the held weights (right-padded, one forward).

        The output head is applied only to the completion positions, ``LOGIT_ROWS`` rows at a time: at a real
        vocabulary (151936) the full ``[rows, length, vocab]`` logits of a batch would not fit anywhere."""
        longest = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
        device = next(self.model.parameters()).device
        ids = torch.zeros((len(samples), longest), dtype=torch.long)
        attention = torch.zeros_like(ids)
        rows: list[int] = []
        positions: list[int] = []
        targets: list[int] = []
        for i, s in enumerate(samples):
            seq = s.prompt_ids + s.completion_ids
            ids[i, : len(seq)] = torch.tensor(seq)
            attention[i, : len(seq)] = 1
            p, c = len(s.prompt_ids), len(s.completion_ids)
            rows += [i] * c
            positions += range(p - 1, p - 1 + c)  # the hidden state at t predicts token t + 1
            targets += s.completion_ids
        model: Any = self.model  # a transformers causal LM: its decoder stack, then its output head
        hidden = model.get_decoder()(input_ids=ids.to(device), attention_mask=attention.to(device),
                                     use_cache=False).last_hidden_state
        picked = hidden[torch.tensor(rows, device=device), torch.tensor(positions, device=device)]
        del hidden
        head = model.get_output_embeddings()
        target = torch.tensor(targets, dtype=torch.long, device=device)
        values = torch.empty(len(targets), dtype=torch.float32)
        for lo in range(0, len(targets), LOGIT_ROWS):
            # Reduced in fp32 from the bf16 logits, as the actor does.
            logits = head(picked[lo:lo + LOGIT_ROWS]).float() / temperature
            values[lo:lo + LOGIT_ROWS] = F.log_softmax(logits, dim=-1).gather(
                1, target[lo:lo + LOGIT_ROWS, None]).squeeze(1).cpu()
        return list(values.split([len(s.completion_ids) for s in samples]))

    def _scorable(self, s: ScoredSample) -> bool:
        return (0 < len(s.completion_ids) == len(s.claimed) and len(s.prompt_ids) > 0
                and all(0 <= t < self.vocab_size for t in s.prompt_ids + s.completion_ids)
                and all(math.isfinite(v) for v in s.claimed))

    def judge(self, groups: Mapping[str, Sequence[ScoredSample]], temperature: float = 1.0) -> list[GroupVerdict]:
        """One verdict per result (prompt id → its samples), scored in one pass over all of them."""
        flat = [(prompt_id, s) for prompt_id, samples in groups.items() for s in samples]
        scores = self.score([s for _, s in flat], temperature)
        worst: dict[str, SampleScore] = {}
        for (prompt_id, _), score in zip(flat, scores, strict=True):
            if prompt_id not in worst or score.statistic > worst[prompt_id].statistic:
                worst[prompt_id] = score
        no_samples = SampleScore(math.inf, "unscorable")  # a result without samples
        return [GroupVerdict(prompt_id, worst.get(prompt_id, no_samples)) for prompt_id in groups]


def _evidence(sample: ScoredSample, recomputed: torch.Tensor, gaps: torch.Tensor) -> tuple[TokenEvidence, ...]:
    furthest = torch.argsort(gaps, descending=True, stable=True)[:EVIDENCE_TOKENS].tolist()
    return tuple(TokenEvidence(k, sample.completion_ids[k], sample.claimed[k], float(recomputed[k]))
                 for k in furthest)
