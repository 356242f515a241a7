"""Element orders (a training tensor read as a finer view with its axes permuted): the position maps both ways
are exactly what torch's own reshape/permute does to the elements, for every position, on transposes and
de-interleaves alike; a run of training rows (a rank's shard) is a contiguous run of the block; bad orders and
bad documents are typed errors."""

from __future__ import annotations

import pytest
import torch

from aurora_store.codec.layout import Component, InferenceTensor, ModelLayout
from aurora_store.codec.order import ElementOrder
from aurora_store.errors import LayoutError

E, H, I = 3, 5, 4  # noqa: E741 — the experts' own letters: experts, hidden size, intermediate size

ORDERS = {
    # gpt-oss's gate_up_proj [E, H, 2I] → vLLM's w13 [E, 2I, H]
    "transpose": ElementOrder((E, H, 2 * I), (E, H, 2 * I), (0, 2, 1)),
    # the same with alternating gate/up columns split into gate rows then up rows
    "transpose+deinterleave": ElementOrder((E, H, 2 * I), (E, H, I, 2), (0, 3, 2, 1)),
    # alternating gate/up rows → gate rows then up rows
    "deinterleave rows": ElementOrder((E, 2 * I, H), (E, I, 2, H), (0, 2, 1, 3)),
    # an alternating bias [E, 2I]
    "deinterleave bias": ElementOrder((E, 2 * I), (E, I, 2), (0, 2, 1)),
}


def _reference(order: ElementOrder, tensor: torch.Tensor) -> torch.Tensor:
    """What the order means, spelled with torch directly."""
    return tensor.reshape(order.view).permute(order.axes).reshape(-1)


@pytest.mark.parametrize("name", sorted(ORDERS))
def test_position_maps_are_exact_both_ways_for_every_element(name):
    order = ORDERS[name]
    # Every element's value is its own storage index: the block then reads as the map itself.
    train = torch.arange(order.numel, dtype=torch.int64).reshape(order.shape)
    block = _reference(order, train)
    positions = torch.arange(order.numel)
    assert torch.equal(order.train_index(positions), block)  # block position → storage index
    assert torch.equal(order.engine_index(block), positions)  # and back
    assert torch.equal(torch.sort(order.train_index(positions)).values, positions)  # a permutation
    assert torch.equal(order.to_engine(train), block)
    assert torch.equal(order.to_train(block), train)


def test_the_deinterleave_puts_gate_rows_before_up_rows():
    order = ORDERS["transpose+deinterleave"]
    gate_up = torch.randn(E, H, 2 * I)
    block = order.to_engine(gate_up).reshape(E, 2 * I, H)
    assert torch.equal(block[:, :I], gate_up[..., ::2].transpose(1, 2))
    assert torch.equal(block[:, I:], gate_up[..., 1::2].transpose(1, 2))
    assert torch.equal(ORDERS["transpose"].to_engine(gate_up).reshape(E, 2 * I, H), gate_up.transpose(1, 2))


@pytest.mark.parametrize("name", sorted(ORDERS))
def test_a_run_of_training_rows_is_a_contiguous_run_of_the_block(name):
    order = ORDERS[name]
    train = torch.randn(order.shape).to(torch.bfloat16)
    whole = order.to_engine(train)
    row = order.numel // order.shape[0]
    for start, stop in ((0, 1), (1, 3), (2, 3), (0, 3)):
        assert torch.equal(order.to_engine(train[start:stop]), whole[start * row: stop * row])
        assert torch.equal(order.to_train(whole[start * row: stop * row]), train[start:stop])


def test_bf16_bits_survive_unchanged():
    order = ORDERS["transpose"]
    bits = torch.randint(-(1 << 15), 1 << 15, order.shape, dtype=torch.int16)  # NaN payloads included
    back = order.to_train(order.to_engine(bits.view(torch.bfloat16)))
    assert torch.equal(back.view(torch.int16), bits)


@pytest.mark.parametrize(("shape", "view", "axes", "match"), [
    ((3, 4), (3, 5), (0, 1), "does not hold"),
    ((3, 4), (3, 2, 2), (0, 1, 1), "not a permutation"),
    ((3, 4), (4, 3), (1, 0), "dim 0"),
    ((3, 4), (3, 4), (1, 0), "dim 0"),
    ((3, 4, 5), (3, 4, 5), (0, 1, 2), "storage order"),
    ((), (1,), (0,), "invalid"),
    ((3, -4), (3, -4), (0, 1), "invalid"),
])
def test_bad_orders_are_refused(shape, view, axes, match):
    with pytest.raises(LayoutError, match=match):
        ElementOrder(shape, view, axes)


def _layout(order: ElementOrder | None, rows: int = E, shape: tuple[int, ...] = (E, 2 * I, H)) -> ModelLayout:
    return ModelLayout((InferenceTensor("w13", shape, (Component("gate_up_proj", 0, rows, order),)),))


def test_the_order_is_part_of_the_layout_document_only_where_there_is_one():
    plain, ordered = _layout(None), _layout(ORDERS["transpose"])
    assert plain.to_json()["tensors"][0]["components"] == [["gate_up_proj", E]]
    assert ordered.to_json()["tensors"][0]["components"] == [
        ["gate_up_proj", E, {"shape": [E, H, 2 * I], "view": [E, H, 2 * I], "axes": [0, 2, 1]}]]
    assert ModelLayout.from_json(ordered.to_json()) == ordered
    assert plain.fingerprint != ordered.fingerprint != _layout(ORDERS["transpose+deinterleave"]).fingerprint
    assert ordered["w13"].component_shape(ordered["w13"].components[0]) == (E, H, 2 * I)


def test_an_order_that_does_not_fill_its_rows_is_refused():
    with pytest.raises(LayoutError, match="does not fill"):
        _layout(ElementOrder((E - 1, H, 2 * I), (E - 1, H, 2 * I), (0, 2, 1)))
    with pytest.raises(LayoutError, match="does not fill"):
        _layout(ORDERS["transpose"], shape=(E, 2 * I, H + 1))


@pytest.mark.parametrize(("entry", "match"), [
    (["gate_up_proj", E, {"shape": [E, H, 2 * I], "view": [E, H, 2 * I]}], "shape, view and axes"),
    (["gate_up_proj", E, {"shape": [E, H, 2 * I], "view": [E, H, 2 * I], "axes": "021"}], "list of integers"),
    (["gate_up_proj", E, {"shape": [E, H, 2 * I], "view": [E, H, 2 * I], "axes": [0, 2, 1.0]}], "integer"),
    (["gate_up_proj", E, {"shape": [E, H, 2 * I], "view": [E, H, 2 * I], "axes": [0, 1, 1]}], "permutation"),
    (["gate_up_proj", E, {}, None], "name, rows"),
    (["gate_up_proj", E, [0, 2, 1]], "shape, view and axes"),
])
def test_malformed_order_documents_are_layout_errors(entry, match):
    doc = _layout(ORDERS["transpose"]).to_json()
    doc["tensors"][0]["components"] = [entry]
    with pytest.raises(LayoutError, match=match):
        ModelLayout.from_json(doc)


def test_the_benchmark_measures_an_exact_reordering():
    from benchmarks.element_order import measure

    result = measure(experts=2, hidden=24, inter=16, density=0.05, repeat=1)
    assert result["bit_exact"] and result["shape"] == [2, 24, 32] and result["engine_shape"] == [2, 32, 24]
    assert result["changed"] == int(2 * 24 * 32 * 0.05) and result["scatter_ordered_s"] > 0
