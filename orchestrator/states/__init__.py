"""The state engine: the ONE place where jobs, sweeps, trials and deployments change state.

Layout
    ``core``         ``Rule`` (FROM -> TO sets), ``Lifecycle`` (one kind's rules, history row and companion
                     hooks), ``IllegalTransition``, ``lock_row``, ``transition``, ``record_creation`` and
                     ``record_request``
    ``jobs``         the run lifecycle's rules and companions; ``set_job_state``, ``record_job_created``,
                     ``note_waiting``; the run's requests (``request_preemption``, ``revoke_driver``) and
                     its driver's credentials (``issue_driver_claim``, ``issue_driver_token``)
    ``sweeps``       sweeps (the run lifecycle again) and trials; ``set_sweep_state``, ``set_trial_state``,
                     ``record_sweep_created``, ``record_trial_created``
    ``deployments``  ``set_deployment_state``, ``record_deployment_created``
    ``job_metrics``  the jobs' metric hooks (``orchestrator.metrics``): submitted, finished by state, restarts by
                     reason, queue wait and run duration, each counted when the caller's transaction commits
    ``sweep_metrics``, ``deployment_metrics``  the same for sweeps (submitted, finished by state) and
                     deployments (rollouts promoted or failed)
    ``usage_ledger`` the usage ledger (``usage_intervals``, read by ``orchestrator.usage``): a stretch per time a
                     job or trial is RUNNING or a deployment serves, at the transitions' own instants

Every writer (the API, the scheduler, the reconciler, the serving reconciler, the events endpoints) loads
the row locked (``lock_job``, ``lock_sweep``, ``lock_deployment``; a trial under its sweep's lock) and calls
its kind's ``set_*_state``. ``core.transition`` then, in the caller's transaction and never committing:
returns False for a repeat (unless ``again``), raises ``IllegalTransition`` for a move the rules forbid,
runs the ``before`` hooks, appends the history row (``job_events``, ``sweep_events``, ``trial_events``,
``deployment_events``), sets ``state``, ``reason``, ``message``, ``updated_at``, and runs the ``after``
hooks. A new row gets its first history row (``from_state`` None) from ``record_*_created``, called by the
code that creates it (the repositories; ``services.deployments``).

Lifecycles
    job, sweep   QUEUED -> STARTING -> RUNNING <-> RESTARTING -> SUCCEEDED | FAILED | CANCELLED, with
                 CANCELLING between a cancel request and the end (it may still end SUCCEEDED, never
                 FAILED). RESTARTING -> RESTARTING (``again``) is a second failure before running again.
                 A sweep that ends cancels its open trials (reason ``sweep_ended``) in the same transaction.
    trial        PENDING -> RUNNING | FAILED | CANCELLED; RUNNING -> SUCCEEDED | STOPPED | FAILED |
                 CANCELLED. Its history rows carry its sweep's attempt.
    deployment   DEPLOYING -> HEALTHY | FAILED; HEALTHY -> UPDATING | UNHEALTHY; UPDATING -> HEALTHY |
                 UNHEALTHY; UNHEALTHY -> HEALTHY | UPDATING; FAILED -> DEPLOYING; any live -> DELETED.
                 DEPLOYING -> DEPLOYING and UPDATING -> UPDATING (``again``): a newer version mid-rollout.
    Terminal states are final. Why a row is where it is goes in ``reason`` + ``message``, not in more
    states; ``note_waiting`` changes only those two (a QUEUED run waiting for resources: no history row).

Companion fields: nothing outside this package assigns them (``tests/unit/test_state_engine.py`` checks
the source of ``orchestrator/`` and ``api/``)
    ``attempt`` (jobs, sweeps)  Admission, QUEUED -> STARTING, starts attempt + 1 BEFORE its history row,
                 which records the attempt it starts. A move to RESTARTING that the caller marks
                 ``new_attempt=True`` (the reconciler, when a driver was lost or never started) submits a
                 new driver: its history row records the attempt that was lost, THEN the attempt is bumped
                 (the reconciler tells "RESTARTING, not heard from since" by the last row's lower attempt).
                 ``new_attempt`` implies ``again``; with any other target it is a ValueError. No other
                 transition changes the attempt (a worker restart inside Ray Train keeps it).
    ``started_at`` / ``finished_at`` (jobs, sweeps, trials)  the first RUNNING / a terminal state, at the
                 transition's ``updated_at``. A run's terminal state also clears its driver token
                 (``token_hash``), which acts only while the run runs (tokens are issued by
                 ``services.run_claims.exchange``, to the driver that claims with its attempt's code).
    ``live_version`` / ``failed_version`` (deployments)  a rollout (DEPLOYING, UPDATING) that ends HEALTHY
                 promotes the newest version (live = version, failed = None); one that ends FAILED or
                 UNHEALTHY marks it failed (failed = version: not applied again); entering a rollout, or
                 QUEUED (a new version waits to be admitted), forgets the failed one.
    ``preempt_requested_at`` / ``preempt_by`` (jobs, sweeps)  set by ``request_preemption``, a request: a history
                 row with from = to = the run's state and reason ``preempting`` (``core.record_request``;
                 ``last_transition`` skips such rows, reasons in ``jobs.REQUESTS``, so the reconciler's clocks
                 still read the last transition); forgotten by the requeue or an end (``preemption_after``),
                 which also keep ``preemptions``, ``last_preempted_at``/``_by`` and ``queued_at``.
    ``claim_hash`` / ``claimed_by`` / ``token_hash`` (jobs, sweeps)  the driver's credentials: a new claim code
                 per attempt or resubmission (``issue_driver_claim``, recorded by the transition that starts
                 the attempt), the token the claim is exchanged for (``issue_driver_token``; the exchange is
                 logged, not a history row: it is the attempt's start, which has its own), revoked with a
                 history row when the Ray head is lost (``revoke_driver``, reason ``driver_revoked``) and by a
                 terminal state.
    ``rollout_started_at`` / ``deleted_at`` (deployments)  set on entering a rollout (at creation: its
                 ``created_at``, unless it is created QUEUED), cleared on leaving one; DELETED sets
                 ``deleted_at``.

To add a state: add it to the enum in ``orchestrator_contract.states`` (stored as a string of at most 16
characters: no migration unless it is longer), add its FROM -> TO ``Rule``s in the kind's module, add it to
``TERMINAL``/``ACTIVE``/``ROLLING`` where it belongs, give any field that must change with it a hook in the
kind's ``Lifecycle`` (never an assignment in a service), and extend the kind's rule tests
(``tests/unit/test_states.py``, ``test_deployments.py``, ``test_state_engine.py``). A new kind of row gets a
rules module with its own ``Lifecycle`` and a ``*Event`` history model built on ``db.models._StateHistory``.
"""
