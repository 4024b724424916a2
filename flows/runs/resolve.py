"""One resolved run config: a MEG's `run:` section and the command line's values, merged once.

Every run setting has one home, `RunSpec` (meg/run_spec.py). A MEG file gives its defaults,
`flexmarl train` flags of the same name override them (`TrainParams`, whose override fields
are generated from RunSpec's by `override_fields`: None means "not given"), and `resolve`
merges the two into a new frozen spec whose `run` holds the values the run uses — with
where each came from: `cli`, `meg` (the MEG file set it) or `default` (RunSpec's own).
`run.json` stores exactly that spec, and the pipeline, the tasks, the trainers and a resume
read only it (`RunContext.mode`, `.steps`, ... are views of it).

A resumed run keeps its settings: `continued` lets the command line (or the MEG file given
again) raise `steps` — continuing a finished run, as a larger `max_steps` does in TRL — and
refuses anything else that differs, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from meg import MEGSpec
from meg.spec import RunSpec

Source = Literal["cli", "meg", "default"]
RUN_FIELDS = tuple(RunSpec.model_fields)
# The run settings a `flexmarl train` flag may override (the rollout and selection policies,
# scoring and trackers are the MEG file's alone).
OVERRIDABLE = (
    "mode",
    "staleness",
    "steps",
    "episodes_per_step",
    "micro_batches",
    "window",
    "seed",
    "balance",
    "elastic",
    "rollout_gradients",
    "checkpoint_every",
    "keep_checkpoints",
)


def override_fields(names: tuple[str, ...] = OVERRIDABLE) -> dict[str, Any]:
    """pydantic field definitions (`create_model(**override_fields())`) of the run settings
    `names` as overrides: RunSpec's type with its bounds, or None (not given: the MEG's value
    stands), and RunSpec's description with the default it falls back to. RunSpec's
    validators are not carried over: a flag takes the value as typed (`--checkpoint-every 0`
    is refused, where an old MEG file's 0 still means every step)."""
    fields: dict[str, Any] = {}
    for name in names:
        info = RunSpec.model_fields[name]
        kind: Any = info.annotation
        if info.metadata:  # its bounds: `ge`, `le`, ...
            kind = Annotated[(kind, *info.metadata)]
        about = (info.description or name).rstrip(".")
        about += f" (default: the MEG's run.{name}, else {info.default})"
        fields[name] = (kind | None, Field(None, description=about))
    return fields


class ResolveError(ValueError):
    """An override that does not fit the MEG's run settings (a user error)."""


def resolve(spec: MEGSpec, overrides: Mapping[str, Any]) -> tuple[MEGSpec, dict[str, Source]]:
    """`spec` with the given (non-None) run settings applied and validated together, and the
    source of every run setting."""
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(given) - set(RUN_FIELDS))
    if unknown:
        raise TypeError(f"not run settings: {unknown} (RunSpec has {list(RUN_FIELDS)})")
    try:
        resolved = spec.with_run(**given)
    except ValidationError as e:
        raise ResolveError(_options_message(e, given)) from None
    found = sources(spec.run, given)
    return graph_defaults(resolved, found), found


# A one-agent run's checkpoint interval when no one set it (flows.runs.resolve.graph_defaults)
SOLO_CHECKPOINT_EVERY = 10


def graph_defaults(spec: MEGSpec, found: Mapping[str, Source]) -> MEGSpec:
    """`spec` with the run settings whose default depends on the graph, where no one set them.

    `checkpoint_every`: a one-agent run checkpoints every `SOLO_CHECKPOINT_EVERY` steps (and
    always at its last). Why: its steps are short (GRPO on one small policy), and writing its
    weights and AdamW state every step was a measurable share of each (docs/training.md has
    the numbers). A crash costs little more: a resume replays at most 9
    steps of training from the store (rollouts are committed, never redone). Multi-agent runs
    keep every step, the setting their benchmarks and the simulator's calibration used."""
    agents = {n.agent for n in spec.nodes.values()}
    if found.get("checkpoint_every") == "default" and len(agents) == 1:
        return spec.with_run(checkpoint_every=SOLO_CHECKPOINT_EVERY)
    return spec


def sources(run: RunSpec, given: Mapping[str, Any]) -> dict[str, Source]:
    """Where each run setting comes from, given the MEG's `run` and the command line's."""
    from_meg = run.model_fields_set

    def source(name: str) -> Source:
        return "cli" if name in given else "meg" if name in from_meg else "default"

    return {name: source(name) for name in RUN_FIELDS}


def _options_message(e: ValidationError, given: Mapping[str, Any]) -> str:
    """pydantic's errors as the flags the user typed (`--micro-batches: ...`)."""
    parts = []
    for err in e.errors():
        field = str(err["loc"][0]) if err["loc"] else ""
        msg = str(err["msg"]).removeprefix("Value error, ")
        flag = f"--{field.replace('_', '-')}" if field in given else f"run.{field}"
        parts.append(f"{flag}: {msg}" if field else msg)
    return "; ".join(parts)


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The first path (`nodes.verify.template`) where two JSON-like values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                return where
            if (found := first_difference(a[key], b[key], where)) is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if (found := first_difference(x, y, f"{path}[{i}]")) is not None:
                return found
        return None
    return None if a == b else path or "(the whole value)"


def continued(
    recorded: MEGSpec, overrides: Mapping[str, Any], meg: MEGSpec | None = None
) -> MEGSpec:
    """The spec a resumed run goes on with: the recorded one, with `steps` raised if the
    command line (`overrides`, None: not given) or the MEG file given again (`meg`) asks for
    more. Anything else that differs from the run's is refused (`ResolveError`)."""
    asked: dict[str, Any] = {}
    if meg is not None:
        mine = recorded.model_dump(mode="json", exclude={"run"})
        given = meg.model_dump(mode="json", exclude={"run"})
        for name, agent in given["agents"].items():  # `auto`: what the run chose for it
            if agent["backend"] == "auto" and name in mine["agents"]:
                agent["backend"] = mine["agents"][name]["backend"]
        where = first_difference(given, mine)
        if where is not None:
            raise ResolveError(
                f"the MEG differs from the run's at `{where}`: --resume continues the run it "
                "recorded (run.json); start a new run for a changed MEG"
            )
        # what the MEG sets itself: a default the run resolved for its graph (a one-agent
        # run's `checkpoint_every`) was not asked for again
        asked = meg.run.model_dump(include=meg.run.model_fields_set)
    asked |= {k: v for k, v in overrides.items() if v is not None}
    if asked.get("rollout_gradients") == "auto":  # what the run chose for it
        del asked["rollout_gradients"]
    run = recorded.run.model_dump()
    steps = asked.pop("steps", run["steps"])
    changed = [k for k, v in asked.items() if k in run and v != run[k]]
    if changed:
        shown = ", ".join(f"{k} {asked[k]!r} (the run's: {run[k]!r})" for k in changed)
        raise ResolveError(
            f"--resume keeps the run's settings; asked to change {shown}. Only --steps may "
            "grow a run"
        )
    if steps < run["steps"]:
        raise ResolveError(
            f"--steps {steps}: the run has {run['steps']} steps; --resume may add steps, "
            "not remove them"
        )
    return recorded if steps == run["steps"] else recorded.with_run(steps=steps)
