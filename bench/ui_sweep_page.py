"""The dashboard's sweep page with 1,000 trials x 100 epochs (100,000 trial metric points, docs/dashboard.md): how long
the page and every trial's curve take to load, against the plain REST read of the same points, side by side.

    .venv/bin/python bench/ui_sweep_page.py                        # SQLite in a temporary folder
    .venv/bin/python bench/ui_sweep_page.py --database-url postgresql+psycopg://postgres@127.0.0.1:5432/orch_ui_sweep_bench

One finished sweep with ``--trials`` trials of ``--epochs`` epochs each (val_loss and val_accuracy per epoch),
seeded straight into the database. The service (``create_app``, loops off, no cluster) under uvicorn in this
process's thread (``bench/ui_job_page.py``'s), the client httpx, one request at a time, signed in to the
dashboard with a viewer key (the REST calls use the same key as a bearer token).

Measured ``--rounds`` times each, alternating which goes first, median and min:

- **page**: what a browser fetches to show the sweep page and draw every trial's curve: the HTML page (the trial
  table, no point read) and its first poll of ``/ui/api/sweeps/{id}`` (every trial's curve, each downsampled to
  at most 500 points);
- **reference**: the REST API's read of the same points, as a client drawing the curves itself must: the
  trials (``GET /v1/sweeps/{id}/trials``), then each trial's ``GET /v1/trials/{id}/metrics``;
- **poll**: a live update when nothing changed (If-None-Match, 304).

Prints the ratio page / reference (below 1: the page is faster than reading the points over REST).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from api.app import create_app  # noqa: E402
from bench.ui_job_page import ADMIN, _NoCluster, serve, sign_in  # noqa: E402
from orchestrator.db.models import JobState, Trial, TrialMetric, TrialState  # noqa: E402
from orchestrator.repositories import projects as projects_repo  # noqa: E402
from orchestrator.repositories import sweeps as sweeps_repo  # noqa: E402
from orchestrator.settings import Settings  # noqa: E402
from orchestrator_contract.sweeps import SweepSpec  # noqa: E402

SPACE = {
    "lr.base": {"type": "loguniform", "low": 1e-3, "high": 0.3},
    "config.hidden": {"type": "choice", "values": [16, 32, 64]},
}


def seed(app, trials: int, epochs: int) -> tuple[str, str]:
    """The sweep and a viewer key of its project."""
    spec = SweepSpec.model_validate(
        {
            "name": "bench",
            "base": {"workload": "digits", "epochs": epochs},
            "search_space": SPACE,
            "num_samples": trials,
        }
    )
    with app.state.service.sessions.begin() as session:
        project = projects_repo.create_project(session, "bench")
        _, viewer = projects_repo.create_api_key(session, project.id, "viewer", "bench")
        sweep = sweeps_repo.create_sweep(session, project.id, spec)
        sweep.state = JobState.SUCCEEDED
        rows, best = [], None
        for n in range(trials):
            lr, hidden = 10 ** (-3 + 2.5 * ((n * 7919) % trials) / trials), (16, 32, 64)[n % 3]
            trial = Trial(
                sweep_id=sweep.id,
                tune_id=f"bench_{n:05d}",
                number=n + 1,
                config={"lr.base": lr, "config.hidden": hidden},
            )
            losses = [1.0 / (1 + e * lr * 10) + 0.001 * (n % 13) for e in range(1, epochs + 1)]
            trial.state, trial.iterations = TrialState.SUCCEEDED, epochs
            trial.best_metric, trial.best_epoch = max(1 - v / 2 for v in losses), epochs
            trial.latest_metrics = {"val_loss": losses[-1], "val_accuracy": 1 - losses[-1] / 2, "epoch": epochs}
            session.add(trial)
            session.flush()
            best = trial if best is None or trial.best_metric > best.best_metric else best
            rows += [
                {"trial_id": trial.id, "epoch": e, "step": 10 * e, "values": {"val_loss": v, "val_accuracy": 1 - v / 2}}
                for e, v in enumerate(losses, start=1)
            ]
        sweep.best_trial_id = best.id
        for chunk in range(0, len(rows), 10_000):
            session.execute(insert(TrialMetric), rows[chunk : chunk + 10_000])
        return sweep.id, viewer


def load_page(client: httpx.Client, sweep_id: str) -> tuple[float, int, str]:
    began = time.perf_counter()
    page = client.get(f"/ui/sweeps/{sweep_id}")
    data = client.get(f"/ui/api/sweeps/{sweep_id}")
    took = time.perf_counter() - began
    assert page.status_code == data.status_code == 200, (page.status_code, data.status_code)
    shown = sum(1 for s in data.json()["curves"]["series"] for y in s["y"] if y is not None)
    return took, shown, data.headers["etag"]


def load_reference(client: httpx.Client, sweep_id: str, key: str) -> tuple[float, int]:
    headers = {"Authorization": f"Bearer {key}"}
    began = time.perf_counter()
    trials, cursor = [], None
    while True:
        answer = client.get(
            f"/v1/sweeps/{sweep_id}/trials", params={"cursor": cursor} if cursor else {}, headers=headers
        )
        trials += answer.json()
        if not (cursor := answer.headers.get("X-Next-Cursor")):
            break
    count = 0
    for trial in trials:
        cursor = None
        while True:
            params = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
            answer = client.get(f"/v1/trials/{trial['id']}/metrics", params=params, headers=headers)
            assert answer.status_code == 200, answer.text
            count += len(answer.json())
            if not (cursor := answer.headers.get("X-Next-Cursor")):
                break
    return time.perf_counter() - began, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="default: SQLite in a temporary folder")
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="ui-sweep-bench-"))
    settings = Settings(
        database_url=args.database_url or f"sqlite:///{folder / 'bench.db'}",
        storage=str(folder / "storage"),
        var_dir=str(folder / "var"),
        admin_token=ADMIN,
    )
    app = create_app(settings, backend=_NoCluster(), run_loops=False)
    server, thread, url = serve(app)
    try:
        sweep_id, key = seed(app, args.trials, args.epochs)
        with httpx.Client(base_url=url, timeout=600) as client:
            sign_in(client, key)
            pages, references, polls = [], [], []
            for round_ in range(args.rounds):
                order = (0, 1) if round_ % 2 == 0 else (1, 0)
                for which in order:
                    if which == 0:
                        took, shown, etag = load_page(client, sweep_id)
                        pages.append(took)
                    else:
                        took, count = load_reference(client, sweep_id, key)
                        references.append(took)
                began = time.perf_counter()
                unchanged = client.get(f"/ui/api/sweeps/{sweep_id}", headers={"If-None-Match": etag})
                polls.append(time.perf_counter() - began)
                assert unchanged.status_code == 304
        page, reference = statistics.median(pages), statistics.median(references)
        print(f"database: {settings.database_url.split(':', 1)[0]}; {args.trials} trials x {args.epochs} epochs")
        print(f"page (HTML + every curve, {shown} points drawn): median {page:.2f} s, min {min(pages):.2f} s")
        print(f"reference (REST, {count} points): median {reference:.2f} s, min {min(references):.2f} s")
        print(f"unchanged poll (304): median {statistics.median(polls) * 1000:.0f} ms")
        print(f"ratio page / reference: {page / reference:.2f}")
    finally:
        server.should_exit = True
        thread.join(timeout=30)


if __name__ == "__main__":
    main()
