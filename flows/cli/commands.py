"""Subcommands of `flexmarl`. Each parses its arguments and calls one library function."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engines.model_files import ModelFetchError
from flows.cli.command_registry import command
from flows.runs.config import load_config
from flows.runs.record import RunError
from meg import analyze
from meg.render import mermaid, text
from storage.errors import StoreError
from workloads import BUILTIN, resolve_config
from workloads.datasets import DatasetError

EXTRA_USER_ERRORS: tuple[type[BaseException], ...] = (
    DatasetError,
    RunError,
    StoreError,
    ModelFetchError,
)


def option_error(e: Any) -> RunError:
    """A pydantic ValidationError of command-line parameters as a one-line user error that
    names the option (`--keep-checkpoints: Input should be greater than or equal to 1`)."""
    err = e.errors()[0]
    flag = str(err["loc"][-1]).replace("_", "-") if err["loc"] else "options"
    return RunError(f"--{flag}: {err['msg']} (got {err.get('input')!r})")


def _config_arg(p: argparse.ArgumentParser) -> None:
    builtins = ", ".join(BUILTIN)
    p.add_argument("config", help=f"MEG YAML file, or a built-in workload ({builtins})")


def _meg_show_args(p: argparse.ArgumentParser) -> None:
    _config_arg(p)
    p.add_argument("--mermaid", action="store_true", help="print the graph as a Mermaid diagram")
    p.add_argument(
        "--skip-model-check",
        action="store_true",
        help="do not require the agents' model directories to exist",
    )


def _meg_validate_args(p: argparse.ArgumentParser) -> None:
    _meg_show_args(p)
    p.add_argument(
        "--scheduler",
        help="also check that every worker of this Dask cluster can open the local models",
    )
    p.add_argument("--store", help="with --scheduler: also check the store (a local folder)")


@command(
    "meg validate",
    "Validate a MEG config; exit 0 if valid, 2 with the problem if not.",
    _meg_validate_args,
)
def meg_validate(args: argparse.Namespace) -> int:
    spec = load_config(args.config, check_models=not args.skip_model_check)
    where = ""
    if args.scheduler:
        from distributed import Client

        from flows.cluster.reach import check_reachable

        with Client(args.scheduler, timeout=60) as client:
            check_reachable(client, spec, args.store)
            where = f"; every worker of {args.scheduler} can open its local paths"
    print(
        f"{resolve_config(args.config)}: valid MEG {spec.name!r} "
        f"({len(spec.agents)} agents, {len(spec.nodes)} nodes){where}"
    )
    return 0


def _meg_show_workers(p: argparse.ArgumentParser) -> None:
    _meg_show_args(p)
    p.add_argument(
        "--rollout-workers", type=int, default=1, help="for the weights report (default 1)"
    )
    p.add_argument(
        "--train-workers", type=int, default=1, help="for the weights report (default 1)"
    )


@command(
    "meg show",
    "Show a MEG: order, episode expansion, load per agent, critical path, weights per worker.",
    _meg_show_workers,
)
def meg_show(args: argparse.Namespace) -> int:
    spec = load_config(args.config, check_models=not args.skip_model_check)
    if args.mermaid:
        print(mermaid(spec), end="")
        return 0
    print(text(spec, analyze(spec)), end="")
    if args.rollout_workers < 1 or args.train_workers < 1:
        raise RunError("--rollout-workers and --train-workers must be at least 1")
    if not args.skip_model_check:  # the report reads the model files
        from flows.report.memory import report

        print(report(spec, args.rollout_workers, args.train_workers), end="")
    return 0


def _init_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", type=Path, help="directory to create; its last part names the workload")
    p.add_argument(
        "--model",
        default=None,
        help="model of both agents (a directory or hf://ORG/NAME); default: a seeded tiny "
        "model built into NAME/model",
    )


@command("init", "Write a starter workload (MEG, rewards module, JSONL data).", _init_args)
def init_cmd(args: argparse.Namespace) -> int:
    from workloads.scaffold import scaffold

    try:
        meg = scaffold(args.name, model=args.model)
    except (ValueError, FileExistsError) as e:
        raise RunError(str(e)) from None
    print(f"starter workload written: {meg}\n  flexmarl meg show {meg}\n  flexmarl train {meg}")
    return 0


def _tiny_args(p: argparse.ArgumentParser) -> None:
    from workloads.family_configs import family_names

    p.add_argument("out_dir", type=Path)
    p.add_argument(
        "--family",
        choices=family_names(),
        default="llama",
        help="model family (architecture and its quirks); default: llama",
    )
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument(
        "--vocab", type=int, default=None, help="model vocabulary (default: the family's)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--warm-start",
        metavar="WORKLOAD",
        default=None,
        help="supervised warm start on this workload's task format (e.g. math-chain)",
    )
    p.add_argument(
        "--warm-steps",
        type=int,
        default=None,
        help="optimizer steps of the warm start (default: the workload's preset)",
    )


@command(
    "tiny-model", "Build a seeded tiny Llama-style model + BPE tokenizer (HF format).", _tiny_args
)
def tiny_model(args: argparse.Namespace) -> int:
    from workloads.tiny_model import build_tiny_model

    out = build_tiny_model(
        args.out_dir,
        family=args.family,
        layers=args.layers,
        hidden=args.hidden,
        vocab=args.vocab,
        seed=args.seed,
    )
    print(f"tiny model written to {out}")
    if args.warm_start:
        from workloads.warm_start import warm_start

        report = warm_start(
            out,
            load_config(args.warm_start, check_models=False),
            steps=args.warm_steps,
            seed=args.seed,
        )
        print(report.summary())
    return 0


def _train_args(p: argparse.ArgumentParser) -> None:
    from flows.cli.params import add_model_args
    from flows.train import TrainParams

    add_model_args(p, TrainParams, positional=("config",))


def train_params(args: argparse.Namespace) -> Any:
    """The validated `TrainParams` of `flexmarl train ...` (raises pydantic's error)."""
    from flows.cli.params import model_from_args
    from flows.train import TrainParams

    return model_from_args(TrainParams, args)


@command("train", "Train the agents of a MEG with RL (sync | flex | async).", _train_args)
def train_cmd(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from flows.cluster.start import prefect_api
    from flows.train import check, train

    if "config" not in vars(args) and "resume" not in vars(args):
        raise RunError("give a CONFIG (or --resume RUN_DIR)")
    try:
        params = train_params(args)
    except ValidationError as e:
        raise option_error(e) from None
    settled = check(params)  # user mistakes: one paragraph, exit 2, before anything starts
    for note in settled.notes:  # what the run chose (engines, layout, gradients)
        print(note)  # the flow's own print is a log line, below the CLI's log level
    with prefect_api() as url:
        print(f"Prefect API: {url}")
        out = train(params, settled)  # the flow starts from this one decision
    c = out["consistency"]
    k = min(3, max(1, len(out["per_step"]) // 2))  # as flows.report.metrics.reward_gain
    print(
        f"done: {out['steps']} steps in {out['wall_s']:.1f} s, utilization "
        f"{out['utilization']:.2f}, team reward first->last "
        f"{out['per_step'][0]['team_reward'] if out['per_step'] else float('nan'):.3f} -> "
        f"{out['per_step'][-1]['team_reward'] if out['per_step'] else float('nan'):.3f} "
        f"(mean of the last {k} steps - the first {k}: "
        f"{out['reward_gain_last3_vs_first3']:+.3f}), consistency "
        f"violations {c['violations']}/{c['rows_checked']} rows, step accounting errors "
        f"{c['accounting_errors']}; run dir {out['run_dir']}"
    )
    if out["reward_failures"]:
        failures = ", ".join(f"{a} {n}" for a, n in out["reward_failures"].items())
        print(f"failed reward calls (scored by run.scoring.on_failure): {failures}")
    g = out["gradient_parts"]
    if g.get("added"):  # gradients on the rollout workers: say what the trainer redid
        print(
            f"gradients on the rollout workers: {g['added']} micro-batches added, "
            f"{g.get('trained', 0)} refused and recomputed on the trainer"
        )
    r = out["rollout"]
    from flows.report.metrics import PROMPTS

    counts = {k.removesuffix(PROMPTS): n for k, n in r.items() if k.endswith(PROMPTS) and n}
    if r["carried_tokens"] or counts:  # a rollout or selection policy acted
        print(
            f"rollout policies: {r['carried_tokens']} tokens carried to a next step, "
            f"{r['offpolicy_frac']:.1%} of trained tokens off-policy, "
            f"{r['thrown_away_tokens']} thrown away at the end"
            + "".join(f", {n} prompts {name}" for name, n in sorted(counts.items()))
        )
    return 0


def _store_ls_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="store URL (a path, file://, s3://, ...)")
    p.add_argument("--json", action="store_true")


@command("store ls", "List runs, agents, steps, rows and versions of a MEG Store.", _store_ls_args)
def store_ls_cmd(args: argparse.Namespace) -> int:
    from storage.cli import store_ls

    print(store_ls(args.url, as_json=args.json))
    return 0


def _store_show_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url")
    p.add_argument("--run", required=True)
    p.add_argument("--agent", required=True)
    p.add_argument("--step", type=int, default=None)
    p.add_argument("--json", action="store_true")


@command("store show", "Show an agent's rows (rewards, lengths, versions).", _store_show_args)
def store_show_cmd(args: argparse.Namespace) -> int:
    from storage.cli import store_show

    print(store_show(args.url, args.run, args.agent, step=args.step, as_json=args.json))
    return 0


def _ui_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=4200)


@command("ui", "Start the Prefect server with its UI on 127.0.0.1 and print the URL.", _ui_args)
def ui_cmd(args: argparse.Namespace) -> int:
    from flows.cli.ui import serve

    if not 0 < args.port < 65536:
        raise RunError(f"--port must be a TCP port (1-65535), got {args.port}")
    print(
        f"Prefect UI: http://127.0.0.1:{args.port}  (export PREFECT_API_URL="
        f"http://127.0.0.1:{args.port}/api so that `flexmarl train` reports to it)",
        flush=True,
    )
    return serve(args.port)


def _evaluate_args(p: argparse.ArgumentParser) -> None:
    from flows.cli.params import add_model_args
    from flows.eval_params import EvalParams

    add_model_args(p, EvalParams, positional=("config",))


@command(
    "evaluate",
    "Greedy accuracy of the team and of each agent on the held-out split.",
    _evaluate_args,
)
def evaluate_cmd(args: argparse.Namespace) -> int:
    from pydantic import ValidationError
    from rich.console import Console

    from flows.cli.params import model_from_args
    from flows.cluster.start import prefect_api
    from flows.eval_models import check_checkpoint
    from flows.evaluate import EvalParams, evaluate_flow, table

    if "config" not in vars(args):
        raise RunError("give a CONFIG: a MEG YAML file or a built-in workload")
    try:
        params = model_from_args(EvalParams, args)
    except ValidationError as e:
        raise option_error(e) from None
    check_checkpoint(params.base, params.checkpoint)  # fails before any server starts
    with prefect_api():
        out = evaluate_flow(params)
    Console().print(table(out))
    if params.json_path:
        print(f"result written to {params.json_path}")
    return 0
