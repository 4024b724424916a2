"""Exchanges that follow upstream nodes (critics debating a proposal) and `chat:` prompts:
unrolling, lineage of the expansion, and the validation errors that name the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from meg import MEGError, build_spec, expand_episode, load_meg, validate
from meg.template import chat_frame, prompt_ids
from workloads.rewards import known_rewards

CRITIC_DEBATE = Path(__file__).parents[2] / "workloads" / "critic_debate.yaml"


def critic_debate() -> Any:
    return load_meg(CRITIC_DEBATE, known_rewards=known_rewards(), check_models=False)


def test_turns_show_the_proposal_first_as_written_then_of_their_own_thread() -> None:
    spec = critic_debate()
    assert spec.nodes["skeptic@1"].inputs == {"propose": "per_sample"}
    assert spec.nodes["skeptic@2"].inputs == {
        "skeptic@1": "per_sample",
        "advocate@1": "first",
        "propose": "first",  # per_sample upstream → the thread's own proposal
    }
    assert spec.nodes["advocate@2"].template.startswith("Q: {question}=\nA:{propose}\nOK?")


def test_every_turn_sees_the_proposal_its_thread_descends_from() -> None:
    exp = expand_episode(critic_debate(), "e")
    by_id = {s.id: s for samples in exp.samples.values() for s in samples}
    proposals = {s.id for s in exp.samples["propose"]}
    assert len(proposals) == 2 and len(exp.samples["skeptic@2"]) == 2
    for node in ("skeptic@2", "advocate@2", "final"):
        for plan in exp.invocations[node]:
            shown = {p: [s.id for s in samples] for p, samples in plan.inputs}
            (prop,) = shown["propose"]
            for parent, ids in shown.items():  # every shown sample is of the same debate
                for sid in ids:
                    lineage = {sid, *(ancestor for _, ancestor in by_id[sid].lineage)}
                    assert prop in lineage or sid == prop, (node, parent, sid, prop)


def base(**exchange: Any) -> dict[str, Any]:
    ex = {
        "agents": ["a", "b"],
        "rounds": 2,
        "first_template": "{question} {p}",
        "reply_template": "{p} {self} {other}",
        "inputs": {"p": "per_sample"},
        **exchange,
    }
    return {
        "name": "t",
        "agents": {k: {"model": "hf://o/m"} for k in ("a", "b", "c")},
        "nodes": {"p": {"agent": "c", "template": "{question}", "n": 2}},
        "exchanges": {"x": ex},
    }


@pytest.mark.parametrize(
    ("exchange", "field", "words"),
    [
        ({"inputs": {"nope": "all"}}, "exchanges.x.inputs", "unknown input node 'nope'"),
        ({"inputs": {"a@1": "all"}}, "exchanges.x.inputs", "outside itself"),
        ({"inputs": {"p": "most"}}, "nodes.a@1.inputs.p", "unknown fan-out rule 'most'"),
        ({"first_template": "{question} {q}"}, "nodes.a@1.template", "{q} is not an input"),
        ({"chat": {"user": "hi"}}, "exchanges.x.chat.user", "only a `system` message"),
    ],
)
def test_exchange_mistakes_name_the_field(exchange: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(MEGError) as err:
        validate(build_spec(base(**exchange)), known_rewards=known_rewards(), check_models=False)
    assert err.value.field == field and words in str(err.value)


def test_chat_nodes_take_the_user_message_once_and_a_fixed_system() -> None:
    data = base()
    data["nodes"]["p"] = {"agent": "c", "chat": {"system": "Be brief.", "user": "Q: {question}"}}
    spec = validate(build_spec(data), known_rewards=known_rewards(), check_models=False)
    assert spec.nodes["p"].template == "Q: {question}"
    data["nodes"]["p"] = {"agent": "c", "template": "x", "chat": {"user": "y"}}
    with pytest.raises(MEGError, match=r"either `template` or `chat\.user`"):
        build_spec(data)
    data["nodes"]["p"] = {"agent": "c", "template": "x", "chat": {"system": "{question}"}}
    with pytest.raises(MEGError, match="fixed text") as err:
        validate(build_spec(data), known_rewards=known_rewards(), check_models=False)
    assert err.value.field == "nodes.p.chat.system"


class _Tok:
    """A tokenizer stand-in with a real Jinja chat template, as `apply_chat_template`."""

    def __init__(self, template: str | None) -> None:
        self.chat_template = template

    def apply_chat_template(
        self, messages: Any, tokenize: bool, add_generation_prompt: bool
    ) -> str:
        import jinja2

        return jinja2.Template(str(self.chat_template)).render(
            messages=messages, add_generation_prompt=add_generation_prompt
        )


def test_chat_frame_wraps_the_token_in_token_out_user_message() -> None:
    from workloads.tiny_model import CHAT_TEMPLATE

    before, after = chat_frame(_Tok(CHAT_TEMPLATE), "Be brief.")
    assert (before, after) == ("<|system|>\nBe brief.\n<|user|>\n", "\n<|assistant|>\n")

    def encode(text: str) -> list[int]:
        return [ord(c) for c in text]

    ids = prompt_ids(
        "A:{p}",
        ([1, 2], [3]),
        "q",
        {"p": [[70, 71, 9]]},
        encode,
        eos_id=9,
        newline_ids=[10],
    )
    assert ids == [1, 2, ord("A"), ord(":"), 70, 71, 3]  # parent ids spliced, EOS dropped
    with pytest.raises(ValueError, match="no chat template"):
        chat_frame(_Tok(None), None)
    with pytest.raises(ValueError, match="does not show the user message"):
        chat_frame(_Tok("{{ 'fixed' }}"), None)
