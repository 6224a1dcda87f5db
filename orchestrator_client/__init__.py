"""The Python SDK of the training orchestrator: everything the REST API does, from a script or a notebook.

It speaks the public REST API only and parses answers with the public contract's models
(``workers.contract``): installing it pulls in neither Ray, PyTorch nor SQLAlchemy.
"""
