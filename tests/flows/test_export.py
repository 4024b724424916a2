"""The final exports (`flows.export`): a run on a cluster of its own exports on its training
worker, so its driver never imports torch; a joined cluster's run exports in the driver
(`test_train.py`, `test_lora.py`, `test_evaluate.py` cover that path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from storage.state import StateStore
from tests.flows.conftest import write_config

ROOT = Path(__file__).resolve().parents[2]

RUN = """
import json, sys
from flows.train import TrainParams, train

if __name__ == "__main__":
    out = train(TrainParams(config=sys.argv[1], run_dir=sys.argv[2]))
    heavy = [m for m in ("torch", "transformers", "vllm", "peft") if m in sys.modules]
    print("RESULT " + json.dumps({"out": out, "driver_imported": heavy}))
"""


@pytest.mark.slow
def test_a_run_on_its_own_cluster_exports_on_its_worker(
    tmp_path: Path, tiny_model: str, prefect_server: str
) -> None:
    """Both agents' last published policy lands in `final/<agent>/`, the driver holds no
    torch, transformers, vLLM or peft, and the cluster closes without killing a worker."""
    cfg = write_config(tmp_path, tiny_model, backend="hf", steps=2)
    run_dir = tmp_path / "run"
    script = tmp_path / "run_it.py"
    script.write_text(RUN)
    done = subprocess.run(
        [sys.executable, str(script), str(cfg), str(run_dir)],
        cwd=ROOT,
        env={**os.environ, "PREFECT_API_URL": prefect_server},
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    out = result["out"]
    assert out["steps"] == 2 and result["driver_imported"] == []
    assert "still alive" not in log  # no worker was killed at the end
    state = StateStore(f"{out['store_url'].rstrip('/')}/{out['run_id']}/_state")
    for agent in ("solver", "verifier"):
        final = run_dir / "final" / agent
        assert json.loads((final / "flexmarl.json").read_text()) == {"agent": agent, "version": 2}
        published, _ = state.get(f"weights/{agent}/v000002")
        exported = load_file(str(final / "model.safetensors"))
        shared = published.keys() & exported.keys()
        assert "model.embed_tokens.weight" in shared
        assert all(torch.equal(exported[k], published[k].to(exported[k].dtype)) for k in shared)
        assert (final / "config.json").is_file() and (final / "tokenizer.json").is_file()
