"""The Ray Serve application behind a deployment: a checkpoint's model and its workload's predictor.

The control plane never imports this module: it names it in the Serve config it sends through the
dashboard (``import_path: workers.serve.app:build_app``), and Serve builds the application on the
cluster from the config's ``args``::

    {"checkpoint_path": ..., "workload": "digits", "config": {...the job's workload config...},
     "deployment": "<name>"}

Those args are Serve's *code version*: a new checkpoint restarts the replicas (rolled, old ones
serving until new ones are healthy). Everything that may change without reloading the model comes
through ``user_config`` (``reconfigure``): the deployment's version number, the batching settings,
the torch thread count, and who may call it: ``auth`` (``"project"``: a key of the deployment's project
in ``Authorization: Bearer``; ``"none"``: anyone who reaches Serve's port), ``key_hashes`` (the SHA-256
hex digests of the project's valid keys, never the keys: the control plane re-applies the config when
they change, so a revoked key stops working without a restart) and ``max_body_mb`` (a larger body is a
413 before it is parsed). The replica never reaches the database.

A predictor (the one a workload's descriptor names, beside its model: ``workers.workloads.digits:DigitsPredictor``,
``workers.workloads.tiny_gpt:TinyGptPredictor``; ``TensorPredictor`` of ``workers.serve.predictors`` for a custom
workload whose samples are feature vectors) holds the workload-specific part: checking a
request body (a bad one is a 4xx that says what is expected, never a 500), running a batch, and a
probe for the health check. It has no Ray in it, so ``bench/serve.py`` serves the very same predictor
from a plain FastAPI app, and unit tests call it directly.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, get_args

import torch
from torch import nn

from orchestrator_contract import workloads
from orchestrator_contract.checkpoints import MODEL_FILE, SERVE_MODULE_FILE
from orchestrator_contract.deployments import SERVE_DEPLOYMENT_NAME, Auth
from workers.serve.predictors import BadInput, TensorPredictor

DEFAULT_MAX_BODY_MB = 1.0
AUTH_MODES: tuple[str, ...] = get_args(Auth)  # ("project", "none"): the deployment spec's


SERVE_MODULE = SERVE_MODULE_FILE.removesuffix(".py")


# --- loading --------------------------------------------------------------------------------------


def load_serving_model(checkpoint_path: str, workload: str, config: dict) -> nn.Module:
    """The workload's model with the checkpoint's full state dict, in eval mode.

    Tensors only: ``model.pt`` with ``torch.load(weights_only=True)`` (``load_model_from_checkpoint``). Every
    checkpoint carries it (FSDP's is gathered by the training run at save time); one with only FSDP shards
    is refused with how to make it servable, and ``sharded/`` is never opened here: DCP reads its
    ``.metadata`` with pickle, and storage is writable from the cluster (docs/security.md, finding 5).
    """
    from workers.train.checkpoints import load_model_from_checkpoint

    return load_model_from_checkpoint(checkpoint_path, workload, config)


class HookPredictor:
    """A training function's model answered by its code's ``serve.predict(model, payload) -> JSON``; a
    ValueError it raises is the caller's 422 with its message."""

    def __init__(self, model: nn.Module, predict: Any):
        self.model, self._predict = model, predict
        doc = (getattr(predict, "__doc__", None) or "").strip()
        self.expected = {"body": doc.splitlines()[0] if doc else "what serve.py's predict(model, payload) takes"}

    def parse(self, body: Any) -> Any:
        # The hook checks and answers in one: its ValueError is a bad request, so it runs where those are caught.
        try:
            with torch.no_grad():
                answer = self._predict(self.model, body)
            json.dumps(answer)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise BadInput(f"{type(exc).__name__}: {exc}") from None
        return answer

    def predict(self, items: list[Any]) -> list[dict]:
        return [item if isinstance(item, dict) else {"prediction": item} for item in items]

    def probe(self) -> None:
        next(self.model.parameters(), None)  # loaded; what a valid input is, only serve.py knows


def load_hook_predictor(checkpoint_path: str) -> HookPredictor:
    """``model.pt`` of a training function's checkpoint and ``serve.predict`` from its code (the replica's
    working directory).

    With ``serve.build_model()`` in the code, ``model.pt`` is the model's state dict, loaded with
    ``weights_only=True`` into the module ``build_model`` returns: tensors only, as for a workload. Without it,
    ``model.pt`` is the whole pickled module (``weights_only=False``): the project's own code, run in the
    project's own replica, which runs ``serve.py`` anyway; but a ``model.pt`` that other code on the cluster
    wrote into the run's folder would run there too (docs/security.md, finding 5)."""
    import importlib

    from ray.train import Checkpoint

    from workers.train.checkpoints import load_tensors

    module = importlib.import_module(SERVE_MODULE)
    predict = getattr(module, "predict", None)
    if not callable(predict):
        raise ValueError(f"{SERVE_MODULE}.py has no function predict(model, payload)")
    build_model = getattr(module, "build_model", None)
    with Checkpoint(checkpoint_path).as_directory() as local_dir:
        path = Path(local_dir) / MODEL_FILE
        if not path.is_file():
            what = "model.state_dict()" if callable(build_model) else "torch.save(model)"
            raise ValueError(f"checkpoint {checkpoint_path} has no {MODEL_FILE}: save {what} from rank 0")
        if callable(build_model):
            model = build_model()
            if isinstance(model, nn.Module):
                model.load_state_dict(load_tensors(path, checkpoint_path))
        else:
            model = torch.load(path, weights_only=False, map_location="cpu")
    if not isinstance(model, nn.Module):
        if callable(build_model):
            raise ValueError(f"{SERVE_MODULE}.build_model() returns a {type(model).__name__}, not a torch.nn.Module")
        raise ValueError(f"{MODEL_FILE} holds a {type(model).__name__}, not a torch.nn.Module: save the whole model")
    return HookPredictor(model.eval(), predict)


def check_servable(workload: str) -> None:
    if not workloads.is_servable(workload):
        raise ValueError(
            f"serving supports the workloads {workloads.servable_names()} and custom ones, not {workload!r}"
        )


def make_predictor(workload: str, model: nn.Module, config: dict):
    """The predictor the workload's descriptor names; rows of numbers (``TensorPredictor``) without one."""
    check_servable(workload)
    predictor = workloads.resolve(workload).load_predictor()
    if predictor is None:
        return TensorPredictor(model, config, workload)
    return predictor(model, config)


# --- the Serve deployment ---------------------------------------------------------------------------

from ray import serve  # noqa: E402  (after the Ray-free part, which the bench and tests use alone)
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402


def _error(status: int, message: str, expected: dict) -> JSONResponse:
    return JSONResponse({"detail": message, "expected": expected}, status_code=status)


class _Refused(Exception):
    def __init__(self, response: JSONResponse):
        self.response = response


def bearer_hash(request: Request) -> str | None:
    """SHA-256 hex of the ``Authorization: Bearer`` token (the form the control plane stores), or None."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return hashlib.sha256(token.encode()).hexdigest()


async def read_capped(request: Request, limit: int) -> bytes:
    """The body, or _Refused(413) as soon as it is known to pass ``limit`` bytes: a ``Content-Length``
    over it before a byte is read, a chunked body as soon as what arrived passes it."""

    def too_large() -> _Refused:
        mb = limit / 1_000_000
        return _Refused(
            JSONResponse(
                {"detail": f"the request body is over this deployment's max_body_mb ({mb:g} MB)"}, status_code=413
            )
        )

    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise too_large()
        except ValueError:
            raise _Refused(JSONResponse({"detail": "Content-Length is not a number"}, status_code=400)) from None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large()
        chunks.append(chunk)
    return b"".join(chunks)


@serve.deployment(name=SERVE_DEPLOYMENT_NAME)
class ModelServer:
    """One replica: the model loaded once, requests checked, then predicted alone or in batches."""

    def __init__(
        self, checkpoint_path: str, workload: str, config: dict, deployment: str = "", serve_hook: bool = False
    ):
        self.deployment = deployment
        self.workload = workload
        self.checkpoint_path = checkpoint_path
        self.version = 0
        self.batching = False
        # Closed until the control plane's user_config says otherwise (Serve applies it before traffic).
        self.auth = "project"
        self.key_hashes: frozenset[str] = frozenset()
        self.max_body_bytes = int(DEFAULT_MAX_BODY_MB * 1_000_000)
        torch.set_num_threads(1)
        if serve_hook:  # a training function's model, with its code's serve.py
            self.predictor = load_hook_predictor(checkpoint_path)
            return
        check_servable(workload)
        model = load_serving_model(checkpoint_path, workload, config)
        if torch.cuda.is_available():  # Ray shows a replica only the GPUs its resources.gpus gave it
            model = model.cuda()
        self.predictor = make_predictor(workload, model, config)
        self.predictor.probe()  # a model that can't answer never becomes a healthy replica

    def reconfigure(self, user_config: dict) -> None:
        """The lightweight settings (no reload): version number, batching, torch threads, auth, body cap."""
        self.version = int(user_config.get("version", 0))
        auth = user_config.get("auth", "project")
        if auth not in AUTH_MODES:
            raise ValueError(f"auth must be one of {AUTH_MODES}, not {auth!r}")
        self.auth = auth
        self.key_hashes = frozenset(str(h) for h in user_config.get("key_hashes") or ())
        self.max_body_bytes = int(float(user_config.get("max_body_mb", DEFAULT_MAX_BODY_MB)) * 1_000_000)
        max_batch_size = int(user_config.get("max_batch_size", 1))
        self.batching = max_batch_size > 1
        if self.batching:
            self._batched.set_max_batch_size(max_batch_size)
            self._batched.set_batch_wait_timeout_s(float(user_config.get("batch_wait_timeout_s", 0.0)))
        torch.set_num_threads(max(1, int(user_config.get("threads", 1))))

    def describe(self) -> dict:
        return {
            "deployment": self.deployment,
            "version": self.version,
            "workload": self.workload,
            "checkpoint": self.checkpoint_path,
            "expected": self.predictor.expected,
        }

    def _unauthorized(self, request: Request) -> JSONResponse | None:
        """None when the caller may use this deployment; else the 401 to send."""
        if self.auth == "none":
            return None
        presented = bearer_hash(request)
        if presented is not None and presented in self.key_hashes:
            return None
        detail = (
            "this deployment needs a key of its project: send Authorization: Bearer <key>"
            if presented is None
            else "this key is not valid for this deployment (unknown, revoked, expired or of another project)"
        )
        return JSONResponse({"detail": detail}, status_code=401, headers={"WWW-Authenticate": "Bearer"})

    async def __call__(self, request: Request):
        if (refused := self._unauthorized(request)) is not None:
            return refused
        if request.method == "GET":
            return JSONResponse(self.describe())
        if request.method != "POST":
            return _error(405, f"{request.method} is not supported: POST a JSON body", self.predictor.expected)
        try:
            raw = await read_capped(request, self.max_body_bytes)
        except _Refused as refused_body:
            return refused_body.response
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            return _error(400, f"the body is not JSON: {exc}", self.predictor.expected)
        try:
            item = self.predictor.parse(body)
        except BadInput as exc:
            return _error(422, str(exc), self.predictor.expected)
        answer = await self._batched(item) if self.batching else self.predictor.predict([item])[0]
        return JSONResponse({**answer, "version": self.version, "deployment": self.deployment})

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.002)
    async def _batched(self, items: list) -> list[dict]:
        return self.predictor.predict(items)

    def check_health(self) -> None:
        self.predictor.probe()


def build_app(args: dict) -> serve.Application:
    """Serve's application builder (the config's ``import_path``); ``args`` as the module doc says."""
    return ModelServer.bind(
        args["checkpoint_path"],
        args["workload"],
        args.get("config") or {},
        args.get("deployment", ""),
        bool(args.get("serve_hook")),
    )
