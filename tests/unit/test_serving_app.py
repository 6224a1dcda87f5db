"""The Serve application's model code without Ray: loading checkpoints, the predictors' input checks,
and the replica's answers to HTTP requests (4xx with what is expected, never a 500, for a bad body)."""

from __future__ import annotations

import json
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp
from starlette.requests import Request
from starlette.testclient import TestClient

from workers.serve.app import ModelServer, load_serving_model
from workers.serve.predictors import MAX_ROWS, BadInput
from workers.workloads import digits, tiny_gpt
from workers.workloads.digits import DigitsPredictor
from workers.workloads.tiny_gpt import TinyGptPredictor

DIGITS_CONFIG = {"hidden": 16, "batchnorm": False, "val_fraction": 0.2}
GPT_CONFIG = {"text_path": "unused.txt", "context": 8, "layers": 1, "width": 16, "heads": 2}


@pytest.fixture
def digits_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = digits.build(DIGITS_CONFIG, 0).model  # standardization fitted on the train split
    folder = tmp_path / "checkpoint_000001"
    folder.mkdir()
    torch.save(model.state_dict(), folder / "model.pt")
    return str(folder), model.eval()


def test_a_ddp_checkpoint_loads_with_its_preprocessing(digits_checkpoint):
    path, model = digits_checkpoint
    loaded = load_serving_model(path, "digits", DIGITS_CONFIG)
    x = torch.rand(4, 64) * 16
    assert torch.equal(loaded(x), model(x)) and not loaded.training


def test_a_checkpoint_with_only_fsdp_shards_is_refused_until_the_export_command_writes_model_pt(tmp_path, capsys):
    """Saved before FSDP checkpoints carried model.pt: the replica refuses it (it never opens sharded/), and
    ``python -m workers.train.export_full`` makes it servable, listed in rank 0's manifest."""
    from workers.runtime.manifest import verify_checkpoint, write_manifest
    from workers.train.export_full import main as export_full

    torch.manual_seed(0)
    model = tiny_gpt.build_model(GPT_CONFIG).eval()
    folder = tmp_path / "checkpoint_000002"
    dcp.save({"model": model.state_dict(), "optimizer": {}}, checkpoint_id=folder / "sharded")  # no process group
    write_manifest(folder, rank=0, world_size=1)
    with pytest.raises(ValueError, match="only FSDP shards") as refused:
        load_serving_model(str(folder), "tiny_gpt", GPT_CONFIG)
    assert f"python -m workers.train.export_full {folder}" in str(refused.value)

    assert export_full([str(folder)]) == 0
    assert "wrote" in capsys.readouterr().out
    verified = verify_checkpoint(folder)
    assert verified and "model.pt" in json.loads((folder / "manifests" / "rank-00000.json").read_text())["files"]
    loaded = load_serving_model(str(folder), "tiny_gpt", GPT_CONFIG)
    tokens = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(loaded(tokens), model(tokens))
    assert export_full([str(folder)]) == 0 and "nothing to do" in capsys.readouterr().out


def test_the_export_command_refuses_a_checkpoint_whose_files_do_not_match_its_manifest(tmp_path, capsys):
    from workers.runtime.manifest import write_manifest
    from workers.train.export_full import main as export_full

    folder = tmp_path / "checkpoint_000003"
    dcp.save({"model": digits.build_model(DIGITS_CONFIG).state_dict()}, checkpoint_id=folder / "sharded")
    write_manifest(folder, rank=0, world_size=1)
    (folder / "sharded" / "__0_0.distcp").write_bytes(b"cut short")
    assert export_full([str(folder)]) == 1
    assert "not a whole checkpoint" in capsys.readouterr().err and not (folder / "model.pt").exists()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ([], "must be a JSON object"),
        ({}, "missing key 'inputs'"),
        ({"inputs": [[0] * 64], "extra": 1}, "unknown key 'extra'"),
        ({"inputs": "pixels"}, "must be a list of rows"),
        ({"inputs": []}, "is empty"),
        ({"inputs": [[0] * 64] * (MAX_ROWS + 1)}, f"at most {MAX_ROWS} per request"),
        ({"inputs": [[0] * 63]}, "inputs[0] has 63 values: each row must be 64 pixel values"),
        ({"inputs": [[0] * 64, 7]}, "inputs[1] has int"),
        ({"inputs": [["a"] * 64]}, 'inputs[0][0] is "a": expected a number'),
        ({"inputs": [[True] * 64]}, "expected a number"),
        ({"inputs": [[0] * 63 + [17]]}, "inputs[0][63] is 17: values are from 0 to 16"),
        ({"inputs": [[0] * 63 + [float("nan")]]}, "not a finite number"),
    ],
)
def test_digits_inputs_are_checked(body, words):
    predictor = DigitsPredictor(digits.build_model(DIGITS_CONFIG), DIGITS_CONFIG)
    with pytest.raises(BadInput) as error:
        predictor.parse(body)
    assert words in str(error.value)


def test_digits_batches_answer_each_request_with_its_own_rows(digits_checkpoint):
    _, model = digits_checkpoint
    predictor = DigitsPredictor(model, DIGITS_CONFIG)
    a = predictor.parse({"inputs": [[float(i % 17) for i in range(64)]]})
    b = predictor.parse({"inputs": [[16.0] * 64, [0.0] * 64]})
    together = predictor.predict([a, b])
    alone = [predictor.predict([a])[0], predictor.predict([b])[0]]
    assert [len(answer["predictions"]) for answer in together] == [1, 2]
    for joint, single in zip(together, alone, strict=True):
        assert joint["predictions"] == single["predictions"]
        assert torch.allclose(torch.tensor(joint["probabilities"]), torch.tensor(single["probabilities"]), atol=1e-6)
    assert sum(together[1]["probabilities"][0]) == pytest.approx(1.0)
    expected = model(torch.tensor([[16.0] * 64, [0.0] * 64])).argmax(dim=1).tolist()
    assert together[1]["predictions"] == expected


def test_tiny_gpt_generates_text_from_a_prompt():
    torch.manual_seed(0)
    predictor = TinyGptPredictor(tiny_gpt.build_model(GPT_CONFIG).eval(), GPT_CONFIG)
    item = predictor.parse({"prompt": "hello world, a prompt longer than the context", "max_new_tokens": 5})
    [answer] = predictor.predict([item])
    assert answer["tokens"] == 5 and isinstance(answer["text"], str)
    assert predictor.predict([item]) == [answer]  # greedy: the same every time
    sampled = predictor.parse({"prompt": "hi", "max_new_tokens": 3, "temperature": 1.0, "seed": 7})
    assert predictor.predict([sampled]) == predictor.predict([sampled])  # seeded
    for body, words in [
        ({"prompt": ""}, "non-empty string"),
        ({"prompt": 3}, "non-empty string"),
        ({}, "missing key 'prompt'"),
        ({"prompt": "x", "max_new_tokens": 0}, "max_new_tokens"),
        ({"prompt": "x", "temperature": -1}, "temperature"),
        ({"prompt": "x" * 5000}, "at most 4096"),
        ({"prompt": "x", "top_k": 3}, "unknown key 'top_k'"),
    ]:
        with pytest.raises(BadInput, match=words):
            predictor.parse(body)


def over_http(replica) -> TestClient:
    """An HTTP client of ``replica`` as Serve's proxy hands it requests (a deployment without an ingress):
    each request as a Starlette ``Request`` to ``__call__``, whose ``Response`` is sent back as it is.
    Requests go through an HTTP client (httpx) and the ASGI interface; no Ray, no socket."""

    async def asgi(scope, receive, send):
        response = await replica(Request(scope, receive))
        await response(scope, receive, send)

    return TestClient(asgi, follow_redirects=False)


def test_the_replica_answers_over_http_and_bad_bodies_are_4xx(digits_checkpoint):
    path, model = digits_checkpoint
    replica = ModelServer.func_or_class(path, "digits", DIGITS_CONFIG, deployment="digits")
    # Unbatched: @serve.batch needs a running replica (batching is covered on Ray: integration test, bench).
    replica.reconfigure({"version": 3, "max_batch_size": 1, "batch_wait_timeout_s": 0.0, "threads": 1, "auth": "none"})
    http = over_http(replica)

    def call(method: str, body: bytes = b"") -> tuple[int, dict]:
        response = http.request(method, "/digits", content=body, headers={"content-type": "application/json"})
        assert response.headers.get("content-type") == "application/json", response.headers
        return response.status_code, response.json()

    row = [float(i % 17) for i in range(64)]
    status, answer = call("POST", json.dumps({"inputs": [row]}).encode())
    assert status == 200 and answer["version"] == 3 and answer["deployment"] == "digits"
    assert answer["predictions"] == model(torch.tensor([row])).argmax(dim=1).tolist()
    status, answer = call("POST", b'{"inputs": []}')
    assert status == 422 and "is empty" in answer["detail"] and "64 numbers" in answer["expected"]["inputs"]
    assert call("POST", b"{not json")[0] == 400
    assert call("PUT", b"{}")[0] == 405
    status, described = call("GET")
    assert status == 200 and described["version"] == 3 and described["workload"] == "digits"
    replica.check_health()


def test_a_checkpoint_that_does_not_load_fails_the_replica(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"garbage")
    # torch.load(weights_only=True) refuses bytes that are no checkpoint: the replica never starts.
    with pytest.raises(ValueError, match="model.pt is not a state dict of tensors"):
        ModelServer.func_or_class(str(folder), "digits", DIGITS_CONFIG)
    with pytest.raises(ValueError, match="serving supports"):
        ModelServer.func_or_class(str(folder), "spirals", {})


def test_a_custom_workload_serves_rows_as_wide_as_its_samples(tmp_path):
    from example_workloads.spirals import build

    torch.manual_seed(0)
    model = build({"points": 40}, 0).model
    folder = tmp_path / "checkpoint_000003"
    folder.mkdir()
    torch.save(model.state_dict(), folder / "model.pt")
    replica = ModelServer.func_or_class(str(folder), "example_workloads.spirals:build", {"points": 40})
    assert replica.predictor.features == 2 and "2 finite numbers" in replica.predictor.expected["inputs"]
    [answer] = replica.predictor.predict([replica.predictor.parse({"inputs": [[0.1, -5.0]]})])
    assert answer["predictions"] == model(torch.tensor([[0.1, -5.0]])).argmax(dim=1).tolist()
    with pytest.raises(BadInput, match="each row must be 2 numbers"):
        replica.predictor.parse({"inputs": [[0.1, 0.2, 0.3]]})


SERVE_PY_WITH_BUILD_MODEL = '''
import torch

def build_model():
    return torch.nn.Linear(2, 2)

def predict(model, payload):
    """{"x": [a, b]}"""
    return {"y": model(torch.tensor([payload["x"]], dtype=torch.float32))[0].tolist()}
'''


@pytest.fixture
def serve_py_with_build_model(tmp_path, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    (code / "serve.py").write_text(SERVE_PY_WITH_BUILD_MODEL)
    monkeypatch.syspath_prepend(str(code))  # the replica's working directory: the job's code
    yield
    sys.modules.pop("serve", None)


def test_a_training_functions_build_model_has_model_pt_loaded_as_tensors_only(serve_py_with_build_model, tmp_path):
    from workers.serve.app import load_hook_predictor

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    folder = tmp_path / "checkpoint_000001"
    folder.mkdir()
    torch.save(model.state_dict(), folder / "model.pt")
    predictor = load_hook_predictor(str(folder))
    answer = predictor.parse({"x": [1.0, 2.0]})
    assert answer == {"y": model(torch.tensor([[1.0, 2.0]]))[0].tolist()}

    marker = tmp_path / "marker"
    torch.save(model, folder / "model.pt")  # a whole pickled module: refused, not unpickled
    with pytest.raises(ValueError, match="not a state dict of tensors"):
        load_hook_predictor(str(folder))
    (folder / "model.pt").write_bytes(pickle_payload(marker))
    with pytest.raises(ValueError, match="not a state dict of tensors"):
        load_hook_predictor(str(folder))
    assert not marker.exists()


def pickle_payload(marker) -> bytes:
    """A pickle that, loaded without weights_only, creates ``marker``."""
    import pickle

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    return pickle.dumps(Payload())
