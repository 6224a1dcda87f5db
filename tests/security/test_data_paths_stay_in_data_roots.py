"""Hole 1: a training input could name any file on the Ray nodes (tiny_gpt's text_path: /etc/passwd,
/proc/self/environ, the Ray token, /dev/zero). Now a data path must resolve, links followed, inside a data
root (<storage>/data and ORCHESTRATOR_DATA_ROOTS), be a regular file under ORCHESTRATOR_DATA_MAX_MB; anything
else is a 422 at submit naming the field and the roots, and saying nothing of the file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.api_helpers import ADMIN, auth
from tests.unit.test_sweeps import BASE

GPT = {"context": 8, "layers": 1, "width": 16, "heads": 2}


@pytest.fixture
def settings_overrides() -> dict:
    return {"data_max_mb": 0.01}  # 10 KiB


def submit(client, text_path: str):
    return client.post(
        "/v1/jobs",
        json={"workload": "tiny_gpt", "config": {"text_path": text_path, **GPT}, "epochs": 1},
        headers=auth(ADMIN),
    )


def data_root(app) -> Path:
    root = Path(app.state.service.settings.storage_path) / "data"
    root.mkdir(parents=True, exist_ok=True)
    return root


def refused(response, *words: str) -> str:
    assert response.status_code == 422, response.text
    (detail,) = response.json()["detail"]
    assert detail["loc"][-1] in ("text_path", "values"), detail
    for word in words:
        assert word in detail["msg"], detail
    return detail["msg"]


def test_files_outside_the_data_roots_are_refused_at_submit(app, client):
    root = data_root(app)
    for path in ("/etc/passwd", "/proc/self/environ", "/dev/zero", f"{root}/../../var/ray_token", "../escape.txt"):
        message = refused(submit(client, path), "is not inside a data root", str(root), "ORCHESTRATOR_DATA_ROOTS")
        assert "root:" not in message  # nothing of the file
    os.symlink("/etc/passwd", root / "passwd")  # a link inside the root to a file outside it
    refused(submit(client, str(root / "passwd")), "is not inside a data root")
    refused(submit(client, "passwd"), "is not inside a data root")
    assert client.get("/v1/jobs", headers=auth(ADMIN)).json()["items"] == []  # nothing stored


def test_inside_the_roots_only_regular_files_under_the_cap(app, client):
    root = data_root(app)
    (root / "folder").mkdir()
    os.mkfifo(root / "fifo")  # opened, it would block a worker forever
    (root / "big.txt").write_bytes(b"x" * 20_000)
    refused(submit(client, "folder"), "is not a regular file")
    refused(submit(client, "fifo"), "is not a regular file")
    refused(submit(client, "big.txt"), "20000 bytes, over the 10485-byte cap", "ORCHESTRATOR_DATA_MAX_MB")
    refused(submit(client, "missing.txt"), "does not exist")


def test_a_good_path_is_stored_resolved(app, client):
    root = data_root(app)
    (root / "corpus.txt").write_text("hello world\n" * 10)
    os.symlink(root / "corpus.txt", root / "latest.txt")
    for given in ("corpus.txt", str(root / "latest.txt")):
        response = submit(client, given)
        assert response.status_code == 201, response.text
        assert response.json()["spec"]["config"]["text_path"] == str((root / "corpus.txt").resolve())


def test_a_sweep_may_not_search_over_files_outside_the_roots(app, client):
    root = data_root(app)
    (root / "corpus.txt").write_text("hello world\n" * 10)
    base = {
        **BASE,
        "workload": "tiny_gpt",
        "config": {"text_path": "corpus.txt", **GPT},
        "scaling": {"num_workers": 1, "cpus_per_worker": 0.5},
    }
    space = {"config.text_path": {"type": "choice", "values": ["corpus.txt", "/etc/passwd"]}}
    response = client.post("/v1/sweeps", json={"base": base, "search_space": space}, headers=auth(ADMIN))
    refused(response, "'/etc/passwd' is not inside a data root")
    bad_base = {**base, "config": {**base["config"], "text_path": "/etc/shadow"}}
    response = client.post(
        "/v1/sweeps",
        json={"base": bad_base, "search_space": {"lr.base": {"type": "choice", "values": [0.1]}}},
        headers=auth(ADMIN),
    )
    assert response.status_code == 422 and response.json()["detail"][0]["loc"][:3] == ["body", "base", "config"], (
        response.text
    )
    ok = client.post(
        "/v1/sweeps",
        json={"base": base, "search_space": {"config.text_path": {"type": "choice", "values": ["corpus.txt"]}}},
        headers=auth(ADMIN),
    )
    assert ok.status_code == 201, ok.text
    assert ok.json()["spec"]["search_space"]["config.text_path"]["values"] == [str((root / "corpus.txt").resolve())]
    assert ok.json()["spec"]["base"]["config"]["text_path"] == str((root / "corpus.txt").resolve())


def sweep(client, search_space: dict, algorithm: str = "random"):
    base = {
        **BASE,
        "workload": "tiny_gpt",
        "config": {"text_path": "corpus.txt", **GPT},
        "scaling": {"num_workers": 1, "cpus_per_worker": 0.5},
    }
    return client.post(
        "/v1/sweeps",
        json={"base": base, "search_space": search_space, "algorithm": algorithm},
        headers=auth(ADMIN),
    )


def test_a_sweep_cannot_reach_a_file_through_a_whole_config_value(app, client):
    """On the old code a search over the whole ``config`` (a choice or grid of dicts) passed: only keys named
    ``config.<field>`` were pinned, so a trial could read /etc/passwd (201). Now every value a trial can receive goes
    through the job spec's own check, wherever the path is nested
    (docs/security.md, "Every value a sweep's trial can receive")."""
    root = data_root(app)
    (root / "corpus.txt").write_text("hello world\n" * 10)
    reproduction = {"config": {"type": "choice", "values": [{"text_path": "/etc/passwd"}]}}
    refused(
        sweep(client, reproduction), "'/etc/passwd' is not inside a data root", str(root), "ORCHESTRATOR_DATA_ROOTS"
    )
    # Nested among good values, in a grid, the bad one a link out of the root.
    os.symlink("/etc/passwd", root / "passwd")
    nested = {
        "config": {"type": "grid", "values": [{"text_path": "corpus.txt", **GPT}, {"text_path": "passwd", **GPT}]}
    }
    refused(sweep(client, nested, algorithm="grid"), "'passwd' is not inside a data root")
    both = {
        "config.context": {"type": "choice", "values": [8, 16]},
        "config": {"type": "choice", "values": [{"text_path": "corpus.txt", **GPT}, {"text_path": "../../x", **GPT}]},
    }
    refused(sweep(client, both), "'../../x' is not inside a data root")
    assert client.get("/v1/sweeps", headers=auth(ADMIN)).json() == []  # nothing stored


def test_a_whole_config_value_inside_a_data_root_is_stored_resolved(app, client):
    root = data_root(app)
    (root / "corpus.txt").write_text("hello world\n" * 10)
    os.symlink(root / "corpus.txt", root / "latest.txt")
    space = {"config": {"type": "choice", "values": [{"text_path": "latest.txt", **GPT}, {"text_path": "corpus.txt"}]}}
    response = sweep(client, space)
    assert response.status_code == 201, response.text
    resolved = str((root / "corpus.txt").resolve())
    # Only the path is rewritten: the rest of each value stays as the user sent it.
    assert response.json()["spec"]["search_space"]["config"]["values"] == [
        {"text_path": resolved, **GPT},
        {"text_path": resolved},
    ]
