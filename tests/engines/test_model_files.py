"""Models named by URL (engines/model_files.py): pushed once, fetched once per host into the
model cache, a replaced model a new folder, a half-download never visible; on a real S3
server (moto) and on memory://."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from engines.model_files import ModelFetchError, fetch, is_remote, local_dir, push


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEXMARL_MODEL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def moto_s3_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A moto S3 server reached through the environment, as a cluster's hosts reach it."""
    from tests.storage.conftest import moto_server

    with moto_server() as (_, endpoint):
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        yield endpoint


def model(tmp_path: Path) -> Path:
    d = tmp_path / "m"
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text('{"model_type": "llama"}')
    (d / "model.safetensors").write_bytes(b"\x00" * 1000)
    (d / "sub" / "tokenizer.json").write_text("{}")
    return d


def test_which_paths_are_fetched() -> None:
    assert is_remote("s3://b/models/x") and is_remote("memory://m/x")
    assert not is_remote("models/tiny") and not is_remote("/abs/x")
    assert not is_remote("hf://org/name") and not is_remote("file:///abs/x")
    assert local_dir("hf://org/name") == "org/name" and local_dir("models/x") == "models/x"
    assert local_dir("file:///abs/x") == "/abs/x"


def test_push_then_fetch_once(tmp_path: Path, cache: Path) -> None:
    url = f"memory://models-{uuid.uuid4().hex[:8]}/tiny"
    assert push(model(tmp_path), url) == 3
    got = fetch(url)
    assert got.parent == cache and got.name.startswith("tiny-")
    assert (got / "sub" / "tokenizer.json").read_text() == "{}"
    assert (got / "model.safetensors").stat().st_size == 1000
    assert fetch(url) == got  # the second time: the cached folder
    assert not [p for p in cache.iterdir() if p.name.endswith(".partial")]


def test_a_replaced_model_is_a_new_folder(tmp_path: Path, cache: Path) -> None:
    url = f"memory://models-{uuid.uuid4().hex[:8]}/tiny"
    push(model(tmp_path), url)
    first = fetch(url)
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\x01" * 2000)
    push(tmp_path / "m", url)
    second = fetch(url)
    assert second != first and (second / "model.safetensors").read_bytes() == b"\x01" * 2000
    assert (first / "model.safetensors").read_bytes() == b"\x00" * 1000  # never mixed


def test_racing_fetches_agree(tmp_path: Path, cache: Path) -> None:
    url = f"memory://models-{uuid.uuid4().hex[:8]}/tiny"
    push(model(tmp_path), url)
    out: list[Path] = []
    threads = [threading.Thread(target=lambda: out.append(fetch(url))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(out)) == 1 and (out[0] / "sub" / "tokenizer.json").is_file()
    assert [p.name for p in cache.iterdir()] == [out[0].name]  # partial folders removed


def test_what_is_not_a_model_is_named(tmp_path: Path, cache: Path) -> None:
    with pytest.raises(ModelFetchError, match=r"no config\.json"):
        push(tmp_path, "memory://x/y")
    url = f"memory://models-{uuid.uuid4().hex[:8]}/empty"
    with pytest.raises(ModelFetchError, match=rf"{url} holds no HF model"):
        fetch(url)


def test_a_model_on_s3(tmp_path: Path, cache: Path, moto_s3_env: str) -> None:
    from tests.storage.conftest import new_bucket

    url = f"s3://{new_bucket(moto_s3_env)}/models/tiny"
    push(model(tmp_path), url)
    got = Path(local_dir(url))
    assert (got / "config.json").read_text() == '{"model_type": "llama"}'
