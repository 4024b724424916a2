from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from storage.errors import IntegrityError, StoreError
from storage.state import Device, Host, StateStore, Url, Worker, content_hash


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "w.bf16": torch.randn(4, 3, generator=g).to(torch.bfloat16),
        "w.fp16": torch.randn(5, generator=g).to(torch.float16),
        "w.fp32": torch.randn(2, 2, generator=g),
        "ids.int64": torch.arange(7),
        "mask.bool": torch.tensor([True, False]),
        "int8": torch.tensor([-3, 4], dtype=torch.int8),
        "step": torch.tensor(12.0),  # 0-dim, like an optimizer's step
        "empty": torch.zeros(0, 3),
    }


def _exact(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert (
            torch.equal(a[k].view(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8))
            if a[k].numel()
            else True
        ), k


@pytest.fixture(params=["file", "memory"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(tmp_path / "state") if request.param == "file" else f"memory://st-{uuid.uuid4().hex}"


@pytest.mark.parametrize("at", [Host(), Device("cpu"), Url()], ids=["host", "device", "url"])
def test_round_trip_every_location_bit_exact(root: str, at: Any) -> None:
    store = StateStore(root)
    src = _tensors()
    want = content_hash(src)
    ref = store.put("solver/v1", src, {"version": 1}, at=at)
    # the hash is lazy: recorded when a state leaves the process, "" for in-process states
    assert ref.sha256 == (want if isinstance(at, Url) else "") and ref.nbytes > 0
    src["w.fp32"].add_(1.0)  # put snapshots: a later in-place update does not leak in
    got, meta = store.get("solver/v1")
    assert meta == {"version": 1} and content_hash(got) == want == store.digest("solver/v1")
    _exact(got, _tensors())
    assert store.where("solver/v1") == (Url(root) if isinstance(at, Url) else at)


def test_move_through_all_local_locations(root: str) -> None:
    store = StateStore(root)
    store.put("opt", _tensors(), {"lr": 0.1})
    for loc in (Device("cpu"), Url(), Host(), Url(), Device("cpu")):
        ref = store.move("opt", loc)
        assert store.where("opt") == ref.location
        assert ref.sha256 == (content_hash(_tensors()) if isinstance(loc, Url) else "")
        _exact(store.get("opt")[0], _tensors())
    assert store.keys() == ["opt"]
    store.delete("opt")
    assert store.where("opt") is None and store.keys() == []


def test_url_state_is_visible_to_another_store_instance(tmp_path: Path) -> None:
    a, b = StateStore(str(tmp_path)), StateStore(str(tmp_path))
    a.put("weights/solver/v3", _tensors(), {"version": 3}, at=Url())
    assert b.keys("weights/") == ["weights/solver/v3"] and b.where("weights/solver/v3") == Url(
        str(tmp_path)
    )
    got, meta = b.get("weights/solver/v3", to=Device("cpu"))
    _exact(got, _tensors())
    assert meta == {"version": 3} and a.url_for("x/y") == f"{tmp_path}/x/y"


def test_corrupt_and_missing_states_are_clear_errors(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path))
    store.put("w", {"a": torch.arange(100, dtype=torch.int32)}, at=Url())
    path = tmp_path / "w" / "tensors.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-4] ^= 0xFF
    path.write_bytes(bytes(raw))
    fresh = StateStore(str(tmp_path))
    with pytest.raises(IntegrityError, match=r"w/tensors\.safetensors does not match the sha256"):
        fresh.get("w")
    assert path.read_bytes() == bytes(raw)  # left untouched
    (tmp_path / "w" / "state.json").write_text("{not json")
    with pytest.raises(IntegrityError, match=r"state\.json"):
        fresh.get("w")
    with pytest.raises(StoreError, match="no state 'nope'"):
        fresh.get("nope")


def test_bad_input(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path))
    with pytest.raises(StoreError, match="not valid"):
        store.put("../x", {})
    with pytest.raises(StoreError, match="JSON"):
        store.put("x", {}, {"bad": object()})
    with pytest.raises(StoreError, match="not a tensor"):
        store.put("x", {"a": [1, 2]})  # type: ignore[dict-item]
    with pytest.raises(StoreError, match="unknown location"):
        store.put("x", {}, at="cpu")  # type: ignore[arg-type]
    store.put("x", {})
    with pytest.raises(StoreError, match="use move"):
        store.get("x", to=Url())
    with pytest.raises(StoreError, match="Dask client"):
        store.move("x", Worker("tcp://127.0.0.1:1"))


def _flip_worker_byte(key: str) -> None:
    from storage import state

    blob, meta = state._WORKER_STATES[key]
    state._WORKER_STATES[key] = (blob[:-1] + bytes([blob[-1] ^ 0xFF]), meta)


def test_worker_location_with_real_cluster(tmp_path: Path) -> None:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        w0, w1 = sorted(client.scheduler_info()["workers"])
        store = StateStore(str(tmp_path))
        store.put("solver", _tensors(), {"v": 1}, at=Worker(w0))
        assert client.run(lambda: sorted(__import__("storage.state").state._WORKER_STATES)) == {
            w0: ["solver"],
            w1: [],
        }
        assert store.move("solver", Worker(w1)).sha256 == content_hash(_tensors())
        held = client.run(lambda: sorted(__import__("storage.state").state._WORKER_STATES))
        assert held == {w0: [], w1: ["solver"]}
        _exact(store.get("solver")[0], _tensors())
        # bytes damaged on the worker are caught on the way back, and left in place
        client.run(_flip_worker_byte, "solver", workers=[w1])
        with pytest.raises(IntegrityError, match=f"held by worker {w1} does not match"):
            store.get("solver")
        client.run(_flip_worker_byte, "solver", workers=[w1])  # restore
        store.move("solver", Url())
        _exact(StateStore(str(tmp_path)).get("solver")[0], _tensors())
