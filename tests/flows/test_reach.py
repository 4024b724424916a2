"""What the workers of a foreign cluster must find on their own disks (flows/cluster/reach.py)."""

from __future__ import annotations

from flows.cluster.reach import _missing, local_paths
from meg.spec import MEGSpec


def test_local_paths_are_the_non_urls() -> None:
    spec = MEGSpec.model_validate(
        {
            "name": "t",
            "agents": {
                "a": {"model": "/models/a", "tokenizer": "hf://org/tok"},
                "b": {"model": "s3://bucket/models/b"},
                "c": {"model": "file:///models/c"},
            },
            "nodes": {"x": {"agent": "a", "template": "{question}"}},
        }
    )
    assert local_paths(spec, "s3://bucket/store") == {
        "model of agent 'a'": "/models/a",
        "model of agent 'c'": "/models/c",
    }
    assert local_paths(spec, "file:///runs/r/store")["MEG Store folder"] == "/runs/r/store"
    assert "MEG Store folder" not in local_paths(spec, None)


def test_missing_is_what_does_not_exist(tmp_path: object) -> None:
    assert _missing({"here": str(tmp_path), "gone": f"{tmp_path}/nope"}) == {
        "gone": f"{tmp_path}/nope"
    }
