"""Telling an error in the job's own code from a bug in ours, on the worker, where the frames are.

The job's own code is its uploaded package (Ray's ``working_dir``: the worker's current directory, where
Ray started it) and, for a ``"package.module:function"`` workload, that workload's top-level package (or
module). An exception that leaves the training function is marked here, by an attribute on the exception
itself: Ray Train pickles the exception to its controller and to the driver, and an exception's ``__dict__``
travels with it while its traceback (a frame list) does not. ``workers.train.failures`` reads the mark:

    LOADING  loading the workload failed: the module or function is missing (``resolve``'s ValueError),
             an ImportError (a module it imports is not installed) or a SyntaxError. Never retried: the
             same code cannot load on a retry.
    RAISED   a frame of the traceback (or of an exception it was raised from) lies in the job's own code.
             Retried only when the spec sets ``retries.retry_app_errors``, like an ``app_error``.

An exception with no frame in the job's code is ours (the loop, the platform) and stays unmarked.
Out-of-memory and a broken collective are still classified as such first, wherever they were raised.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator_contract.workloads import is_custom_workload, load_entrypoint, resolve

MARK = "orchestrator_code_error"  # the attribute: (LOADING | RAISED, "file, line N, in function")
LOADING, RAISED = "loading", "raised"
OUR_PACKAGES = frozenset({"workers"})  # a custom workload name may point into these; they stay ours


def code_error_of(exc: BaseException) -> tuple[str, str] | None:
    """(LOADING or RAISED, where) when ``exc`` was marked as the job's own code's; else None."""
    mark = getattr(exc, MARK, None)
    return mark if isinstance(mark, tuple) and len(mark) == 2 else None


def blame_user_code(train_fn: Callable[[dict], Any]) -> Callable[[dict], Any]:
    """``train_fn(config)`` (a ``TorchTrainer`` entry point), with the exceptions that leave it marked."""

    @functools.wraps(train_fn)
    def train(config: dict) -> Any:
        spec = config.get("spec") or {}
        roots = [os.getcwd()] if spec.get("code") else []  # Ray starts the worker in the package's folder
        workload, entrypoint = spec.get("workload") or "", spec.get("entrypoint") or ""
        with user_code_errors(roots):  # reads ``roots`` when something is raised: a package's are added below
            if is_custom_workload(workload) or entrypoint:
                module = (workload or entrypoint).split(":")[0]
                with loading_user_code(roots, module):
                    # Imported once here; the loop's (the function runner's) lookup is then cached.
                    resolve(workload).load_build() if workload else load_entrypoint(entrypoint)
                roots.extend(package_roots(module))
            return train_fn(config)

    return train


@contextlib.contextmanager
def loading_user_code(roots: list[str], module: str = "") -> Iterator[None]:
    """Loading the job's own code (``module``, from ``roots`` or installed): a missing module or function
    (``resolve``'s ValueError), an ImportError or a SyntaxError here fails the job at once as ``code_error``.
    Where: the SyntaxError's line, or the innermost frame in the job's code ("" when none: resolve's
    message names what is missing)."""
    try:
        yield
    except (ValueError, ImportError, SyntaxError) as exc:
        found = [*roots, *package_roots(module)] if module else roots
        if isinstance(exc, SyntaxError) and exc.filename:
            where = f"{_shown(exc.filename, found)}, line {exc.lineno}"
        else:
            frame = user_frame(exc, found)
            where = _place(frame, found) if frame is not None else ""
        _mark(exc, LOADING, where)
        raise


@contextlib.contextmanager
def user_code_errors(roots: list[str]) -> Iterator[None]:
    """Mark an exception raised with a frame inside ``roots`` (folders or files) as the job's code's."""
    try:
        yield
    except Exception as exc:
        if code_error_of(exc) is None and roots:
            frame = user_frame(exc, roots)
            if frame is not None:
                _mark(exc, RAISED, _place(frame, roots))
        raise


def package_roots(module_name: str) -> list[str]:
    """Where a custom workload's code lives: its top-level package's folders, or its one module file."""
    top = module_name.split(".")[0]
    module = sys.modules.get(top)
    if module is None or top in OUR_PACKAGES:
        return []
    paths = list(getattr(module, "__path__", None) or [])
    if not paths and getattr(module, "__file__", None):
        paths = [module.__file__]
    return [os.path.abspath(path) for path in paths]


def user_frame(exc: BaseException, roots: list[str]) -> traceback.FrameSummary | None:
    """The innermost frame inside ``roots`` of ``exc``'s traceback or of the exceptions it was raised from."""
    roots = [os.path.abspath(root) for root in roots]
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for frame in reversed(traceback.extract_tb(current.__traceback__)):
            # "<frozen importlib._bootstrap>", "<string>": no file, and never a path under the current folder
            if not frame.filename.startswith("<") and _inside(os.path.abspath(frame.filename), roots):
                return frame
        current = current.__cause__ or current.__context__
    return None


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def _mark(exc: BaseException, kind: str, where: str) -> None:
    with contextlib.suppress(AttributeError, TypeError):  # an exception type that refuses attributes stays unmarked
        setattr(exc, MARK, (kind, where))


def _place(frame: traceback.FrameSummary, roots: list[str] = ()) -> str:
    return f"{_shown(frame.filename, roots)}, line {frame.lineno}, in {frame.name}"


def _shown(path: str, roots: list[str]) -> str:
    """A path as the user knows it: inside the package's folder, from there (``train.py``); inside an
    installed package, from the folder that holds it (``example_workloads/faulty.py``)."""
    path = os.path.abspath(path)
    cwd = os.getcwd()
    for root in map(os.path.abspath, roots):
        if _inside(path, [root]):
            return os.path.relpath(path, root if root == cwd else os.path.dirname(root))
    return path
