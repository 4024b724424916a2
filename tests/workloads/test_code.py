"""The `code` workload: its seeded tasks, its rewards (which run model code in the sandbox),
hostile completions (the reward raises: the scoring framework marks the sample failed),
and its warm-start references."""

from __future__ import annotations

import json
import os
import random
import socket
from pathlib import Path

import pytest

from flows.runs.config import load_config
from meg.spec import DatasetSpec
from workloads import BUILTIN
from workloads.code_rewards import code_assertions, code_tests, extract_code
from workloads.code_tasks import (
    DEFAULT_FAMILIES,
    FAMILIES,
    CodeTaskError,
    code_tasks,
    parse_code_task,
)
from workloads.datasets import DatasetError, TaskItem, load_dataset
from workloads.rewards import EpisodeView, SampleView, get_reward, reward_reads
from workloads.sandbox import SandboxError
from workloads.warm_start import PRESET_STEPS, REFERENCES, reference_pairs

EMPTY = EpisodeView({})


def _task(question: str = "f(x): x plus 3", **answer: object) -> TaskItem:
    doc = {
        "solution": "def f(x): return x + 3",
        "wrong": "def f(x): return x + 4",
        "tests": [["f(2)", "5"], ["f(-3)", "0"], ["f(10)", "13"], ["f(0)", "3"]],
        **answer,
    }
    return TaskItem("code-0", question, json.dumps(doc))


def _coder(text: str, task: TaskItem | None = None) -> float:
    return code_tests(SampleView("s0", "code", text, ()), EMPTY, task or _task())


def _tester(text: str, task: TaskItem | None = None) -> float:
    return code_assertions(SampleView("t0", "test", text, ("s0",)), EMPTY, task or _task())


def test_the_generator_is_seeded_and_every_task_is_well_formed() -> None:
    a = code_tasks(random.Random(0), 40, families=list(FAMILIES))
    assert a == code_tasks(random.Random(0), 40, families=list(FAMILIES))
    assert a != code_tasks(random.Random(1), 40, families=list(FAMILIES))
    for i, (question, answer) in enumerate(a):
        ct = parse_code_task(TaskItem(f"t{i}", question, answer))
        assert question.startswith("f(") and len(ct.tests) == 5
        # the generator's own solutions (trusted text): the reference passes every test,
        # the wrong one fails the first (the test the warm start teaches the tester)
        right, wrong = ({}, {})  # type: dict[str, object], dict[str, object]
        exec(ct.solution, right)
        exec(ct.wrong, wrong)
        for call, expected in ct.tests:
            assert repr(eval(call, right)) == expected
        assert repr(eval(ct.tests[0][0], wrong)) != ct.tests[0][1]
    default = code_tasks(random.Random(0), 200)
    assert {q.split(":")[1].split()[0] for q, _ in default} <= {"x", "the"}  # integers
    assert set(DEFAULT_FAMILIES) <= set(FAMILIES)
    # the catching test is on a simple input: its result is the constant, or 0
    firsts = {json.loads(a)["tests"][0][0] for _, a in default}
    assert firsts <= {"f(0)", "f(1)", "f(-1)", "f(2)"}


def test_bad_generator_params_and_bad_tasks_are_refused_clearly() -> None:
    with pytest.raises(TypeError, match="families must be a non-empty list of add"):
        code_tasks(random.Random(0), 1, families=["add", "nope"])
    with pytest.raises(TypeError, match="max_k >= 2"):
        code_tasks(random.Random(0), 1, max_k=1)
    spec = DatasetSpec(generator="code_tasks", params={"families": "add"}, train_size=4)
    with pytest.raises(DatasetError, match="bad params for generator 'code_tasks'"):
        load_dataset(spec)
    with pytest.raises(CodeTaskError, match=r'task q7: answer is not JSON .*"solution"'):
        parse_code_task(TaskItem("q7", "f(x): x", "def f(x): return x"))
    with pytest.raises(CodeTaskError, match="task q8: answer is not a code task"):
        parse_code_task(TaskItem("q8", "f(x): x", json.dumps({"solution": "x", "tests": []})))
    with pytest.raises(CodeTaskError, match="q9"):  # the reward says which task, too
        _coder("def f(x): return x", TaskItem("q9", "f(x): x", "[]"))


def test_the_coder_gets_the_fraction_of_hidden_tests_it_passes() -> None:
    assert _coder(" def f(x): return x + 3") == 1.0
    assert _coder("def f(x):\n    y = x + 3\n    return y\n") == 1.0
    assert _coder("```python\ndef f(x):\n    return 3 + x\n```\nDone.") == 1.0
    assert _coder(" def f(x): return x + 4") == 0.0  # the wrong solution
    assert _coder(" def f(x): return abs(x) + 3") == 0.75  # wrong on f(-3) only
    assert _coder(" def f(x): return x +") == 0.0  # a syntax error
    assert _coder(" def g(x): return x + 3") == 0.0  # no f
    assert _coder(" def f(x): return 1 / 0") == 0.0  # raises on every test
    assert _coder(" def f(x): return float(x + 3)") == 0.0  # 5.0 is not 5


def test_the_coder_cannot_fake_passing() -> None:
    always_equal = "class A(int):\n    def __eq__(self, o): return True\ndef f(x): return A(0)\n"
    assert _coder(always_equal) == 0.0
    assert _coder("import os\nos._exit(0)") == 0.0  # no result line
    fake = (
        "import json, os\nprint('x ' + json.dumps({'loaded': True, 'outputs': ['5'] * 4}))\n"
        "os._exit(0)"
    )
    assert _coder(fake) == 0.0  # a result line without the nonce
    assert _coder("import os\ndef f(x): return os.listdir('.')") == 0.0  # expectations unseen


def test_the_tester_needs_tests_that_hold_and_catch_the_wrong_solution() -> None:
    assert _tester(" assert f(2) == 5") == 1.0
    assert _tester(" assert f(0) == 3\nassert f(1) == 4") == 1.0
    assert _tester(" assert f(2) == 6") == 0.0  # fails on the reference
    assert _tester(" assert True") == 0.0  # holds for both: catches nothing
    assert _tester(" assert f(2) ==") == 0.0  # a syntax error
    assert _tester("") == 0.0
    assert _tester("```python\nassert f(-3) == 0\n```") == 1.0


HOSTILE = {
    "fork bomb": "import os\nwhile True:\n    os.fork()\n",
    "infinite loop": "def f(x):\n    while True:\n        pass\n",
    "10 GB": "def f(x):\n    return len(bytearray(10 * 2**30))\n",
    "write to /tmp": "open('/tmp/flexmarl-planted', 'w').write('x')\n",
    "kill parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "kill caller": f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)\n",
    "subprocess": "import subprocess\nsubprocess.run(['sh', '-c', 'id'])\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_code_makes_the_reward_raise(name: str) -> None:
    with pytest.raises(SandboxError, match=r"code_tests \(s0\): .*(timeout|limit|forbidden)"):
        _coder(HOSTILE[name])
    assert not Path("/tmp/flexmarl-planted").exists()
    assert _coder(" def f(x): return x + 3") == 1.0  # the next ordinary call works


def test_reading_the_store_or_sending_it_out_makes_the_reward_raise(tmp_path: Path) -> None:
    secret = tmp_path / "run" / "store" / "secret"
    secret.parent.mkdir(parents=True)
    secret.write_text("TOPSECRET")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        leak = (
            f"data = open({str(secret)!r}).read()\nimport socket\n"
            f"socket.create_connection(('127.0.0.1', {port})).sendall(data.encode())\n"
            "def f(x): return x + 3\n"
        )
        with pytest.raises(SandboxError, match="forbidden action: open"):
            _coder(leak)
        with pytest.raises(SandboxError, match="forbidden action"):
            _tester(f"import socket\nsocket.create_connection(('127.0.0.1', {port}))")
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing arrived


def test_hostile_tests_make_the_tester_reward_raise() -> None:
    with pytest.raises(SandboxError, match=r"code_assertions \(t0, against the reference\)"):
        _tester("while True:\n    pass")
    with pytest.raises(SandboxError, match="memory limit"):
        _tester("x = bytearray(10 * 2**30)")
    assert _tester(" assert f(2) == 5") == 1.0


def test_the_rewards_are_built_in_and_read_only_their_sample() -> None:
    for name in ("code_tests", "code_assertions"):
        assert get_reward(name) is not None and reward_reads(name, {}) == frozenset()
    assert extract_code(" def f(x): return x") == "def f(x): return x\n"
    assert extract_code(" def f(x):\n    return x") == "def f(x):\n   return x\n"
    assert extract_code(" assert a\nassert b") == "assert a\nassert b\n"


def test_the_workload_loads_and_its_warm_start_references_score_right() -> None:
    spec = load_config(str(BUILTIN["code"]), check_models=False)
    assert spec.rewards["code"].fn == "code_tests" and "code" in PRESET_STEPS
    assert {"code_tests", "code_assertions"} <= set(REFERENCES)
    tasks = load_dataset(spec.dataset).train[:3]
    rng = random.Random(0)
    for task in tasks:
        coder, tester = reference_pairs(spec, task, rng)
        assert coder.prompt == f"Q: {task.question}\nA:"
        assert _coder(coder.completion, task) == 1.0
        assert _tester(tester.completion, task) == 1.0
        assert tester.prompt.startswith(f"Q: {task.question}\nA: def f(")
