"""``api/`` writes only through ``orchestrator.use_cases`` and reads through the repositories (docs/architecture.md,
"The use-case layer"): it calls no repository function that writes (found in the repositories' own source: one
that adds, deletes, flushes or updates rows, or records a creation, or calls one that does), it writes no row
itself and builds no query of its own. The import-linter contract in pyproject.toml keeps the checks a write runs
(submission, quotas, cancellation) out of ``api/`` too; this is the part an import rule cannot see."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SESSION_WRITES = frozenset({"add", "add_all", "delete", "merge", "flush", "bulk_save_objects"})
STATEMENT_WRITES = frozenset({"insert", "update", "delete"})  # sqlalchemy's constructors


def _calls(node: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def _writes_itself(function: ast.FunctionDef) -> bool:
    for call in _calls(function):
        func = call.func
        if isinstance(func, ast.Attribute) and (func.attr in SESSION_WRITES or func.attr == "values"):
            return True
        if isinstance(func, ast.Name) and (func.id in STATEMENT_WRITES or func.id.startswith("record_")):
            return True
    return False


def repository_writes() -> dict[str, set[str]]:
    """Per repository module (``jobs``, ``sweeps``, ...), its functions that write, read from its source: those
    that write themselves, and those that call one that does in the same module."""
    writes: dict[str, set[str]] = {}
    for path in sorted((ROOT / "orchestrator" / "repositories").glob("*.py")):
        functions = {n.name: n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
        found = {name for name, f in functions.items() if _writes_itself(f)}
        grew = True
        while grew:  # ensure_default_project -> create_project, ...
            callers = {
                name
                for name, f in functions.items()
                if any(isinstance(c.func, ast.Name) and c.func.id in found for c in _calls(f))
            }
            grew = not callers <= found
            found |= callers
        writes[path.stem] = found
    return writes


def api_writes(source: str, writes: dict[str, set[str]], filename: str = "<source>") -> list[str]:
    """``file:line: what`` for every repository write ``source`` calls or imports, every row it writes itself
    (``session.add``/``delete``/..., ``.values(...)``) and every query it builds (``select(...)``)."""
    tree = ast.parse(source, filename)
    modules: dict[str, str] = {}  # the name a repository module is bound to -> the module
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("orchestrator.repositories"):
            for alias in node.names:
                if node.module == "orchestrator.repositories":
                    modules[alias.asname or alias.name] = alias.name
                elif alias.name in writes.get(node.module.rsplit(".", 1)[1], set()):
                    found.append(f"{filename}:{node.lineno}: imports the repository write {alias.name}")
    for call in _calls(tree):
        func = call.func
        if isinstance(func, ast.Name) and func.id == "select":
            found.append(f"{filename}:{call.lineno}: select(...): read through a repository function")
        if not isinstance(func, ast.Attribute):
            continue
        owner = func.value
        if isinstance(owner, ast.Name) and func.attr in writes.get(modules.get(owner.id, ""), set()):
            found.append(f"{filename}:{call.lineno}: calls the repository write {owner.id}.{func.attr}")
        if isinstance(owner, ast.Name) and "session" in owner.id and func.attr in SESSION_WRITES:
            found.append(f"{filename}:{call.lineno}: {owner.id}.{func.attr}(...) writes a row")
        if func.attr == "values" and isinstance(owner, ast.Call) and _statement(owner) in STATEMENT_WRITES:
            found.append(f"{filename}:{call.lineno}: {_statement(owner)}(...).values(...) writes rows")
    return found


def _statement(call: ast.Call) -> str:
    return call.func.id if isinstance(call.func, ast.Name) else ""


def test_the_repositories_writes_are_found():
    writes = repository_writes()
    assert {"create_job", "create_sweep", "record_key_use"} <= writes["jobs"] | writes["sweeps"] | writes["projects"]
    assert "ensure_default_project" in writes["projects"]  # through create_project
    assert not {"get_job", "list_jobs", "page_events", "find_by_idempotency_key"} & writes["jobs"]


def test_api_calls_no_repository_write_writes_no_row_and_builds_no_query():
    files = sorted((ROOT / "api").rglob("*.py"))
    assert any(f.name == "jobs.py" for f in files) and len(files) > 20  # the scan sees the tree
    writes = repository_writes()
    found = [hit for f in files for hit in api_writes(f.read_text(), writes, str(f.relative_to(ROOT)))]
    assert found == [], "write through orchestrator.use_cases, read through the repositories:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "snippet",
    [
        "from orchestrator.repositories import sweeps as sweeps_repo\nsweeps_repo.create_sweep(session, p, spec)",
        "from orchestrator.repositories import projects\nprojects.delete_api_key(session, p, k, cluster_wide=True)",
        "from orchestrator.repositories.jobs import create_job",
        "session.add(Job(name='x'))",
        "db_session.delete(row)",
        "session.execute(update(Job).values(priority=1))",
        "rows = session.scalars(select(Trial).where(Trial.sweep_id == i))",
    ],
)
def test_the_check_finds_a_write_or_a_query(snippet):
    assert len(api_writes(snippet, repository_writes())) == 1, api_writes(snippet, repository_writes())


def test_the_check_lets_reads_be():
    snippet = (
        "from orchestrator.repositories import jobs as jobs_repo\n"
        "from orchestrator.repositories.sweeps import get_sweep\n"
        "jobs_repo.get_job(session, i, None); jobs_repo.page_events(session, i, c, n)\n"
        "jobs_repo.list_jobs(session); jobs_repo.find_by_idempotency_key(session, p, k)\n"
        "session.get(Job, i); service.sessions(); {'a': 1}.values(); seen.add(1)\n"
    )
    assert api_writes(snippet, repository_writes()) == []
