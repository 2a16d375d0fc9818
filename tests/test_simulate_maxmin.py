"""Weighted max-min allocation (the simulator's targets), on cases worked by hand."""

from __future__ import annotations

import pytest

from mindrouter.simulate.maxmin import max_min
from mindrouter.simulate.scenario import BackendSpec, ModelSpec
from mindrouter.simulate.slots import SlotSets

ONE = frozenset({"gpu1"})
TWO = frozenset({"gpu1", "gpu2"})


def test_equal_weights_split_a_full_backend_evenly():
    assert max_min({"a": 1, "b": 1}, {"a": 10, "b": 10}, {"a": ONE, "b": ONE}, {"gpu1": 4}) == {"a": 2, "b": 2}


def test_weights_split_by_ratio():
    # 3:1 on 8 slots: level 2, a holds 6, b holds 2.
    assert max_min({"a": 3, "b": 1}, {"a": 16, "b": 16}, {"a": ONE, "b": ONE}, {"gpu1": 8}) == {"a": 6, "b": 2}


def test_a_small_demand_is_met_and_the_rest_goes_to_the_others():
    # The seed's scenario 2: prof (3) keeps 16 outstanding, student (1) one; 8 slots.
    # Level 2 would give the student 2 > 1: it holds 1, prof the other 7.
    got = max_min(
        {"prof": 3, "student": 1}, {"prof": 16, "student": 1}, {"prof": TWO, "student": TWO}, {"gpu1": 4, "gpu2": 4}
    )
    assert got == {"prof": 7, "student": 1}


def test_a_demand_equal_to_the_level_is_its_share():
    # few-outstanding: big keeps 2 outstanding, small 4, on 4 slots: 2 and 2.
    assert max_min({"big": 1, "small": 1}, {"big": 2, "small": 4}, {"big": ONE, "small": ONE}, {"gpu1": 4}) == {
        "big": 2,
        "small": 2,
    }


def test_everyone_is_served_below_saturation():
    assert max_min({"a": 1, "b": 5}, {"a": 1, "b": 2}, {"a": ONE, "b": ONE}, {"gpu1": 8}) == {"a": 1, "b": 2}


def test_no_demand_or_no_backend_holds_nothing():
    got = max_min(
        {"a": 1, "b": 1, "c": 1}, {"a": 0, "b": 3, "c": 3}, {"a": ONE, "b": ONE, "c": frozenset({"gone"})}, {"gpu1": 4}
    )
    assert got == {"a": 0, "b": 3, "c": 0}


def test_a_person_confined_to_one_backend_gets_it_and_the_other_backend_goes_to_the_flexible():
    # x runs only on gpu1 (4 slots), y on both (4 + 4). Unconstrained level would be 4 each, but
    # x cannot hold more than gpu1's 4: level 4 is feasible (x 4 on gpu1, y 4 on gpu2) -> 4 and 4.
    got = max_min({"x": 1, "y": 1}, {"x": 100, "y": 100}, {"x": ONE, "y": TWO}, {"gpu1": 4, "gpu2": 4})
    assert got == {"x": 4, "y": 4}


def test_weights_across_overlapping_backends():
    # Issue 18's overlap: a weight-1 student only on gpu1 (4 slots), a weight-10 admin on both (4 + 4).
    # By weight alone the student would hold 8/11; its max-min share is still bounded by what the
    # admin's weight allows: level L with 10L + L = 8 gives L = 8/11 -> student 0.727, admin 7.273;
    # gpu1 can hold the student's 0.727, so the constraint does not bind.
    got = max_min({"s": 1, "admin": 10}, {"s": 100, "admin": 100}, {"s": ONE, "admin": TWO}, {"gpu1": 4, "gpu2": 4})
    assert got["s"] == pytest.approx(8 / 11) and got["admin"] == pytest.approx(80 / 11)


def test_two_people_confined_to_a_small_backend_share_it_and_leave_the_big_one_to_the_third():
    # a and b only on gpu1 (2 slots), c on both (gpu2: 6 slots). Level 8/3 is infeasible for a+b
    # (they would need 16/3 > 2): they freeze at 1 each, c takes the rest, 6.
    caps = {"gpu1": 2, "gpu2": 6}
    got = max_min({"a": 1, "b": 1, "c": 1}, dict.fromkeys("abc", 100), {"a": ONE, "b": ONE, "c": TWO}, caps)
    assert got == {"a": 1, "b": 1, "c": 6}


def test_weighted_with_constraint_and_a_small_demand():
    # a (w2) and b (w1) only on gpu1 (3 slots); c (w1) on both, demand 1; gpu2 has 5 slots.
    # gpu1 binds a+b at level 1 (a 2, b 1); c is capped by its demand at 1; 4 slots of gpu2 stay idle.
    caps = {"gpu1": 3, "gpu2": 5}
    got = max_min({"a": 2, "b": 1, "c": 1}, {"a": 9, "b": 9, "c": 1}, {"a": ONE, "b": ONE, "c": TWO}, caps)
    assert got == pytest.approx({"a": 2, "b": 1, "c": 1})


# -- what a slot delivers: the targets' units per slot-second ------------------------


def _one(model: str) -> float:
    """Every model's prompt token costs one unit (the tokens service unit)."""
    return 1.0


def _backend(name: str, slots: int, decode: float, prefill: float) -> BackendSpec:
    return BackendSpec(name, ("llama3",), slots, decode, prefill, ("llama3",))


def test_a_slot_delivers_a_big_prompt_s_units_far_faster_than_a_chat_answer_s():
    """few-outstanding's backend (50 tokens/s decode, 5,000 prefill): 30,020 units in 6.2 s, 800 in 6.04 s."""
    slots = SlotSets([_backend("gpu1", 4, 50, 5000)], ModelSpec)
    assert slots.units_per_second({"llama3": (30000, 10)}, _one, 2) == pytest.approx(30020 / 6.2)
    assert slots.units_per_second({"llama3": (200, 300)}, _one, 2) == pytest.approx(800 / 6.04)
    # Two requests of each, summed: units over slot-seconds, not the mean of the two rates.
    assert slots.units_per_second({"llama3": (30200, 310)}, _one, 2) == pytest.approx(30820 / 12.24)
    assert slots.units_per_second({}, _one, 2) == 0.0


def test_where_backends_differ_in_speed_a_slot_s_seconds_are_averaged_by_slots():
    # 4 slots at 50 tokens/s and 2 at 25: a 300-token answer holds a slot (4 x 6 + 2 x 12) / 6 = 8 s.
    slots = SlotSets([_backend("gpu1", 4, 50, 5000), _backend("gpu2", 2, 25, 2500)], ModelSpec)
    assert slots.units_per_second({"llama3": (0, 300)}, _one, 2) == pytest.approx(600 / 8)
