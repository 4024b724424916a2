"""Reward calls in reward processes: a reward that raises, hangs, dies or returns garbage
costs its own sample only, and the pool goes on with fresh processes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tasks.reward_calls import Call, Job, RewardPool, RewardProcessError

HOSTILE = '''
import os, subprocess, sys, time
from pathlib import Path

def by_text(sample, episode, task, *, log=None, **_):
    """What the sample's text asks for: a reward, or one way to misbehave."""
    what = sample.text
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {time.time()} start {sample.id}\\n")
    if what == "raise":
        raise ValueError("cannot judge " + sample.id)
    if what == "hang":
        while True:
            pass
    if what == "meet":  # wait until another call has started too (at most the timeout)
        Path(f"{log}.{os.getpid()}").touch()
        while len(list(Path(log).parent.glob(Path(log).name + ".*"))) < 2:
            time.sleep(0.02)
    if what == "exit":
        os._exit(3)
    if what == "nan":
        return float("nan")
    if what == "text":
        return "high"
    if what == "print":
        print("noise on stdout")
        return 0.25
    if what == "child":  # a grandchild that would outlive a plain kill of the process
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(log).write_text(str(p.pid))
        time.sleep(600)
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {time.time()} end {sample.id}\\n")
    return float(len(what))
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("plugins") / "hostile_rewards.py"
    path.write_text(HOSTILE)
    return str(path)


@pytest.fixture(scope="module")
def pool(plugin: str) -> RewardPool:
    p = RewardPool([plugin], size=2)
    yield p
    p.close()


def job(*texts: str, timeout: float = 5.0, **params: object) -> Job:
    samples = {f"e/n/0/{i}": {"node": "n", "text": t, "parents": []} for i, t in enumerate(texts)}
    calls = tuple(Call(sid, "hostile_rewards:by_text", dict(params), timeout) for sid in samples)
    return Job({"id": "t0", "question": "q", "answer": "a"}, samples, calls)


def test_each_failure_costs_its_own_call_only(pool: RewardPool) -> None:
    (out,) = pool.run([job("ab", "raise", "nan", "text", "print", "abc")])
    assert [o.reward for o in out if not o.failed] == [2.0, 0.25, 3.0]
    errors = [o.error for o in out]
    assert errors[0] is None and errors[4] is None and errors[5] is None
    assert errors[1] == "ValueError: cannot judge e/n/0/1"
    assert errors[2] == "the reward function returned nan"
    assert errors[3] is not None and errors[3].startswith("ValueError: could not convert")


def test_a_hanging_call_times_out_and_the_rest_of_the_episode_is_scored(
    pool: RewardPool,
) -> None:
    restarts = pool.restarts
    (out,) = pool.run([job("a", "hang", "abcd", timeout=3.0)])
    assert out[1].failed and out[1].error == "timed out after 3 s"
    assert [out[0].reward, out[2].reward] == [1.0, 4.0]  # the last on a fresh process
    assert pool.restarts == restarts + 1


def test_a_call_that_kills_its_process_fails_alone(pool: RewardPool) -> None:
    (out,) = pool.run([job("exit", "ab")])
    assert out[0].error == "the reward process died (exit code 3)"
    assert out[1].reward == 2.0


def test_a_timed_out_call_takes_its_children_with_it(pool: RewardPool, tmp_path: Path) -> None:
    log = tmp_path / "child.pid"
    (out,) = pool.run([job("child", timeout=3.0, log=str(log))])
    assert out[0].error == "timed out after 3 s"
    pid = int(log.read_text())
    for _ in range(50):  # the kernel reaps the killed grandchild (reparented to init)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the reward's child {pid} outlived the timeout")


def test_episodes_are_scored_in_parallel(pool: RewardPool, tmp_path: Path) -> None:
    """Each call waits for the other to start: scored one after the other, the first
    would time out."""
    log = tmp_path / "meet"
    outs = pool.run([job("meet", timeout=60, log=str(log)) for _ in range(2)])
    assert [(o[0].error, o[0].reward) for o in outs] == [(None, 4.0), (None, 4.0)]
    assert len(list(tmp_path.glob("meet.*"))) == 2  # two processes


def test_a_plugin_that_does_not_import_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken_rewards.py"
    bad.write_text("raise ImportError('missing dependency judge_sdk')\n")
    pool = RewardPool([str(bad)], size=1)
    try:
        with pytest.raises(RewardProcessError, match="missing dependency judge_sdk"):
            pool.run([job("a")])
    finally:
        pool.close()


CODE_TASK = {
    "id": "code-0",
    "question": "f(x): x plus 3",
    "answer": (
        '{"solution": "def f(x): return x + 3", "wrong": "def f(x): return x + 4", '
        '"tests": [["f(2)", "5"], ["f(0)", "3"]]}'
    ),
}


def test_hostile_model_code_fails_its_sample_and_the_pool_goes_on() -> None:
    """The `code` workload's coder reward through the reward processes, as a score task
    runs it: model code the sandbox stops is a failed call with the sandbox's reason."""
    texts = {
        "fork": "import os\nwhile True:\n    os.fork()\n",
        "oom": "def f(x):\n    return len(bytearray(10 * 2**30))\n",
        "loop": "def f(x):\n    while True:\n        pass\n",
        "kill": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
        "right": " def f(x): return x + 3",
        "wrong": " def f(x): return x",
    }
    samples = {
        f"e/code/0/{k}": {"node": "code", "text": t, "parents": []} for k, t in texts.items()
    }
    calls = tuple(Call(sid, "code_tests", {}, 10.0) for sid in samples)
    pool = RewardPool([], size=2, rewards=["code_tests"])
    try:
        (out,) = pool.run([Job(CODE_TASK, samples, calls)])
    finally:
        pool.close()
    got = dict(zip(texts, out, strict=True))
    for name in ("fork", "oom", "loop", "kill"):
        assert got[name].failed, name
        assert got[name].error.startswith("SandboxError: code_tests"), got[name].error
    assert (got["right"].error, got["right"].reward) == (None, 1.0)
    assert (got["wrong"].error, got["wrong"].reward) == (None, 0.0)
    assert pool.restarts == 0  # contained in the sandbox: the reward process itself lived
