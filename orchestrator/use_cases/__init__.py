"""The use-cases: one function for every write the API and the dashboard make.

Each runs every check the write needs, in one order (what asks Ray first, before the session's first query:
on SQLite a transaction holds the write lock), then changes the rows through the services and the state
engine, and returns the row or raises (``orchestrator.errors``: the API's 4xx). None commits: the router or
the dashboard route that called it commits (a use-case that must tell Ray after its commit, a cancel,
commits itself and says so). Reads stay in ``orchestrator.repositories``; ``api/`` calls no repository
function that writes (``tests/unit/test_import_contracts.py`` checks it).

    ``jobs``         ``submit_job``, ``cancel_job``
    ``sweeps``       ``submit_sweep``, ``cancel_sweep``
    ``deployments``  ``create_deployment``, ``update_deployment``, ``rollback_deployment``,
                     ``delete_deployment``, ``deploy_checkpoint`` (the dashboard's "deploy this")
    ``projects``     ``target_project``, ``visible_project``, ``create_project``, ``update_project``,
                     ``set_quota``, ``create_api_key``, ``revoke_api_key``, ``note_key_used``
    ``idempotency``  ``create_once``: an ``Idempotency-Key`` on any create (jobs, sweeps, deployments)
"""
