"""Reward functions behind a registry: `@register_reward("name")`.

A reward function scores ONE sample: `fn(sample, episode, task, **params) -> float`, where
`episode` gives samples of the same episode (text, node, parents) so verifiers and team
rewards can look at other nodes.

Which nodes `episode` holds is declared at registration: `reads(params)` names the other
nodes the function looks at; the episode view then holds the sample's own node, those, and
everything upstream of those. That declaration is what lets the orchestrator score a node as
soon as what it reads exists (a worker's `exact_answer` right after the worker answered,
a team reward only after the final node), so an agent can train before the whole episode is
done. A function registered without `reads` sees, and waits for, the whole episode.

Functions here only parse text; a reward that would execute model output must run it in a
sandbox (a subprocess with limits), never in the worker.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from meg.registry import META_ATTR, Registry
from workloads.datasets import TaskItem

_INT = re.compile(r"-?\d+")


@dataclass(frozen=True, slots=True)
class SampleView:
    id: str
    node: str
    text: str
    parent_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class EpisodeView:
    samples: Mapping[str, SampleView]

    def of_node(self, node: str) -> list[SampleView]:
        return [s for s in self.samples.values() if s.node == node]

    def ancestors(self, sample_id: str) -> set[str]:
        """Every sample id reachable through parent links (all fan-out rules count)."""
        seen: set[str] = set()
        todo = list(self.samples[sample_id].parent_ids)
        while todo:
            sid = todo.pop()
            if sid not in seen and sid in self.samples:
                seen.add(sid)
                todo.extend(self.samples[sid].parent_ids)
        return seen


RewardFn = Callable[..., float]
Reads = Callable[[Mapping[str, Any]], Collection[str]]
Decided = Callable[[str, TaskItem], bool]  # a reward's prefix verdict: `early_check`


def _check_reward(name: str, fn: Any) -> None:
    """A reward is `fn(sample, episode, task, **params) -> float`: three positional slots."""
    if not callable(fn):
        raise TypeError(f"reward function {name!r} is {type(fn).__name__}, not a function")
    try:
        params = inspect.signature(fn).parameters.values()
    except ValueError:  # no signature (a builtin): nothing to check
        return
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    required = [p for p in positional if p.default is inspect.Parameter.empty]
    if not varargs and (len(positional) < 3 or len(required) > 3):
        raise TypeError(
            f"reward function {name!r} must take (sample, episode, task, **params); its "
            f"positional parameters are ({', '.join(p.name for p in positional)})"
        )


# The math-verify rewards (`math_answer`, `math_verdict`) and the ones that run model-written
# code in the sandbox (`code_tests`, `code_assertions`) live in their own modules.
REWARDS: Registry[RewardFn] = Registry(
    "reward function",
    importable=True,
    check=_check_reward,
    builtins=("workloads.code_rewards", "workloads.math_rewards", "workloads.code_repair"),
)


WARM_UPS: list[tuple[frozenset[str], Callable[[], None]]] = []


def on_warm_up(*rewards: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """Run the decorated `fn()` once when a reward process for a run that binds one of
    `rewards` starts, before any call is timed: a reward whose first call pays a one-off
    cost (math-verify builds its parser, ~1-3 s; the sandbox probes its isolation) pays it
    there instead of against a call's timeout (`tasks.reward_calls`), and a run that does
    not use it does not pay it at all."""

    def deco(fn: Callable[[], None]) -> Callable[[], None]:
        WARM_UPS.append((frozenset(rewards), fn))
        return fn

    return deco


def warm_up(rewards: Collection[str]) -> None:
    """The warm-ups of the rewards named in `rewards` (each at most once)."""
    REWARDS.load_builtins()  # their modules declare the warm-ups
    for names, fn in WARM_UPS:
        if names & set(rewards):
            fn()


def register_reward(
    name: str, *, reads: Reads | None = None, decided: Decided | None = None
) -> Callable[[RewardFn], RewardFn]:
    """Register `fn` as `name`. `reads(params)`: the other nodes it looks at (see module doc);
    None means the whole episode. `decided(text, task)`: see `early_check`."""
    return REWARDS.register(name, reads=reads, decided=decided)


def early_check(name: str) -> Decided | None:
    """The prefix verdict of reward `name`, or None if it has none (the `rollverify` rollout
    policy stops a running sample once it holds).

    `decided(text, task)` is True only when the reward of `text` as it stands equals the
    reward of every continuation of it: the sample can stop here and be scored as it is
    (a wrong number already written; a first integer already complete, for a reward that
    reads only that). `text` is a response still being written, so its last word may be
    cut: a check must only judge what cannot change (an integer followed by a non-digit)."""
    return REWARDS.meta(name).get("decided")


def reward(
    *, reads: Reads | None = None, decided: Decided | None = None
) -> Callable[[RewardFn], RewardFn]:
    """Declare what a reward of your own module reads, for `fn: my_module:my_reward`.

    ```python
    from workloads.rewards import reward

    @reward(reads=lambda params: (params["final"],))
    def team_score(sample, episode, task, *, final): ...
    ```
    Without it a `module:attribute` reward sees, and waits for, the whole episode."""

    def deco(fn: RewardFn) -> RewardFn:
        setattr(fn, META_ATTR, {"reads": reads, "decided": decided})
        return fn

    return deco


def check_binding(name: str, params: Mapping[str, Any]) -> None:
    """Raise `TypeError` when reward `name` cannot be called with `params`."""
    fn = REWARDS.get(name)
    try:
        inspect.signature(fn).bind(None, None, None, **params)
    except TypeError as e:
        raise TypeError(f"reward {name!r} does not take params {sorted(params)}: {e}") from None
    except ValueError:
        pass


def reward_reads(name: str, params: Mapping[str, Any]) -> frozenset[str] | None:
    """The nodes reward `name` with `params` reads besides the sample's own (None: all)."""
    reads = REWARDS.meta(name).get("reads")  # unknown names fail here, listing known ones
    if reads is None:
        return None
    try:
        names = tuple(reads(params))
    except KeyError as e:
        raise ValueError(f"reward {name!r} needs the parameter {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:  # params of the wrong shape for its `reads`
        raise ValueError(
            f"reward {name!r}: params {dict(params)} do not name nodes ({e})"
        ) from None
    wrong = [n for n in names if not isinstance(n, str)]
    if wrong:
        raise ValueError(f"reward {name!r}: a parameter naming a node is {wrong[0]!r}, not a name")
    return frozenset(names)


def _param(key: str) -> Reads:
    return lambda params: (params[key],)


def _nothing(params: Mapping[str, Any]) -> Collection[str]:
    return ()


def known_rewards() -> Registry[RewardFn]:
    """The reward registry (iterates over the registered names; resolves `module:attr`)."""
    return REWARDS


def get_reward(name: str) -> RewardFn:
    return REWARDS.get(name)


def extract_answer(text: str) -> str | None:
    """The first integer in a response, as written (``" 12 because"`` → ``"12"``)."""
    m = _INT.search(text)
    return m.group(0) if m else None


def is_correct(text: str, task: TaskItem) -> bool:
    return extract_answer(text) == task.answer.strip()


Correct = Callable[[str, TaskItem], bool]


def first_integer_written(text: str, task: TaskItem) -> bool:
    """`is_correct`'s verdict cannot change: the first integer is complete (a character
    that is not a digit follows it), whatever comes after."""
    m = _INT.search(text)
    return m is not None and m.end() < len(text)


def answer_reward(
    name: str, correct: Correct, doc: str, decided: Decided | None = None
) -> RewardFn:
    """Register `name`: 1 when `correct(response, task)`, else 0 (reads nothing else);
    `decided`: its prefix verdict (`early_check`)."""

    def fn(sample: SampleView, episode: EpisodeView, task: TaskItem, **_: Any) -> float:
        return float(correct(sample.text, task))

    fn.__name__, fn.__qualname__, fn.__doc__ = name, name, doc
    return register_reward(name, reads=_nothing, decided=decided)(fn)


def verdict_reward(name: str, correct: Correct, doc: str) -> RewardFn:
    """Register `name`: the verdict rule (`judge_verdict`) with `correct` as the notion of
    a right answer; params `target` (the judged node), `yes`, `no`."""

    def fn(
        sample: SampleView,
        episode: EpisodeView,
        task: TaskItem,
        *,
        target: str,
        yes: str = "yes",
        no: str = "no",
        **_: Any,
    ) -> float:
        return judge_verdict(sample, episode, task, name, target, yes, no, correct)

    fn.__name__, fn.__qualname__, fn.__doc__ = name, name, doc
    return register_reward(name, reads=_param("target"))(fn)


exact_answer = answer_reward(
    "exact_answer",
    is_correct,
    "1 if the first integer of the response equals the reference.",
    decided=first_integer_written,
)
verdict = verdict_reward(
    "verdict",
    is_correct,
    "1 if the verifier says `yes` to a correct `target` parent answer or `no` to a wrong one.",
)


def judge_verdict(
    sample: SampleView,
    episode: EpisodeView,
    task: TaskItem,
    reward: str,
    target: str,
    yes: str,
    no: str,
    correct: Correct,
) -> float:
    """The verdict rule, for any notion of a correct answer: 1 when the sample's first word
    (trailing punctuation dropped) is `yes` and its `target` parent is `correct`, or `no`
    and it is not; 0 for any other word. `reward` names the caller in the error."""
    parents = [episode.samples[p] for p in sample.parent_ids if p in episode.samples]
    judged = [p for p in parents if p.node == target]
    if not judged:
        raise ValueError(f"{reward} reward: sample {sample.id} has no parent from node {target!r}")
    words = sample.text.strip().lower().split()
    said = words[0].strip(".,!") if words else ""
    if said not in (yes, no):
        return 0.0
    return float((said == yes) == correct(judged[0].text, task))


@register_reward("team_final", reads=_param("final"))
def team_final(
    sample: SampleView, episode: EpisodeView, task: TaskItem, *, final: str, **_: Any
) -> float:
    """Team reward: accuracy of the `final` node's samples that this sample fed into.

    Credit flows along every parent link, so a sample shown to the judge shares the judge's
    outcome. A sample that reached no final sample gets the episode's final accuracy (the team
    outcome), so every agent is rewarded for the team's answer. A final sample scores itself.
    """
    finals = episode.of_node(final)
    if not finals:
        raise ValueError(f"team_final reward: episode has no sample of node {final!r}")
    if sample.node == final:
        return float(is_correct(sample.text, task))
    mine = [f for f in finals if sample.id in episode.ancestors(f.id)] or finals
    return sum(is_correct(f.text, task) for f in mine) / len(mine)


@register_reward("length_penalty", reads=_nothing)
def length_penalty(
    sample: SampleView, episode: EpisodeView, task: TaskItem, *, max_chars: int = 64, **_: Any
) -> float:
    """exact_answer minus a penalty growing with response length (for shaping experiments)."""
    return float(is_correct(sample.text, task)) - min(len(sample.text) / max_chars, 1.0) * 0.5
