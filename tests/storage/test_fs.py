"""StateStore states and checkpoints on an S3 server that goes away mid-run (a TCP proxy in
front of a real moto server, killed and started again): they retry under the store's
policy, like segments do, and finish with the right bytes. Local paths never retry.

No wall clock in the assertions: each outage ends only once the test has seen a retry."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem

from engines.training.checkpoint import load_checkpoint, save_state
from engines.training.checkpoint_index import latest_checkpoint
from storage.errors import StoreUnavailableError
from storage.fs import RetryingFS, open_fs, retry_stats
from storage.retry import RETRY_ENV, RETRY_OPTION, Retrier, RetryPolicy
from storage.state import StateStore, Url
from tests.storage.conftest import Proxy, new_bucket, s3_options
from tests.storage.test_s3_outage import FAST, QUICK_BOTO, when


def tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g)}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_local_paths_are_not_wrapped(tmp_path: Any) -> None:
    fs, path = open_fs(f"file://{tmp_path}/x", {RETRY_OPTION: {"attempts": 3}})
    assert not isinstance(fs, RetryingFS) and path.endswith("/x")
    assert retry_stats(str(tmp_path)) is None


def test_a_bad_policy_is_refused_before_any_call() -> None:
    with pytest.raises(Exception, match="store_retry"):
        open_fs("memory://x", {RETRY_OPTION: {"attempts": 0}})


class LostAnswers(MemoryFileSystem):
    """A real in-memory filesystem whose first `rm_file` lands but loses its answer (the
    connection reset after the server acted): what a retried delete must live with."""

    lost = 0

    def rm_file(self, path: str) -> None:  # type: ignore[override]
        super().rm_file(path)
        if not LostAnswers.lost:
            LostAnswers.lost += 1
            raise ConnectionResetError("reset after the delete")


def test_a_retried_delete_whose_first_try_landed_is_done() -> None:
    fs = LostAnswers(skip_instance_cache=True)
    fs.pipe_file("/d/f", b"x")
    rfs = RetryingFS(fs, Retrier(RetryPolicy(attempts=3, base_s=0.0, max_s=0.0), "memory://", "m"))
    rfs.rm_file("/d/f")
    assert not fs.exists("/d/f") and rfs.retry.stats.recovered == 1
    with pytest.raises(FileNotFoundError):  # a first try that finds nothing still raises
        rfs.rm_file("/d/f")


def state_store(endpoint: str, bucket: str, **policy: Any) -> StateStore:
    options = {
        **s3_options(endpoint),
        "config_kwargs": QUICK_BOTO,
        RETRY_OPTION: {**FAST, **policy},
    }
    return StateStore(f"s3://{bucket}/state", options)


def test_states_ride_out_a_proxy_restart(
    proxy: Proxy, moto_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = new_bucket(moto_endpoint)
    states = state_store(proxy.endpoint, bucket)
    states.put("solver/published", tensors(0), {"version": 1}, at=Url())
    stats = retry_stats(states.root_url, states.storage_options)
    with caplog.at_level(logging.WARNING, logger="storage.retry"):
        proxy.kill()  # a write into the outage
        seen = stats.retries
        back = when(lambda: stats.retries >= seen + 3, proxy.start)
        states.put("solver/published", tensors(1), {"version": 2}, at=Url())
        back.join()
        proxy.kill()  # a read and a listing, from another process's view (a new StateStore)
        seen = stats.retries
        back = when(lambda: stats.retries >= seen + 3, proxy.start)
        other = state_store(proxy.endpoint, bucket)
        got, meta = other.get("solver/published")
        back.join()
    assert same(got, tensors(1)) and meta == {"version": 2}
    assert other.keys() == ["solver/published"]
    assert stats.recovered >= 2 and stats.gave_up == 0
    assert f"{proxy.endpoint}: " in caplog.text


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch, proxy: Proxy) -> Proxy:
    """How a `flexmarl train --store s3://...` run reaches S3: the environment."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")  # botocore's own retries: ours are the test
    monkeypatch.setenv(RETRY_ENV, '{"attempts": 40, "base_s": 0.05, "max_s": 0.5}')
    return proxy


def test_checkpoints_ride_out_a_proxy_restart(s3_env: Proxy, moto_endpoint: str) -> None:
    root = f"s3://{new_bucket(moto_endpoint)}/run/_checkpoints/solver"
    save_state(f"{root}/v000001", tensors(1), {"version": 1})
    stats = retry_stats(root)
    s3_env.kill()  # a checkpoint written into the outage
    seen = stats.retries
    back = when(lambda: stats.retries >= seen + 3, s3_env.start)
    save_state(f"{root}/v000002", tensors(2), {"version": 2})
    back.join()
    s3_env.kill()  # and the resume's scan and load
    seen = stats.retries
    back = when(lambda: stats.retries >= seen + 3, s3_env.start)
    latest = latest_checkpoint(root)
    back.join()
    assert latest == f"{root}/v000002"
    got, meta = load_checkpoint(latest)
    assert same(got, tensors(2)) and meta["version"] == 2
    assert stats.recovered >= 2 and stats.gave_up == 0


def test_a_state_server_that_never_comes_back(proxy: Proxy, moto_endpoint: str) -> None:
    states = state_store(proxy.endpoint, new_bucket(moto_endpoint), attempts=3)
    proxy.kill()
    with pytest.raises(StoreUnavailableError, match=rf"^{proxy.endpoint} did not answer"):
        states.put("solver/published", tensors(0), at=Url())


def test_a_commit_from_another_host_is_seen_after_a_listing(moto_endpoint: str) -> None:
    """Two handles with their own S3 clients (two hosts): what one commits after the other
    listed the table is found by the other's next lookup, and listed by its next listing."""
    from storage.schema import SegmentKey
    from storage.store import MEGStore
    from storage.testing import synthetic_batch

    url = f"s3://{new_bucket(moto_endpoint)}/store"
    here = MEGStore.open(url, "run", storage_options=s3_options(moto_endpoint))
    there_options = {**s3_options(moto_endpoint), "skip_instance_cache": True}
    there = MEGStore.open(url, "run", create=False, storage_options=there_options)
    assert there.backend.fs is not here.backend.fs  # type: ignore[attr-defined]
    key0, key1 = SegmentKey(0, 0, "solve"), SegmentKey(0, 1, "solve")
    here.table("solver").write_segment(key0, synthetic_batch(key0, seed=0))
    assert [s.segment_id for s in there.table("solver").segments()] == [key0.id]
    here.table("solver").write_segment(key1, synthetic_batch(key1, seed=1))  # after the listing
    assert there.table("solver").has_segment(key1) is not None
    assert len(there.table("solver").segments()) == 2


def test_a_checkpoint_from_another_host_is_the_latest(s3_env: Proxy, moto_endpoint: str) -> None:
    root = f"s3://{new_bucket(moto_endpoint)}/run/_checkpoints/solver"
    save_state(f"{root}/v000001", tensors(1), {"version": 1})
    assert latest_checkpoint(root) == f"{root}/v000001"  # this process listed the root
    import fsspec

    other = fsspec.filesystem("s3", skip_instance_cache=True)  # another host's client
    other.copy(f"{root[5:]}/v000001", f"{root[5:]}/v000002", recursive=True)
    assert latest_checkpoint(root) == f"{root}/v000002"
