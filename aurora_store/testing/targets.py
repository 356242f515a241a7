"""The weight-target conformance suite, shipped for any :class:`~aurora_store.codec.WeightTarget` (like
:class:`~aurora_store.testing.conformance.BucketConformance` for buckets).

A target — a tensor target, an inference engine's, yours — proves the contract by subclassing
:class:`WeightTargetConformance` in a pytest module and providing a ``weight_target_case`` fixture that
returns a :class:`TargetCase`: the target, at a declared version, over weights the test knows::

    class TestMyTarget(WeightTargetConformance):
        @pytest.fixture()
        def weight_target_case(self):
            layout = ModelLayout.from_config(TINY_QWEN3)
            state = random_state(layout)
            return TargetCase(MyTarget(layout, state, version=3), state)

The suite may write, but every test puts back what it wrote (and the version and digest it found), so a
target shared between tests (an engine that is expensive to start) can be handed out again. Queuing is not
asserted either way: only that :meth:`~aurora_store.codec.WeightTarget.flush` makes writes visible.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch

from aurora_store.codec import WeightTarget, activate, bits_view, digest_state, stage
from aurora_store.codec.layout import InferenceTensor, ModelLayout
from aurora_store.errors import LayoutError
from aurora_store.testing.builders import blobs, encode, perturb


@dataclass(frozen=True)
class TargetCase:
    """A target under test and the weights it holds (training layout, bf16); ``target.version`` must be
    declared (not ``None``) and ``target.digest`` must be those weights' digest."""

    target: WeightTarget
    state: Mapping[str, torch.Tensor]

    @property
    def layout(self) -> ModelLayout:
        return self.target.layout

    def expected(self) -> dict[str, torch.Tensor]:
        """Every inference tensor's bits, flat, as the target must hold them."""
        return {name: bits_view(t).reshape(-1) for name, t in self.layout.fuse(self.state).items()}


def boundary_indices(tensor: InferenceTensor) -> torch.Tensor:
    """Sorted flat indices at the edges of the tensor and of each of its components (where a target's
    storage pieces meet), plus a stride through the middle."""
    points = {0, tensor.numel - 1}
    for component in tensor.components:
        lo, hi = tensor.component_span(component)
        points.update({lo, lo + 1, hi - 1, hi})
    points.update(range(0, tensor.numel, max(1, tensor.numel // 7)))
    return torch.tensor(sorted(p for p in points if 0 <= p < tensor.numel), dtype=torch.int64)


class WeightTargetConformance:
    """Every :class:`~aurora_store.codec.WeightTarget`'s contract, as tests.

    Subclass it and provide a ``weight_target_case`` fixture returning a :class:`TargetCase`.
    ``bad_input_errors`` are the typed errors bad input may raise: a target whose writes are checked in
    another process may report them as that boundary's error (e.g. :class:`~aurora_store.errors.
    EngineError`), as long as it is an :class:`~aurora_store.errors.AuroraError`.
    """

    bad_input_errors: tuple[type[Exception], ...] = (LayoutError,)

    # --- helpers ---------------------------------------------------------------------------------------

    @staticmethod
    @contextmanager
    def restoring(case: TargetCase, written: dict[str, torch.Tensor]) -> Iterator[None]:
        """Put the case's weights back at every index recorded in ``written`` (name → indices) and its
        version and digest, whatever the test did in between."""
        target = case.target
        version, digest = target.version, target.digest
        try:
            yield
        finally:
            expected = case.expected()
            for name, indices in written.items():
                target.scatter(name, indices, expected[name][indices].clone())
            target.flush()
            target.version, target.digest = version, digest

    @staticmethod
    def assert_holds(case: TargetCase, names: list[str] | None = None) -> None:
        expected = case.expected()
        for name in names or case.layout.names:
            assert torch.equal(case.target.fused_bits(name), expected[name]), name

    # --- reads -----------------------------------------------------------------------------------------

    def test_declared_version_and_digest(self, weight_target_case: TargetCase):
        target = weight_target_case.target
        assert target.version is not None
        assert target.full_digest() == target.digest == digest_state(target.layout, weight_target_case.state)

    def test_gather_at_piece_boundaries(self, weight_target_case: TargetCase):
        target, expected = weight_target_case.target, weight_target_case.expected()
        requests = [(t.name, boundary_indices(t)) for t in target.layout.tensors]
        for name, indices in requests:
            got = target.gather(name, indices)
            assert got.dtype == torch.int16 and torch.equal(got, expected[name][indices]), name
        for (name, indices), got in zip(requests, target.gather_many(requests), strict=True):
            assert torch.equal(got, expected[name][indices]), name
        empty = target.gather(requests[0][0], torch.zeros(0, dtype=torch.int64))
        assert empty.numel() == 0

    def test_element_at_piece_boundaries(self, weight_target_case: TargetCase):
        target, expected = weight_target_case.target, weight_target_case.expected()
        for tensor in target.layout.tensors:
            if len(tensor.components) == 1 and tensor is not target.layout.tensors[0]:
                continue  # one element round trip each: the multi-piece tensors and one other suffice
            for index in boundary_indices(tensor).tolist():
                assert target.element(tensor.name, index) == int(expected[tensor.name][index]), (tensor.name, index)

    def test_fused_bits_are_the_weights(self, weight_target_case: TargetCase):
        self.assert_holds(weight_target_case)

    # --- writes ----------------------------------------------------------------------------------------

    def test_scatter_then_flush_is_visible(self, weight_target_case: TargetCase):
        case = weight_target_case
        target, expected = case.target, case.expected()
        written = {t.name: boundary_indices(t) for t in target.layout.tensors}
        with self.restoring(case, written):
            new = {name: expected[name][indices] ^ 1 for name, indices in written.items()}  # lowest mantissa bit
            for name, indices in written.items():
                target.scatter(name, indices, new[name].clone())
            target.flush()
            target.flush()  # nothing left queued: a no-op
            for name, got in zip(written, target.gather_many(list(written.items())), strict=True):
                assert torch.equal(got, new[name]), name
            for name, indices in written.items():
                changed = expected[name].clone()
                changed[indices] = new[name]
                assert torch.equal(target.fused_bits(name), changed), name
        self.assert_holds(case)
        assert target.full_digest() == target.digest

    def test_activate_of_a_staged_delta(self, weight_target_case: TargetCase):
        case = weight_target_case
        target = case.target
        base, base_digest = target.version, target.digest
        assert base is not None
        nxt = perturb(case.state, 0.01, seed=base + 1)
        manifest, segments = encode(target.layout, case.state, nxt, base + 1, base, base_digest)
        staged = stage(manifest, blobs(segments), target)
        assert target.version == base and target.digest == base_digest  # staging writes nothing
        self.assert_holds(case)
        written = {u.tensor: u.indices for u in staged.updates}
        with self.restoring(case, written):
            activate(staged, target)
            assert target.version == base + 1
            assert str(target.digest) == manifest.weights_digest
            assert target.full_digest() == target.digest == digest_state(target.layout, nxt)
            self.assert_holds(TargetCase(target, nxt))
        self.assert_holds(case)
        assert (target.version, target.full_digest()) == (base, base_digest)

    # --- bad input -------------------------------------------------------------------------------------

    def test_bad_input_is_typed_and_changes_nothing(self, weight_target_case: TargetCase):
        case = weight_target_case
        target, layout = case.target, case.layout
        version, digest = target.version, target.digest
        fused = next(t for t in layout.tensors if len(t.components) > 1)  # several storage pieces
        ok = torch.tensor([0, fused.numel - 1])
        for call in (lambda: target.gather("no.such.tensor", ok),
                     lambda: target.gather_many([(fused.name, ok), ("no.such.tensor", ok)]),
                     lambda: target.element("no.such.tensor", 0),
                     lambda: target.fused_bits("no.such.tensor"),
                     lambda: target.scatter("no.such.tensor", ok, torch.zeros(2, dtype=torch.int16)),
                     lambda: target.scatter(fused.name, ok, torch.zeros(3, dtype=torch.int16)),
                     lambda: target.scatter(fused.name, ok, torch.zeros(2, dtype=torch.int32))):
            with pytest.raises(LayoutError):
                call()
        for call in (lambda: target.gather(fused.name, torch.tensor([0, fused.numel])),
                     lambda: target.gather(fused.name, torch.tensor([-1, 0])),
                     lambda: target.element(fused.name, fused.numel)):
            with pytest.raises(self.bad_input_errors):
                call()
        # A write whose first indices are fine (in the first piece) and whose last is past the end: refused
        # whole, at the scatter or at the flush, with no piece written.
        past = torch.tensor([0, 1, fused.numel])
        with pytest.raises(self.bad_input_errors):
            target.scatter(fused.name, past, torch.tensor([7, 7, 7], dtype=torch.int16))
            target.flush()
        target.version, target.digest = version, digest  # a failed flush may have forgotten the version
        target.flush()
        self.assert_holds(case)
        assert target.full_digest() == digest
