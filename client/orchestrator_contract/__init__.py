"""The public contract: what the REST API takes and answers, what the cluster receives and reports.

Plain pydantic and enums, importable without SQLAlchemy, Ray or PyTorch, so that the control plane,
the code on the Ray cluster and clients (SDK, CLI, dashboard) share one definition.
"""
