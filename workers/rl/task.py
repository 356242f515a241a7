"""The default verifiable task: integer addition with a programmatic reward, and a char-level tokenizer.

Small enough to learn on two CPU cores in minutes, real enough to exercise everything: prompts go out as
leases, actors sample groups of completions, the trainer scores them exactly (no reward model) and
GRPO raises the mean reward.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from aurora_store.sched import Prompt

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
ALPHABET = list("0123456789+-*= ")
SPECIAL = [PAD, BOS, EOS]
VOCAB = SPECIAL + ALPHABET
#: Model vocabulary is padded to a multiple of 16; ids past the alphabet are never produced by the tokenizer.
VOCAB_SIZE = 32


def build_tokenizer():
    """A character-level fast tokenizer (saved as ``tokenizer.json``; loads in transformers and vLLM)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(VOCAB)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   unk_token=PAD, clean_up_tokenization_spaces=False)


@dataclass(frozen=True)
class AdditionTask:
    """Prompts ``"a+b="``; the reward is 1.0 when the completion (up to end-of-sequence) is ``a + b``."""

    max_operand: int = 49
    seed: int = 0

    def prompts(self, step: int, count: int) -> list[Prompt]:
        rng = random.Random(self.seed * 1_000_003 + step)
        out = []
        for i in range(count):
            a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
            out.append(Prompt(f"s{step}-{i}", f"{a}+{b}=", {"answer": str(a + b)}))
        return out

    def examples(self, rng: random.Random) -> Iterator[tuple[str, str]]:
        while True:
            a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
            yield f"{a}+{b}=", str(a + b)

    @staticmethod
    def reward(prompt: Prompt, completion: str) -> float:
        return 1.0 if completion.strip() == str(prompt.meta["answer"]) else 0.0

    @property
    def max_new_tokens(self) -> int:
        return len(str(2 * self.max_operand)) + 1


@dataclass(frozen=True)
class MathFileTask:
    """GSM8K-style data from a ``.jsonl`` or ``.parquet`` file with ``question`` and ``answer`` columns; the
    reward is 1.0 when the last number of the completion equals the reference's final answer."""

    path: str
    seed: int = 0
    max_new_tokens: int = 256

    def _rows(self) -> list[dict]:
        path = Path(self.path)
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def prompts(self, step: int, count: int) -> list[Prompt]:
        rows = self._rows()
        rng = random.Random(self.seed * 1_000_003 + step)
        picked = [rows[rng.randrange(len(rows))] for _ in range(count)]
        return [Prompt(f"s{step}-{i}", f"Question: {r['question']}\nAnswer:", {"answer": _final(str(r["answer"]))})
                for i, r in enumerate(picked)]

    @staticmethod
    def reward(prompt: Prompt, completion: str) -> float:
        return 1.0 if _final(completion) == prompt.meta["answer"] else 0.0


def _final(text: str) -> str:
    if "####" in text:
        text = text.split("####")[-1]
    numbers = re.findall(r"-?\d[\d,]*\.?\d*", text)
    return numbers[-1].replace(",", "").rstrip(".") if numbers else ""
