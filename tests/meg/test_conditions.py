"""Conditions of `when:` and `until:` (`meg.conditions`): the built-ins, plug-ins, and the
params check that `meg validate` reports."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from meg import MEGError, build_spec, validate
from meg.agentic_checks import known_conditions
from meg.conditions import CONDITIONS, holds, params_problem, register_condition
from meg.registry import UnknownNameError


@register_condition("test_conditions_longer_than")
def longer_than(sample: str, terminal: bool, *, chars: int) -> bool:
    """A plug-in condition: the sample's text has more than `chars` characters."""
    return len(sample) > chars


def shouting(sample: str, terminal: bool) -> bool:
    """A condition named by `module:function`, registered on first use."""
    return sample.isupper()


# --- the built-ins ----------------------------------------------------------------------------


def test_the_built_ins_are_registered() -> None:
    names = known_conditions()
    assert {"contains", "matches", "terminal"} <= set(names)
    assert names == sorted(names) == CONDITIONS.names()


@pytest.mark.parametrize(
    ("text", "sample", "expected"),
    [
        ("yes", "Yes, ship it", True),
        ("YES", "oh yes.", True),
        ("Yes", "YES", True),
        ("yes", "no", False),
        ("yes", "", False),
        ("pass ed", "passed", False),
        ("5/5", " 5/5 passed", True),
    ],
)
def test_contains_is_case_insensitive(text: str, sample: str, expected: bool) -> None:
    assert holds("contains", {"text": text}, sample, False) is expected
    assert holds("contains", {"text": text}, sample, True) is expected  # terminal is not read


def test_contains_an_empty_text_never_holds() -> None:
    """Refused by params_problem; called anyway, it does not hold on everything."""
    assert CONDITIONS.get("contains")("anything", False, text="") is False


@pytest.mark.parametrize(
    ("pattern", "sample", "expected"),
    [
        (r"\d+/\d+ passed", " 3/5 passed", True),
        (r"^\s*yes\b", "  yes please", True),
        (r"^yes", "well, yes", False),  # anchored
        ("YES", "yes", False),  # case-sensitive, unlike contains
        ("(?i)YES", "yes", True),
        ("", "", True),
    ],
)
def test_matches_searches_anywhere(pattern: str, sample: str, expected: bool) -> None:
    assert holds("matches", {"pattern": pattern}, sample, False) is expected


def test_terminal_reads_only_the_flag() -> None:
    assert holds("terminal", {}, "0/5 passed", True) is True
    assert holds("terminal", {}, "5/5 passed", False) is False
    assert holds("terminal", {}, "", True) is True


def test_negate_is_the_callers() -> None:
    """A condition has no `negate`: `WhenSpec.negate` is applied by `tasks.gating`."""
    with pytest.raises(TypeError, match="negate"):
        holds("contains", {"text": "yes", "negate": True}, "yes", False)
    problem = params_problem("contains", {"text": "yes", "negate": True})
    assert problem is not None and "unexpected keyword argument 'negate'" in problem


# --- plug-ins ---------------------------------------------------------------------------------


def test_a_registered_plug_in_is_usable() -> None:
    assert "test_conditions_longer_than" in known_conditions()
    assert holds("test_conditions_longer_than", {"chars": 3}, "abcd", False)
    assert not holds("test_conditions_longer_than", {"chars": 3}, "abc", False)
    assert params_problem("test_conditions_longer_than", {"chars": 3}) is None
    problem = params_problem("test_conditions_longer_than", {})
    assert problem is not None and "missing a required argument: 'chars'" in problem


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="condition 'contains' is already registered"):
        register_condition("contains")(longer_than)
    with pytest.raises(ValueError, match="already registered"):
        register_condition("test_conditions_longer_than")(longer_than)


def test_a_module_function_name_resolves() -> None:
    name = f"{__name__}:shouting"
    assert params_problem(name, {}) is None
    assert holds(name, {}, "STOP", False) and not holds(name, {}, "stop", False)


def test_an_unknown_module_function_name() -> None:
    with pytest.raises(UnknownNameError, match="has no attribute 'whispering'"):
        params_problem(f"{__name__}:whispering", {})


def test_an_unknown_name_lists_the_known() -> None:
    with pytest.raises(UnknownNameError) as ei:
        holds("contain", {"text": "x"}, "x", False)
    message = str(ei.value)
    assert message.startswith("unknown condition 'contain'; known: ")
    for name in ("contains", "matches", "terminal", "test_conditions_longer_than"):
        assert name in message
    assert "module:attribute" in message
    with pytest.raises(UnknownNameError, match="unknown condition 'contain'"):
        params_problem("contain", {})
    assert isinstance(ei.value, KeyError)


# --- params_problem -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("contains", {"text": "yes"}),
        ("matches", {"pattern": r"\d"}),
        ("matches", {"pattern": ""}),
        ("terminal", {}),
    ],
)
def test_params_that_fit(name: str, params: dict[str, Any]) -> None:
    assert params_problem(name, params) is None


@pytest.mark.parametrize(
    ("name", "params", "pieces"),
    [
        ("contains", {}, ["condition 'contains' cannot take params {}", "'text'"]),
        ("contains", {"text": ""}, ["`contains` needs a non-empty string `text`"]),
        ("contains", {"text": None}, ["`contains` needs a non-empty string `text`"]),
        ("contains", {"text": ["yes"]}, ["`contains` needs a non-empty string `text`"]),
        (
            "contains",
            {"text": "a", "ignore_case": True},
            ["cannot take params", "unexpected keyword argument 'ignore_case'"],
        ),
        ("matches", {}, ["condition 'matches' cannot take params {}", "'pattern'"]),
        ("matches", {"pattern": "[a-"}, ["`matches`: pattern '[a-' is not a regular expression"]),
        ("matches", {"pattern": "(x"}, ["missing ), unterminated subpattern"]),
        ("terminal", {"text": "x"}, ["condition 'terminal' cannot take params {'text': 'x'}"]),
    ],
)
def test_params_problem_messages(name: str, params: dict[str, Any], pieces: list[str]) -> None:
    problem = params_problem(name, params)
    assert problem is not None
    for piece in pieces:
        assert piece in problem


# --- in a MEG -----------------------------------------------------------------------------------

MEG: dict[str, Any] = {
    "name": "t",
    "agents": {"a": {"model": "hf://org/model"}},
    "nodes": {
        "x": {"agent": "a", "template": "Q: {question}", "n": 2},
        "y": {"agent": "a", "template": "{x} again", "inputs": {"x": "per_sample"}},
    },
}


def _with_when(when: list[dict[str, Any]]) -> dict[str, Any]:
    data = copy.deepcopy(MEG)
    data["nodes"]["y"]["when"] = when
    return data


def test_a_plug_in_condition_in_a_meg() -> None:
    when = [{"node": "x", "fn": "test_conditions_longer_than", "params": {"chars": 5}}]
    spec = validate(build_spec(_with_when(when)), check_models=False)
    assert spec.nodes["y"].when[0].fn == "test_conditions_longer_than"
    when[0]["params"] = {"chars": 5, "words": 2}
    with pytest.raises(MEGError) as ei:
        validate(build_spec(_with_when(when)), check_models=False)
    assert ei.value.field == "nodes.y.when.0.params"
    assert "unexpected keyword argument 'words'" in str(ei.value)


def test_a_module_function_condition_in_a_meg() -> None:
    when = [{"node": "x", "fn": f"{__name__}:shouting", "negate": True}]
    spec = validate(build_spec(_with_when(when)), check_models=False)
    assert spec.nodes["y"].when[0].negate


@pytest.mark.parametrize("pattern", [5, 1.5, True, None])
def test_matches_needs_a_string_pattern(pattern: Any) -> None:
    """YAML reads `pattern: 5` as an int, which re.search would reject at rollout."""
    problem = params_problem("matches", {"pattern": pattern})
    assert problem is not None and "`matches` needs a string `pattern`" in problem
