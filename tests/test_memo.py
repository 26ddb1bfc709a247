"""engine/memo.py: the bounded memo tables of the flow's pure functions of shapes."""
import numpy as np

from engine.memo import Memo, values_key


def test_memo_forgets_its_oldest_entry_past_its_size():
    m = Memo(size=2)
    assert m.put("a", 1) == 1
    m.put("b", 2)
    m.put("c", 3)
    assert list(m) == ["b", "c"] and m.get("a") is None


def test_values_key_tells_values_dtypes_and_shapes_apart():
    k = values_key({1: np.array([2, 3], np.int64)})
    assert k == values_key({1: np.array([2, 3], np.int64)})
    assert k != values_key({1: np.array([3, 2], np.int64)})
    assert k != values_key({1: np.array([2, 3], np.int32)})
    assert k != values_key({1: np.array([[2, 3]], np.int64)})
    assert k != values_key({2: np.array([2, 3], np.int64)})
    hash(k)
