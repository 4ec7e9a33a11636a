from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from partir.core.actions import Tile
from partir.core.dialect import make_loop, make_slice
from partir.ir import (
    Function,
    Op,
    RangeType,
    Value,
    VerificationError,
    print_function,
    verify,
)
from partir.ir.printer import _IDENT, Namer
from tests.listings import f32 as _t


def test_printer_uses_the_paper_syntax():
    x = Value(_t(256, 8), "x")
    r = Value(RangeType("B", 4), "rB")
    s = Value(_t(64, 8))
    out = Value(_t(256, 8))
    loop = make_loop("B", 4, (Tile(0),), [make_slice(x, 0, r, s)], [s], [out], r)
    text = print_function(Function("f", [x], [loop], [out]))
    assert 'loop "B" [#tile<0>] (%rB: range<4>) {' in text
    assert "slice 0 %x[%rB] : tensor<64x8xf32>" in text
    assert "} : tensor<256x8xf32>" in text
    verify(Function("f", [x], [loop], [out]))


def test_verifier_rejects_use_before_definition():
    x = Value(_t(2), "x")
    y = Value(_t(2))
    z = Value(_t(2))
    ops = [Op("neg", [y], [z]), Op("neg", [x], [y])]
    with pytest.raises(VerificationError, match="before its definition"):
        verify(Function("f", [x], ops, [z]))


def test_verifier_rejects_range_escaping_its_loop():
    x = Value(_t(8), "x")
    r = Value(RangeType("B", 2), "rB")
    s = Value(_t(4))
    out = Value(_t(8))
    loop = make_loop("B", 2, (Tile(0),), [make_slice(x, 0, r, s)], [s], [out], r)
    leak = Value(_t(4))
    with pytest.raises(VerificationError):
        verify(Function("f", [x], [loop, make_slice(x, 0, r, leak)], [out]))


def test_verifier_checks_slice_and_loop_types():
    x = Value(_t(8, 3), "x")
    r = Value(RangeType("B", 2), "rB")
    bad = Value(_t(8, 3))
    with pytest.raises(VerificationError, match="should be tensor<4x3xf32>"):
        verify(Function("f", [x, r], [make_slice(x, 0, r, bad)], [bad]))
    s = Value(_t(4, 3))
    out = Value(_t(4, 3))  # a #tile<0> loop must return 8x3
    loop = make_loop("B", 2, (Tile(0),), [make_slice(x, 0, r, s)], [s], [out], r)
    with pytest.raises(VerificationError, match="does not match"):
        verify(Function("f", [x], [loop], [out]))


def _reference_names(hints: list[str | None]) -> list[str]:
    """Naming as a plain search from suffix 1 for every repeated hint would do it."""
    used: set[str] = set()
    names, counter = [], 0
    for hint in hints:
        if hint is None:
            while str(counter) in used:
                counter += 1
            name = str(counter)
            counter += 1
        else:
            quote = (lambda s: s) if _IDENT.match(hint) else (lambda s: f'"{s}"')
            name, i = quote(hint), 0
            while name in used:
                i += 1
                name = quote(f"{hint}_{i}")
        used.add(name)
        names.append(name)
    return names


@given(st.lists(st.one_of(st.none(), st.sampled_from(
    ["x", "x_1", "x_2", "x_1_1", "0", "1", "a b", "a b_1", "y"])), max_size=40))
def test_names_are_those_of_a_search_from_the_first_suffix(hints):
    namer = Namer()
    assert [namer(Value(_t(1), h)) for h in hints] == _reference_names(hints)


class _CountingSet(set):
    lookups = 0

    def __contains__(self, item: object) -> bool:
        self.lookups += 1
        return super().__contains__(item)


def test_naming_many_values_with_one_hint_takes_linear_time():
    namer = Namer()
    namer._used = used = _CountingSet()
    names = [namer(Value(_t(1), "h")) for _ in range(2000)]
    assert names[:3] == ["h", "h_1", "h_2"] and names[-1] == "h_1999"
    # A search restarting at suffix 1 makes 2000 * 2001 / 2 lookups.
    assert used.lookups <= 2 * len(names)
