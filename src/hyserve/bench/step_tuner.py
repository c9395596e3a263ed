"""Tile plans judged by the decode step they run in, not by each kernel alone.

On the H200 the per-kernel sweeps (``linear.bench``, ``moe.tune``, ``gdn_decode_step.bench``) have picked
tiles that win alone and lose in the graph-replayed step more than once (TMA GEMV and gate_up,
REDUCE_EACH, per-row-count GEMV tiles: docs/performance.md): under programmatic dependent launch a kernel's
cost depends on its neighbours. So this tunes the plans by coordinate descent on the step's own time. A
plan ``state`` is a nested dict (the JSON tables the kernels read); a ``Knob`` is one path into it and
the values to try there; ``measure(state)`` returns the step's microseconds with that state in force (or
raises if the variant fails its output check). A value is kept only if it beats the current state by more
than ``noise_us``, and again when re-measured. ``scripts/tune_step.py`` wires this to the engine.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Knob:
    path: tuple[str, ...]  # keys from the state's root to the value, e.g. ("gemv", "2048x4096", "BLOCK_N")
    values: tuple[Any, ...]  # the values to try there (None: remove the key, i.e. the kernel's default)

    @property
    def name(self) -> str:
        return "/".join(self.path)


def get_path(state: dict, path: tuple[str, ...]) -> Any:
    """The value at ``path`` (None where a key is missing)."""
    node: Any = state
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def set_path(state: dict, path: tuple[str, ...], value: Any) -> dict:
    """A deep copy of ``state`` with ``path`` set to ``value`` (removed when None)."""
    out = copy.deepcopy(state)
    node = out
    for key in path[:-1]:
        node = node.setdefault(key, {})
    if value is None:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return out


@dataclass
class Trial:
    knob: str  # "baseline", or the knob's name
    value: Any
    us: float | None  # the step's time; None when the variant failed
    note: str = ""  # "kept", "not confirmed", or why it failed


def coordinate_descent(
    state: dict,
    knobs: list[Knob],
    measure: Callable[[dict], float],
    noise_us: float,
    log: Callable[[Trial], None] = lambda t: None,
) -> tuple[dict, list[Trial]]:
    """One pass over ``knobs``: for each, every value with the others fixed; the fastest is kept when it beats
    the current time by more than ``noise_us`` and its re-measurement still does. Returns the final state and
    every trial in order."""
    trials: list[Trial] = []

    def record(trial: Trial) -> None:
        trials.append(trial)
        log(trial)

    current = measure(state)
    record(Trial("baseline", None, current))
    for knob in knobs:
        now = get_path(state, knob.path)
        best_value, best_us = now, current
        for value in knob.values:
            if value == now:
                continue
            try:
                us = measure(set_path(state, knob.path, value))
            except Exception as e:  # noqa: BLE001 - a variant that does not compile, fit or check: next one
                record(Trial(knob.name, value, None, f"{type(e).__name__}: {str(e)[:120]}"))
                continue
            record(Trial(knob.name, value, us))
            if us < best_us:
                best_value, best_us = value, us
        if best_value == now or best_us > current - noise_us:
            continue
        candidate = set_path(state, knob.path, best_value)
        again = measure(candidate)
        if again < current - noise_us:
            state, current = candidate, again
            record(Trial(knob.name, best_value, again, "kept"))
        else:
            record(Trial(knob.name, best_value, again, "not confirmed"))
    return state, trials
