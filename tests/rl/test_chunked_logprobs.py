"""The GRPO loss's chunked logsumexp over the output head equals the full log_softmax: values and gradients
of every parameter, for tied and untied heads, any chunk size, ragged prompts and completions."""

from __future__ import annotations

import pytest
import torch

from workers.rl.grpo import ChunkedTokenLogprob, Sample, grpo_loss, token_logprobs
from workers.rl.model import DEFAULT_CONFIG, build_model


def _samples(vocab: int) -> list[Sample]:
    gen = torch.Generator().manual_seed(3)
    out = []
    for i, (p, c) in enumerate([(5, 7), (3, 2), (9, 11), (4, 1)]):
        ids = torch.randint(3, vocab, (p + c,), generator=gen).tolist()
        out.append(Sample(tuple(ids[:p]), tuple(ids[p:]), tuple((-torch.rand(c, generator=gen)).tolist()),
                          float(i % 2), "g"))
    return out


def _loss_and_grads(model, samples, chunk):
    model.zero_grad(set_to_none=True)
    new, mask = token_logprobs(model, samples, chunk=chunk)
    old = torch.zeros_like(new)
    for i, s in enumerate(samples):
        old[i, : len(s.old_logprobs)] = torch.tensor(s.old_logprobs)
    loss, _ = grpo_loss(new, old, mask, torch.tensor([1.0, -0.5, 0.7, -1.2]), 0.2)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    grads["head"] = model.get_output_embeddings().weight.grad.clone()  # tied: the embedding's, both uses summed
    return new.detach(), mask, float(loss), grads


@pytest.mark.parametrize("tied", [True, False])
def test_chunked_equals_full_loss_and_gradients(tied):
    model = build_model({**DEFAULT_CONFIG, "tie_word_embeddings": tied}, seed=1)
    samples = _samples(DEFAULT_CONFIG["vocab_size"])
    full_new, full_mask, full_loss, full_grads = _loss_and_grads(model, samples, chunk=0)
    assert full_grads["head"].abs().sum() > 0
    for chunk in (1, 5, 4096):
        new, mask, loss, grads = _loss_and_grads(model, samples, chunk=chunk)
        assert torch.equal(mask, full_mask)
        torch.testing.assert_close(new, full_new, rtol=0, atol=1e-5)
        assert loss == pytest.approx(full_loss, abs=1e-6)
        assert grads.keys() == full_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, full_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_function_gradients_in_float64():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    targets = torch.randint(0, 11, (7,), generator=gen)
    assert torch.autograd.gradcheck(lambda h, w: ChunkedTokenLogprob.apply(h, w, targets, 3), (hidden, weight))
    expected = torch.log_softmax(hidden @ weight.T, dim=-1).gather(1, targets[:, None]).squeeze(1)
    torch.testing.assert_close(ChunkedTokenLogprob.apply(hidden, weight, targets, 2), expected)
