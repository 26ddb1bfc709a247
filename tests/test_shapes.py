"""Tests for dyncli.shapes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dyncli.shapes import (
    MAX_INFERENCES,
    ShapeSpecError,
    check_against_declared,
    format_inference,
    format_shape,
    parse_input_ranges,
    parse_model_shape,
    parse_shapes,
    parse_shapes_file,
)

BERT = ["input_ids", "attention_mask"]
ONE = ["gpu_0/data_0"]


def errmsg(fn, *args) -> str:
    """Call fn expecting a ShapeSpecError; return its (one-line) message."""
    with pytest.raises(ShapeSpecError) as info:
        fn(*args)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


# ---------------------------------------------------------------- trtexec form


def test_trtexec_single_inference():
    assert parse_shapes(["input_ids:1x16,attention_mask:1x16"], BERT) == [
        {"input_ids": (1, 16), "attention_mask": (1, 16)}
    ]


def test_result_follows_model_input_order():
    [inf] = parse_shapes(["attention_mask:1x4,input_ids:1x8"], BERT)
    assert list(inf) == BERT
    assert inf == {"input_ids": (1, 8), "attention_mask": (1, 4)}


def test_specs_are_concatenated_and_empty_list_gives_nothing():
    got = parse_shapes(["x:1x2", "x:3", "x:"], ["x"])
    assert got == [{"x": (1, 2)}, {"x": (3,)}, {"x": ()}]
    assert parse_shapes([], ["x"]) == []


@pytest.mark.parametrize("spec", ["x:", "x:scalar", "x[]", "scalar", "[]", " x : "])
def test_scalar_forms(spec):
    assert parse_shapes([spec], ["x"]) == [{"x": ()}]


def test_zero_dims_and_whitespace():
    assert parse_shapes([" a : 1 x 0 , b:0 "], ["a", "b"]) == [{"a": (1, 0), "b": (0,)}]


def test_name_optional_for_single_input():
    assert parse_shapes(["1x3x224x224"], ONE) == [{"gpu_0/data_0": (1, 3, 224, 224)}]


def test_names_with_colons_and_slashes_split_at_last_colon():
    assert parse_shapes(["gpu_0/data_0:1x3"], ONE) == [{"gpu_0/data_0": (1, 3)}]
    assert parse_shapes(["a:b:2,c:"], ["a:b", "c"]) == [{"a:b": (2,), "c": ()}]


def test_missing_name_with_several_inputs_lists_inputs():
    msg = errmsg(parse_shapes, ["1x16"], BERT)
    assert "'1x16'" in msg and "no input name" in msg
    assert "'input_ids', 'attention_mask'" in msg


def test_unknown_input_lists_valid_names():
    msg = errmsg(parse_shapes, ["input_ids:1x16,mask:1x16"], BERT)
    assert "unknown input 'mask'" in msg and "'input_ids', 'attention_mask'" in msg


def test_missing_input_is_named():
    msg = errmsg(parse_shapes, ["input_ids:1x16"], BERT)
    assert "no shape for input(s) 'attention_mask'" in msg
    assert "'input_ids:1x16'" in msg


def test_duplicate_input():
    msg = errmsg(parse_shapes, ["x:1,x:2"], ["x"])
    assert "'x' is given twice" in msg


@pytest.mark.parametrize(
    "spec, part",
    [
        ("x:1xa", "'a'"),
        ("x:1x-1", "'-1'"),
        ("x:1X2", "'1X2'"),
        ("x:1.5", "'1.5'"),
    ],
)
def test_bad_dimension_quoted(spec, part):
    msg = errmsg(parse_shapes, [spec], ["x"])
    assert "bad dimension" in msg and part in msg and repr(spec) in msg


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("x:1xx2", "empty dimension"),
        ("x:1x", "empty dimension"),
        ("x:1,", "empty input entry"),
        ("", "empty shape spec"),
        ("   ", "empty shape spec"),
        ("x[1,2", "missing ']'"),
        ("x:1x{2..3", "missing '}'"),
        ("x:1]", "unbalanced ']'"),
    ],
)
def test_syntax_errors(spec, needle):
    assert needle in errmsg(parse_shapes, [spec], ["x"])


# ---------------------------------------------------------------- ranges


def test_range_with_step():
    got = parse_shapes(["input_ids:1x{8..64..8},attention_mask:1x{8..64..8}"], BERT)
    assert [inf["input_ids"] for inf in got] == [(1, n) for n in range(8, 65, 8)]
    assert all(inf["attention_mask"] == inf["input_ids"] for inf in got)


def test_range_default_step_is_inclusive():
    got = parse_shapes(["x:{2..4}"], ["x"])
    assert got == [{"x": (2,)}, {"x": (3,)}, {"x": (4,)}]


def test_range_end_not_on_step_is_not_reached():
    got = parse_shapes(["x:{8..20..8}"], ["x"])
    assert [inf["x"] for inf in got] == [(8,), (16,)]


def test_descending_ranges():
    assert [i["x"] for i in parse_shapes(["x:{64..8..-8}"], ["x"])] == [(n,) for n in range(64, 7, -8)]
    # Without a step a descending range counts down by one.
    assert [i["x"] for i in parse_shapes(["x:{3..1}"], ["x"])] == [(3,), (2,), (1,)]


def test_single_valued_range():
    assert parse_shapes(["x:{5..5}"], ["x"]) == [{"x": (5,)}]


def test_two_ranges_in_one_input_zip():
    got = parse_shapes(["x:{1..3}x{10..30..10}"], ["x"])
    assert [i["x"] for i in got] == [(1, 10), (2, 20), (3, 30)]


def test_fixed_input_broadcasts_against_range():
    got = parse_shapes(["input_ids:1x{8..10},attention_mask:1x16"], BERT)
    assert got == [{"input_ids": (1, n), "attention_mask": (1, 16)} for n in (8, 9, 10)]


def test_range_length_mismatch_across_inputs():
    msg = errmsg(parse_shapes, ["input_ids:1x{8..16},attention_mask:1x{8..10}"], BERT)
    assert "different lengths" in msg
    assert "'input_ids' gives 9" in msg and "'attention_mask' gives 3" in msg


def test_range_length_mismatch_within_input():
    msg = errmsg(parse_shapes, ["x:{1..2}x{1..3}"], ["x"])
    assert "different lengths" in msg and "'{1..2}' gives 2" in msg and "'{1..3}' gives 3" in msg


@pytest.mark.parametrize(
    "rng, needle",
    [
        ("{8..64..0}", "zero step"),
        ("{64..8..8}", "is empty"),
        ("{8..64..-8}", "is empty"),
        ("{8..}", "bad range"),
        ("{a..b}", "bad range"),
        ("{-2..4}", "negative bound"),
        (f"{{0..{MAX_INFERENCES}}}", "limit"),
    ],
)
def test_bad_ranges(rng, needle):
    msg = errmsg(parse_shapes, [f"x:1x{rng}"], ["x"])
    assert needle in msg and repr(rng) in msg


# ---------------------------------------------------------------- repeat


def test_repeat_plain():
    got = parse_shapes(["input_ids:1x16,attention_mask:1x16*3"], BERT)
    assert got == [{"input_ids": (1, 16), "attention_mask": (1, 16)}] * 3
    # Each inference is its own dict.
    assert len({id(d) for d in got}) == 3


def test_repeat_repeats_whole_range_sequence():
    got = parse_shapes(["x:{1..2}*2"], ["x"])
    assert [i["x"] for i in got] == [(1,), (2,), (1,), (2,)]


def test_repeat_on_brackets():
    assert parse_shapes(["[1][2] * 2"], ["x"]) == [{"x": (1,)}, {"x": (2,)}] * 2


@pytest.mark.parametrize(
    "spec, part", [("x:1*0", "'*0'"), ("x:1*a", "'*a'"), ("x:1*", "'*'"), ("x:1*3,y:1", "'*3,y:1'")]
)
def test_bad_repeat(spec, part):
    msg = errmsg(parse_shapes, [spec], ["x", "y"])
    assert "bad repeat count" in msg and part in msg


def test_repeat_over_limit():
    assert "limit" in errmsg(parse_shapes, [f"x:{{1..10}}*{MAX_INFERENCES}"], ["x"])


# ---------------------------------------------------------------- benchmark_app -data_shape form


def test_brackets_zip_per_position():
    got = parse_shapes(["input_ids[1,8][1,16],attention_mask[1,8][1,16]"], BERT)
    assert got == [
        {"input_ids": (1, 8), "attention_mask": (1, 8)},
        {"input_ids": (1, 16), "attention_mask": (1, 16)},
    ]


def test_single_bracket_broadcasts():
    got = parse_shapes(["input_ids[1,8][1,16][1,32],attention_mask[1,4]"], BERT)
    assert [i["input_ids"] for i in got] == [(1, 8), (1, 16), (1, 32)]
    assert all(i["attention_mask"] == (1, 4) for i in got)


def test_bracket_count_mismatch():
    msg = errmsg(parse_shapes, ["input_ids[1,8][1,16],attention_mask[1,8][1,16][1,32]"], BERT)
    assert "different lengths" in msg and "'attention_mask' gives 3" in msg


def test_brackets_without_name_and_scalar():
    assert parse_shapes(["[1,3,224,224] [1,3,112,112]"], ONE) == [
        {"gpu_0/data_0": (1, 3, 224, 224)},
        {"gpu_0/data_0": (1, 3, 112, 112)},
    ]
    assert parse_shapes(["x[][ ]"], ["x"]) == [{"x": ()}, {"x": ()}]


def test_brackets_may_hold_ranges():
    got = parse_shapes(["x[1,{2..3}][9]"], ["x"])
    assert [i["x"] for i in got] == [(1, 2), (1, 3), (9,)]


def test_bracketed_input_name_is_recognised():
    assert parse_shapes(["out[0][1,2]"], ["out[0]"]) == [{"out[0]": (1, 2)}]
    assert parse_shapes(["out[0]:1x2"], ["out[0]"]) == [{"out[0]": (1, 2)}]


def test_mixed_forms_in_one_spec():
    got = parse_shapes(["input_ids[1,8][1,16],attention_mask:1x{8..16..8}"], BERT)
    assert got == [
        {"input_ids": (1, 8), "attention_mask": (1, 8)},
        {"input_ids": (1, 16), "attention_mask": (1, 16)},
    ]


def test_bad_bracket_dim():
    msg = errmsg(parse_shapes, ["x[1,?]"], ["x"])
    assert "bad dimension '?'" in msg and "'x[1,?]'" in msg


def test_brackets_without_name_multi_input():
    assert "no input name" in errmsg(parse_shapes, ["[1,8]"], BERT)


# ---------------------------------------------------------------- shapes file


def write(tmp_path, data, name="shapes.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_file_list_of_objects(tmp_path):
    path = write(
        tmp_path,
        [{"input_ids": [1, 8], "attention_mask": [1, 8]}, {"attention_mask": [1, 16], "input_ids": [1, 16]}],
    )
    assert parse_shapes_file(path, BERT) == [
        {"input_ids": (1, 8), "attention_mask": (1, 8)},
        {"input_ids": (1, 16), "attention_mask": (1, 16)},
    ]


def test_file_shapes_key_and_string_entries(tmp_path):
    path = write(tmp_path, {"shapes": [{"x": []}, "x:{1..2}*2", "[7]"]})
    assert [i["x"] for i in parse_shapes_file(path, ["x"])] == [(), (1,), (2,), (1,), (2,), (7,)]


def test_file_bad_json(tmp_path):
    path = write(tmp_path, '[{"x": [1,]}]', "broken.json")
    msg = errmsg(parse_shapes_file, path, ["x"])
    assert "broken.json" in msg and "not valid JSON" in msg and "line 1" in msg


def test_file_missing(tmp_path):
    msg = errmsg(parse_shapes_file, str(tmp_path / "nope.json"), ["x"])
    assert "cannot read" in msg and "nope.json" in msg


@pytest.mark.parametrize(
    "data, needles",
    [
        ({"shape": []}, ["'shape'", '{"shapes"']),
        ({"shapes": {}}, ["expected a list", "dict"]),
        (42, ["expected a list", "int"]),
        ([], ["no shapes"]),
        ([7], ["entry [0]", "expected an object or a string", "7"]),
        ([{"x": [1]}, {"x": [1, -2]}], ["entry [1]", "'x'", "[1, -2]"]),
        ([{"x": [1.0]}], ["non-negative integers", "[1.0]"]),
        ([{"x": [True]}], ["non-negative integers", "[true]"]),
        ([{"x": "1x2"}], ["non-negative integers", '"1x2"']),
        ([{"x": [1], "y": [1]}], ["unknown input 'y'"]),
        ({"shapes": [{}]}, ["shapes[0]", "no shape for input(s) 'x'"]),
        ({"shapes": ["x:1", "x:{1..}"]}, ["shapes[1]", "'x:{1..}'", "bad range"]),
    ],
)
def test_file_errors(tmp_path, data, needles):
    msg = errmsg(parse_shapes_file, write(tmp_path, data), ["x"])
    assert "shapes.json" in msg
    for needle in needles:
        assert needle in msg


# ---------------------------------------------------------------- --model-shape


def test_model_shape_forms():
    assert parse_model_shape(["data_0:?x3x?x?"], ["data_0"]) == {"data_0": (None, 3, None, None)}
    assert parse_model_shape(["data_0[?,3,-1,224]"], ["data_0"]) == {"data_0": (None, 3, None, 224)}
    assert parse_model_shape(["?x3"], ["data_0"]) == {"data_0": (None, 3)}
    assert parse_model_shape(["[-1]"], ["data_0"]) == {"data_0": (None,)}


def test_model_shape_several_inputs_and_scalar():
    got = parse_model_shape(["input_ids:1x?,attention_mask[1,?]"], BERT)
    assert got == {"input_ids": (1, None), "attention_mask": (1, None)}
    assert parse_model_shape(["a:", "b[]"], ["a", "b"]) == {"a": (), "b": ()}
    assert parse_model_shape([], BERT) == {}


@pytest.mark.parametrize(
    "specs, needles",
    [
        (["?x3"], ["no input name"]),
        (["foo:?x3"], ["unknown input 'foo'", "'input_ids'"]),
        (["input_ids:1x?", "input_ids:?"], ["'input_ids' is given twice"]),
        (["input_ids:1x-2"], ["bad dimension '-2'", "'input_ids:1x-2'"]),
        (["input_ids:1x1..8"], ["bad dimension '1..8'"]),
        (["input_ids[1][2]"], ["2 bracket groups"]),
        ([""], ["empty model shape"]),
    ],
)
def test_model_shape_errors(specs, needles):
    msg = errmsg(parse_model_shape, specs, BERT)
    for needle in needles:
        assert needle in msg


# ---------------------------------------------------------------- input value ranges


def test_input_ranges():
    got = parse_input_ranges(["input_ids:0..30000,attention_mask:0..2"], BERT)
    assert got == {"input_ids": (0, 30000), "attention_mask": (0, 2)}
    assert parse_input_ranges(["-5 .. 5"], ["x"]) == {"x": (-5, 5)}
    assert parse_input_ranges(["a:b:1..2"], ["a:b"]) == {"a:b": (1, 2)}


@pytest.mark.parametrize(
    "specs, needles",
    [
        (["x:5..5"], ["'5..5'", "LOW must be < HIGH"]),
        (["x:6..5"], ["'6..5'", "LOW must be < HIGH"]),
        (["x:5"], ["bad range '5'"]),
        (["x:a..b"], ["bad range 'a..b'"]),
        (["y:0..1"], ["unknown input 'y'"]),
        (["x:0..1,x:0..2"], ["given twice"]),
        ([""], ["empty input range"]),
    ],
)
def test_input_range_errors(specs, needles):
    msg = errmsg(parse_input_ranges, specs, ["x"])
    for needle in needles:
        assert needle in msg


def test_input_range_needs_name_for_several_inputs():
    assert "no input name" in errmsg(parse_input_ranges, ["0..5"], BERT)


# ---------------------------------------------------------------- check_against_declared


def test_declared_ok_with_symbols_and_unknowns():
    check_against_declared(
        {"input_ids": (2, 16), "attention_mask": (2, 16), "extra": (1,)},
        {"input_ids": ("batch", "seq"), "attention_mask": ("batch", None), "unused": (1,)},
    )
    check_against_declared({"x": ()}, {"x": ()})
    # Negative ints and empty dim_params mean "unknown", not a constraint.
    check_against_declared({"a": (3, 4), "b": (5, 6)}, {"a": (-1, ""), "b": (-1, "")})


def test_declared_rank_mismatch():
    msg = errmsg(check_against_declared, {"x": (1, 3, 112)}, {"x": (1, 3, None, "h")})
    assert msg == "input 'x': rank 3 given, model declares rank 4 (1x3x?x?)"
    assert "rank 0 (scalar)" in errmsg(check_against_declared, {"x": (1,)}, {"x": ()})


def test_declared_static_mismatch_suggests_relaxation():
    msg = errmsg(check_against_declared, {"data_0": (1, 3, 112, 112)}, {"data_0": [1, 3, 224, 224]})
    assert msg == (
        "input 'data_0' dim 2 is 112 but the model declares 224; "
        "relax it with --model-shape 'data_0:1x3x?x?'"
    )


def test_declared_static_mismatch_keeps_other_dims():
    msg = errmsg(check_against_declared, {"x": (4, 3, 8)}, {"x": ("batch", 1, 8)})
    assert "dim 1 is 3 but the model declares 1" in msg and "'x:?x?x8'" in msg


def test_declared_symbol_conflict():
    msg = errmsg(
        check_against_declared,
        {"input_ids": (1, 8), "attention_mask": (1, 16)},
        {"input_ids": ("batch", "seq"), "attention_mask": ("batch", "seq")},
    )
    assert "symbolic dim 'seq'" in msg and "8" in msg and "16" in msg
    assert "'input_ids' dim 1" in msg and "'attention_mask' dim 1" in msg


def test_declared_symbol_within_one_input():
    assert "'n'" in errmsg(check_against_declared, {"x": (3, 4)}, {"x": ("n", "n")})
    check_against_declared({"x": (3, 3)}, {"x": ("n", "n")})


# ---------------------------------------------------------------- formatting and properties


def test_format_shape():
    assert format_shape((1, 16)) == "1x16"
    assert format_shape((0,)) == "0"
    assert format_shape(()) == "scalar"
    assert format_inference({"a": (1, 2), "b": ()}) == "a:1x2,b:scalar"


dims = st.lists(st.integers(0, 10_000), max_size=6).map(tuple)
# Names may contain ':' '/' '.' etc.; ',', '*', brackets and spaces are reserved.
names = st.text(alphabet="abcxyz_019:/.-", min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(names, dims, min_size=1, max_size=4))
def test_format_parse_round_trip(inference):
    input_names = list(inference)
    assert parse_shapes([format_inference(inference)], input_names) == [inference]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 300), st.integers(0, 300), st.integers(-40, 40).filter(bool))
def test_range_expansion_matches_python_range(start, stop, step):
    expected = list(range(start, stop + (1 if step > 0 else -1), step))
    spec = f"x:2x{{{start}..{stop}..{step}}}"
    if not expected:
        with pytest.raises(ShapeSpecError, match="is empty"):
            parse_shapes([spec], ["x"])
        return
    got = parse_shapes([spec], ["x"])
    assert [i["x"] for i in got] == [(2, v) for v in expected]
    assert got[0]["x"][1] == start and abs(got[-1]["x"][1] - stop) < abs(step)


@settings(max_examples=40, deadline=None)
@given(st.lists(dims, min_size=1, max_size=4), st.integers(1, 3))
def test_bracket_form_matches_trtexec_form(shapes, repeat):
    brackets = "".join("[" + ",".join(map(str, s)) + "]" for s in shapes)
    expected = [{"x": s} for s in shapes] * repeat
    assert parse_shapes([f"x{brackets}*{repeat}"], ["x"]) == expected
    assert parse_shapes([f"x:{format_shape(s)}*{repeat}" for s in shapes], ["x"]) == [
        {"x": s} for s in shapes for _ in range(repeat)
    ]


# --------------------------------------------------------------------------
# Limits of a whole run, refused before the shapes are built; --grid


def _peak_bytes(fn, *args) -> int:
    """Peak memory Python allocated while fn ran (it is expected to raise ShapeSpecError)."""
    import tracemalloc
    tracemalloc.start()
    try:
        errmsg(fn, *args)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_bracket_groups_over_the_limit_refused_in_bounded_memory():
    groups = "".join(f"[1,{{1..{MAX_INFERENCES}}}]" for _ in range(12))   # 1.2 million shapes
    msg = errmsg(parse_shapes, [f"x{groups}"], ["x"])
    assert "bracket groups give more than 100000 inferences, the limit of a run" in msg
    assert _peak_bytes(parse_shapes, [f"x{groups}"], ["x"]) < 64 * 2**20


def test_many_specs_over_the_limit_together():
    half = f"x:{{1..{MAX_INFERENCES // 2 + 1}}}"
    assert len(parse_shapes([half], ["x"])) == MAX_INFERENCES // 2 + 1   # one alone is fine
    msg = errmsg(parse_shapes, [half, half], ["x"])
    assert msg == "the 2 --shapes give more than 100000 inferences, the limit of a run"
    assert _peak_bytes(parse_shapes, [half] * 40, ["x"]) < 96 * 2**20


def test_shapes_and_shapes_file_together_over_the_limit(tmp_path):
    from dyncli.runner import RunOptions, UsageError, resolve_sequence
    from engine import build_program
    from tests.models import mlp
    f = tmp_path / "s.json"
    f.write_text(json.dumps([f"{{1..{MAX_INFERENCES // 2 + 1}}}x32"]))
    prog = build_program(mlp())
    opts = RunOptions(model="m", shapes=[f"{{1..{MAX_INFERENCES // 2 + 1}}}x32"], shapes_file=str(f))
    with pytest.raises(UsageError, match="--shapes and --shapes-file together give more than 100000"):
        resolve_sequence(opts, prog, mlp())


def test_grid_forms_every_combination_within_an_input():
    got = parse_shapes(["x:{1..2}x{8..16..8}x4"], ["x"], grid=True)
    assert [i["x"] for i in got] == [(1, 8, 4), (1, 16, 4), (2, 8, 4), (2, 16, 4)]
    # without --grid the same ranges zip (and must match in length)
    assert [i["x"] for i in parse_shapes(["x:{1..2}x{8..16..8}"], ["x"])] == [(1, 8), (2, 16)]
    assert "different lengths" in errmsg(parse_shapes, ["x:{1..3}x{8..16..8}"], ["x"])
    assert [i["x"] for i in parse_shapes(["x:{1..3}x{8..16..8}"], ["x"], True)][-1] == (3, 16)
    # inputs still zip: ids and mask move together
    both = parse_shapes(["input_ids:{1..2}x{8..16..8},attention_mask:{1..2}x{8..16..8}"], BERT, grid=True)
    assert [(i["input_ids"], i["attention_mask"]) for i in both] == \
        [((1, 8), (1, 8)), ((1, 16), (1, 16)), ((2, 8), (2, 8)), ((2, 16), (2, 16))]
    # brackets: each group's grid, concatenated
    assert [i["x"] for i in parse_shapes(["x[{1..2},3][5,{6..7}]"], ["x"], grid=True)] == \
        [(1, 3), (2, 3), (5, 6), (5, 7)]


def test_grid_over_the_limit_refused_before_it_is_built():
    msg = errmsg(parse_shapes, ["x:{1..1000}x{1..1000}x{1..1000}"], ["x"], True)
    assert "the grid of 1000 x 1000 x 1000 values is 1000000000 shapes; the limit is 100000" in msg
