"""`partir.ir.fragments`: the bounded store of lowering fragments, and the rewiring and
sharing that let a fragment made for one program serve another."""

from partir.ir import Op, TensorType, Value
from partir.ir.fragments import Fragments, rewired, sharing

T = TensorType((2,), "float32")


def test_fragments_keep_what_the_last_lowerings_used_within_the_bound():
    fragments = Fragments(max_entries=2)
    fragments.put(("pass", 1), None, "one")
    fragments.put(("pass", 2), None, "two")
    fragments.put(("pass", 3), None, "three")  # a new generation: 1 and 2 are older
    assert fragments.get(("pass", 1)) == "one"  # found, and kept in the newer
    fragments.put(("pass", 4), None, "four")  # another: 2, unused since, is dropped
    assert fragments.get(("pass", 2)) is None
    assert [fragments.get(("pass", k)) for k in (1, 3, 4)] == ["one", "three", "four"]
    assert fragments.made["pass"] == 4 and fragments.reused["pass"] == 4


def test_rewired_ops_read_the_new_values_and_keep_their_results():
    a, b, c = Value(T), Value(T), Value(T)
    reads_a = Op("neg", [a], [Value(T)])
    reads_c = Op("neg", [c], [Value(T)])
    both = Op("add", [reads_a.results[0], a], [Value(T)])
    out = rewired([reads_a, reads_c, both], [a, c], [b, c])
    assert out[1] is reads_c
    assert [op.operands for op in (out[0], out[2])] == [[b], [reads_a.results[0], b]]
    assert [op.results for op in out] == [op.results for op in (reads_a, reads_c, both)]


def test_sharing_tells_one_value_read_twice_from_two_values():
    a, b = Value(T), Value(T)
    assert sharing([a, b]) == ()
    assert sharing([a, b, a]) == (0, 1, 0)
    assert sharing([a, a]) != sharing([a, b])
