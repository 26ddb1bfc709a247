"""ShapePredictor / realloc_if_needed replay: behaviour pinned against OpenVINO's GPU plugin."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.shape_predictor import (PreallocSettings, ShapePredictor, _f32, _memory_limit, can_preallocate,
                                    simulate_openvino)

MIB = 2 ** 20
F16 = 16


def _feed(sp, shapes, bits=F16, id="n"):
    """Feed shapes as non-reusable; return the last answer."""
    out = None
    for s in shapes:
        out = sp.predict_preallocation_shape(id, s, bits, False)
    return out


# --- figures pinned by the issue -------------------------------------------------------------

def test_pinned_kv_like_growth_batch1():
    # one f16 slice [1,32,1,128] is 8 KiB <= 16 KiB, so iterations mode grows 10 rows at a time
    r = simulate_openvino([(1, 32, L, 128) for L in range(128, 2049)], F16)
    assert r.reallocations == 177
    assert round(r.total_allocated_bytes / MIB, 1) == 1501.8
    assert round(r.peak_slack_bytes / MIB, 2) == 0.08
    assert r.steps[0].action == "alloc"  # the very first allocation is counted


def test_pinned_kv_like_growth_batch4():
    # slice [4,32,1,128] f16 is 32 KiB > 16 KiB: falls back to 1.1x ratio mode
    r = simulate_openvino([(4, 32, L, 128) for L in range(128, 2049)], F16)
    assert r.reallocations == 31
    assert round(r.total_allocated_bytes / MIB, 1) == 696.8


# --- predictor rules ---------------------------------------------------------------------------

def test_needs_three_shapes():
    sp = ShapePredictor()
    assert sp.predict_preallocation_shape("n", (1, 4), F16, False) == (False, ())
    assert sp.predict_preallocation_shape("n", (1, 5), F16, False) == (False, ())
    assert sp.last_mode == "none"
    assert sp.predict_preallocation_shape("n", (1, 6), F16, False) == (True, (1, 16))


def test_iterations_mode_fixed_step():
    sp = ShapePredictor()
    assert _feed(sp, [(2, 10, 8), (2, 11, 8), (2, 12, 8)]) == (True, (2, 22, 8))
    assert sp.last_mode == "iterations"


def test_step_equal_to_max_per_dim_diff_is_allowed():
    # the source rejects only diff > max_per_dim_diff
    sp = ShapePredictor()
    assert _feed(sp, [(1, 10), (1, 12), (1, 14)]) == (True, (1, 34))
    assert sp.last_mode == "iterations"


def test_step_three_falls_back_to_ratio():
    sp = ShapePredictor()
    ok, shape = _feed(sp, [(3, 10, 8), (6, 13, 11), (9, 16, 14)])
    assert ok and sp.last_mode == "ratio"
    # ratio mode returns a flat shape of the same rank: [int(count * 1.1f), 1, 1]
    assert shape == (int(9 * 16 * 14 * 1.1), 1, 1)


def test_unequal_steps_or_shrink_use_ratio():
    sp = ShapePredictor()
    _feed(sp, [(1, 10), (1, 11), (1, 13)])
    assert sp.last_mode == "ratio"
    sp = ShapePredictor()
    ok, shape = _feed(sp, [(1, 12), (1, 11), (1, 10)])
    assert ok and sp.last_mode == "ratio" and shape == (11, 1)


def test_no_growth_uses_ratio():
    sp = ShapePredictor()
    ok, shape = _feed(sp, [(1, 100)] * 3)
    assert (ok, shape, sp.last_mode) == (True, (110, 1), "ratio")


def test_per_iteration_bytes_limit():
    # [1,L,8192] f16: one iteration = 16384 bytes, exactly the limit -> still iterations
    sp = ShapePredictor()
    assert _feed(sp, [(1, L, 8192) for L in (1, 2, 3)]) == (True, (1, 13, 8192))
    # one more column: 16386 bytes > 16384 -> ratio
    sp = ShapePredictor()
    _feed(sp, [(1, L, 8193) for L in (1, 2, 3)])
    assert sp.last_mode == "ratio"


def test_per_iteration_limit_is_in_bytes_not_bits():
    # 4-bit elements: 32768 of them are 16384 bytes (131072 bits) -> iterations allowed
    sp = ShapePredictor()
    _feed(sp, [(1, L, 32768) for L in (1, 2, 3)], bits=4)
    assert sp.last_mode == "iterations"
    sp = ShapePredictor()
    _feed(sp, [(1, L, 32770) for L in (1, 2, 3)], bits=4)
    assert sp.last_mode == "ratio"


def test_disabled_settings_never_predict():
    sp = ShapePredictor(PreallocSettings.parse("0 0 0 1.0"))
    for shapes in ([(1, L) for L in range(1, 10)], [(L, L) for L in range(1, 30, 3)], [(4, 4)] * 5):
        sp.reset()
        for s in shapes:
            assert sp.predict_preallocation_shape("n", s, F16, False) == (False, ())
    r = simulate_openvino([(1, 32, L, 128) for L in range(128, 200)], F16, PreallocSettings.parse("0 0 0 1.0"))
    assert r.reallocations == 72 and r.peak_slack_bytes == 0


def test_can_reuse_records_history_but_never_predicts():
    sp = ShapePredictor()
    assert sp.predict_preallocation_shape("n", (1, 1), F16, True) == (False, ())
    assert sp.predict_preallocation_shape("n", (1, 2), F16, True) == (False, ())
    assert sp.predict_preallocation_shape("n", (1, 3), F16, True) == (False, ())
    assert sp.history("n") == ((1, 1), (1, 2), (1, 3))
    # the reused iterations still count towards the trend
    assert sp.predict_preallocation_shape("n", (1, 4), F16, False) == (True, (1, 14))


def test_history_is_bounded_and_per_id():
    sp = ShapePredictor()
    _feed(sp, [(1, i) for i in range(1, 6)], id="a")
    assert sp.history("a") == ((1, 3), (1, 4), (1, 5))
    assert sp.predict_preallocation_shape("b", (1, 6), F16, False) == (False, ())
    sp.reset()
    assert sp.history("a") == ()


def test_custom_dim_and_count_skip_prediction():
    sp = ShapePredictor()
    assert sp.predict_preallocation_shape("kv", (1, 8, 5, 64), F16, False,
                                          custom_next_iters=130, custom_prealloc_dim=2) == (True, (1, 8, 135, 64))


def test_can_preallocate_90_percent_rule():
    assert ShapePredictor().can_preallocate(10 ** 15)  # unknown device size: always allowed
    sp = ShapePredictor(device_mem_bytes=1000)
    assert sp.can_preallocate(899)
    assert not sp.can_preallocate(900)        # strict '<'
    assert sp.can_preallocate(400, used_bytes=499)
    assert not sp.can_preallocate(400, used_bytes=500)
    assert not ShapePredictor(max_alloc_bytes=100).can_preallocate(101)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2 ** 62), st.integers(0, 2 ** 62), st.integers(1, 2 ** 62))
def test_can_preallocate_shortcut_answers_as_the_float32_rule(desired, used, device):
    """Well below the limit the rule answers without rounding to float32 (a growth asks for
    each buffer): the answer is the float32 comparison's, also next to the limit."""
    limit = _memory_limit(device)
    exact = float(_f32(used + desired)) < limit
    assert can_preallocate(desired, used, device) == exact
    near = int(limit) - used          # at the limit's edge, where float32 rounding decides
    if near >= 0:
        for d in (near - 2, near - 1, near, near + 1):
            if d >= 0:
                assert can_preallocate(d, used, device) == (float(_f32(used + d)) < limit)


def test_simulator_uses_exact_size_when_preallocation_does_not_fit():
    shapes = [(1, L) for L in range(100, 120)]
    r = simulate_openvino(shapes, 32, device_mem_bytes=500)  # 0.9*500 = 450 bytes < 100 floats
    assert r.reallocations == len(shapes) and not any(s.predicted for s in r.steps)


def test_simulator_reclaims_oversized_buffer():
    # required * 10 < capacity -> buffer dropped and a smaller one allocated
    r = simulate_openvino([(1000,), (1000,), (99,), (100,)], 8)
    assert [s.action for s in r.steps] == ["alloc", "reuse", "alloc", "reuse"]
    assert r.steps[2].reclaimed and r.steps[2].capacity_bytes < 1000
    r = simulate_openvino([(1000,), (100,)], 8)  # 100*10 == 1000: not reclaimed
    assert [s.action for s in r.steps] == ["alloc", "reuse"]


# --- settings text form ---------------------------------------------------------------------

def test_settings_parse_and_str_round_trip():
    s = PreallocSettings.parse("10 16384 2 1.1")
    assert s == PreallocSettings()
    assert str(s) == "10 16384 2 1.1"
    assert str(PreallocSettings.parse("  0\t0 0   1.0 ")) == "0 0 0 1.0"


@pytest.mark.parametrize("text", ["", "10 16384 2", "10 16384 2 1.1 5", "ten 16384 2 1.1", "10 -1 2 1.1",
                                  "10 16384 2.5 1.1", "10 16384 2 x", "10 16384 2 nan", "10 16384 2 -1.1"])
def test_settings_parse_errors(text):
    with pytest.raises(ValueError) as e:
        PreallocSettings.parse(text)
    assert "\n" not in str(e.value) and "preallocation options" in str(e.value)


def test_adaptive_recent_max_is_the_max_of_the_window():
    """The adaptive policy's running max (a monotonic queue) equals the max over its window
    of requirements, whatever the order they come in."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from engine.predictors import _Track

    @settings(max_examples=200, deadline=None)
    @given(st.integers(1, 8), st.lists(st.integers(0, 50), min_size=1, max_size=60))
    def check(window, needs):
        tr = _Track(window)
        for k, n in enumerate(needs):
            tr.observe((n,), n)
            assert tr.recent[0][1] == max(needs[max(0, k + 1 - window):k + 1])
    check()
