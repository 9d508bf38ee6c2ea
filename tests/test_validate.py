"""Shared input checks: every bad input is a ValueError that names the problem."""

from __future__ import annotations

import numpy as np
import pytest

from seqbalance._validate import as_groups, as_lengths, as_weights


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ([True, False], "must hold numbers"),
        ([1e20], "too large for a token count"),
        ([2**40], "too large"),
        ((x for x in [1, 2]), "wrap iterators and generators"),
        ("123", "got a string"),
        ([[1, 2]], "must be 1-D"),
        ([1, -2], r"lengths\[1\] = -2 is negative"),
        ([1.0, float("inf")], "not a whole number"),
    ],
)
def test_bad_lengths(values, match):
    with pytest.raises(ValueError, match=match):
        as_lengths(values)


def test_lengths_widened_to_int64():
    out = as_lengths(np.array([2**31 - 1, 7], dtype=np.int32))
    assert out.dtype == np.int64 and int(out.sum()) == 2**31 + 6  # no int32 wrap-around
    assert as_lengths(np.array([3, 4], dtype=np.uint64)).tolist() == [3, 4]


def test_weights():
    assert as_weights([1, 2.5]).dtype == np.float64
    with pytest.raises(ValueError, match=r"weights\[0\] = nan is not finite"):
        as_weights([float("nan")])


def test_groups_numbered_by_first_appearance():
    assert as_groups(["b", "a", "b", "c"], 4).tolist() == [0, 1, 0, 2]
    assert as_groups([7, 3, 7], 3).tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match="mixes strings and numbers"):
        as_groups([1, "1"], 2)
    with pytest.raises(ValueError, match="groups has 1 entries but there are 2 items"):
        as_groups([1], 2)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        # Each of these ran out of memory or time before the limit (review).
        ({"cp_size": 2**40}, "cp_size=1099511627776 is beyond"),
        ({"pp_size": 10**9}, "pp_size=1000000000 is beyond"),
        ({"pp_size": 2, "schedule": "interleaved", "virtual_stages": 10**9}, "virtual_stages"),
        ({"pp_size": 512, "schedule": "interleaved", "virtual_stages": 64},
         "pp_size \\* virtual_stages=32768"),
        # cp_size=True and a bad cp= were read as no context parallelism.
        ({"cp_size": True}, "cp_size must be a positive integer"),
        ({"cp_size": 1.0}, "cp_size must be a positive integer"),
        ({"cp": "x"}, "cp must be one of"),
    ],
)
def test_plan_refuses_absurd_parallel_degrees(kwargs, words):
    import seqbalance as sb

    with pytest.raises(ValueError, match=words):
        sb.plan([100] * 8, 2, 1000, **kwargs)


def test_parallel_degree_limit_is_inclusive():
    from seqbalance._validate import MAX_PARALLEL_DEGREE, check_degree

    assert check_degree(MAX_PARALLEL_DEGREE, "x") == MAX_PARALLEL_DEGREE
    with pytest.raises(ValueError, match="x=16385"):
        check_degree(MAX_PARALLEL_DEGREE + 1, "x")


def test_float16_lengths_read_without_a_warning():
    # 2**40 overflowed float16 in the size check: a RuntimeWarning on every good call.
    import warnings

    from seqbalance._validate import as_lengths

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert as_lengths(np.array([100, 200], dtype=np.float16), "lengths").tolist() == [100, 200]
