"""`flexmarl init NAME`: a starter workload that lives outside the package.

It writes a directory that `flexmarl meg validate NAME/NAME.yaml` accepts and
`flexmarl train NAME/NAME.yaml` runs as it is:

    NAME/NAME.yaml          the MEG: a solver, a checker that judges the solver's answer
    NAME/NAME_rewards.py    its two reward functions, plain Python (`fn: NAME_rewards:...`)
    NAME/tasks.jsonl        a small data set in the `{"question", "answer"}` JSONL format
    NAME/model/             a seeded tiny model (unless `--model DIR` names one)
    NAME/README.md          what to change first

Everything is named relative to the YAML, and the rewards module is a plug-in, so the
directory can be moved or shipped to a cluster whose workers do not share it (the
driver sends the module to every worker).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

MEG = """\
# {name}: a solver answers, a checker judges the solver's answer.
# Rewards come from {name}_rewards.py next to this file (a plug-in: shipped to every worker).
name: {name}
description: solver -> checker on the tasks in tasks.jsonl
plugins: [{name}_rewards]
agents:
  solver: {{model: {model}, sampling: {{max_tokens: 6}}, optim: {{lr: 5.0e-4}}}}
  checker: {{model: {model}, sampling: {{max_tokens: 4}}, optim: {{lr: 5.0e-4}}}}
nodes:
  solve: {{agent: solver, template: "Q: {{question}}=\\nA:", n: 4}}
  check:
    agent: checker
    template: "Q: {{question}}=\\nA:{{solve}}\\nOK?"
    n: 2
    inputs: {{solve: per_sample}}
rewards:
  solve: {{fn: "{name}_rewards:correct"}}
  check: {{fn: "{name}_rewards:judged_right", params: {{target: solve}}}}
team_nodes: [solve]
dataset: {{url: tasks.jsonl, train_size: 48, eval_size: 12}}
run: {{steps: 4, episodes_per_step: 8, micro_batches: 2}}
"""

REWARDS = '''\
"""Rewards of the {name} workload: `fn(sample, episode, task, **params) -> float`.

`@reward(reads=...)` names the other nodes a reward looks at, so the orchestrator can score
a node as soon as those exist (leave it out and the reward waits for the whole episode).
"""

from __future__ import annotations

import re

from workloads.rewards import reward

NUMBER = re.compile(r"-?\\d+")


def answer_of(text: str) -> str | None:
    match = NUMBER.search(text)
    return match.group(0) if match else None


@reward(reads=lambda params: ())
def correct(sample, episode, task, **params) -> float:
    """1 when the first number of the answer is the task's answer."""
    return float(answer_of(sample.text) == task.answer.strip())


@reward(reads=lambda params: (params["target"],))
def judged_right(sample, episode, task, *, target: str, **params) -> float:
    """1 when the checker says yes to a right `target` answer or no to a wrong one."""
    judged = [episode.samples[p] for p in sample.parent_ids if p in episode.samples]
    judged = [p for p in judged if p.node == target]
    if not judged:
        raise ValueError(f"sample {{sample.id}} has no parent from node {{target!r}}")
    said = (sample.text.strip().lower().split() or [""])[0]
    if said not in ("yes", "no"):
        return 0.0
    right = answer_of(judged[0].text) == task.answer.strip()
    return float((said == "yes") == right)
'''

README = """\
# {name}

A starter workload made by `flexmarl init`. Try it as it is:

```bash
flexmarl meg show {name}/{name}.yaml
flexmarl train {name}/{name}.yaml --run-dir runs/{name}
```

Then make it yours: the graph and the rewards' bindings in `{name}.yaml`, the reward
functions in `{name}_rewards.py`, your data in `tasks.jsonl` (one
`{{"question": ..., "answer": ...}}` per line; any JSONL or Parquet file at an fsspec URL
works, see `dataset:`), and a real model in `model:` (a local directory or `hf://ORG/NAME`).
"""


def tasks(n: int, seed: int) -> list[dict[str, str]]:
    """`n` seeded one-digit sums in the JSONL format the MEG reads."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        out.append({"id": f"t{i}", "question": f"{a}+{b}", "answer": str(a + b)})
    return out


def scaffold(out_dir: str | Path, model: str | None = None, seed: int = 0) -> Path:
    """Write the starter directory; returns the MEG file. Refuses to overwrite anything."""
    out = Path(out_dir)
    name = out.name
    if not NAME.match(name):
        raise ValueError(
            f"workload name {name!r}: use letters, digits and _ (it names a Python module)"
        )
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; choose another name")
    out.mkdir(parents=True, exist_ok=True)
    if model is None:
        from workloads.tiny_model import build_tiny_model

        build_tiny_model(out / "model", seed=seed)
        model = "model"
    elif "://" not in model:
        model = str(Path(model).resolve())  # a directory of the caller's, named once
    meg = out / f"{name}.yaml"
    meg.write_text(MEG.format(name=name, model=model))
    (out / f"{name}_rewards.py").write_text(REWARDS.format(name=name))
    (out / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks(60, seed)))
    (out / "README.md").write_text(README.format(name=name))
    return meg
