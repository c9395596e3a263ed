"""The step tuner's search: coordinate descent over plan knobs against a measured step time."""

from __future__ import annotations

import pytest

from hyserve.bench.step_tuner import Knob, coordinate_descent, get_path, set_path


def test_paths_copy_and_remove():
    state = {"gemv": {"a": {"BLOCK_N": 2}}}
    new = set_path(state, ("gemv", "a", "BLOCK_N"), 4)
    assert new["gemv"]["a"]["BLOCK_N"] == 4 and state["gemv"]["a"]["BLOCK_N"] == 2
    assert get_path(set_path(state, ("gemv", "a", "BLOCK_N"), None), ("gemv", "a", "BLOCK_N")) is None
    assert get_path(state, ("moe", "x")) is None
    assert set_path(state, ("moe", "1", "router_be"), 8)["moe"] == {"1": {"router_be": 8}}


def _cost(state: dict) -> float:
    """A step whose time is lowest at BLOCK_N 4 and num_warps 8; BLOCK_N 16 fails its check."""
    n = state["g"]["BLOCK_N"]
    if n == 16:
        raise RuntimeError("outputs differ")
    return 100.0 + abs(n - 4) * 5 + (0 if state["g"].get("num_warps") == 8 else 3)


def test_descent_keeps_only_wins_beyond_the_noise():
    knobs = [Knob(("g", "BLOCK_N"), (1, 2, 4, 16)), Knob(("g", "num_warps"), (4, 8))]
    state, trials = coordinate_descent({"g": {"BLOCK_N": 2}}, knobs, _cost, noise_us=1.0)
    assert state == {"g": {"BLOCK_N": 4, "num_warps": 8}}
    assert [t.note for t in trials if t.note == "kept"] == ["kept", "kept"]
    assert any(t.us is None and "outputs differ" in t.note for t in trials)
    state, _ = coordinate_descent({"g": {"BLOCK_N": 2}}, knobs, _cost, noise_us=20.0)
    assert state == {"g": {"BLOCK_N": 2}}  # no win clears 20 us


def test_descent_drops_a_win_that_does_not_repeat():
    times = iter([100.0, 90.0, 101.0])  # baseline, the variant, its re-measurement

    state, trials = coordinate_descent(
        {"g": {"BLOCK_N": 2}}, [Knob(("g", "BLOCK_N"), (4,))], lambda s: next(times), noise_us=2.0
    )
    assert state == {"g": {"BLOCK_N": 2}} and trials[-1].note == "not confirmed"
    with pytest.raises(StopIteration):
        next(times)
