"""The control plane's background loops, each bringing one part of the world in line with the database:
the scheduler (admits queued runs), the reconciler (jobs' and sweeps' Ray jobs), the serving reconciler
(Ray Serve), checkpoint retention and the orphan sweepers, and the log archiver. ``runner.Loop`` runs each
in a thread of the API process; ``orchestrator.control_plane`` starts them.

What a request does (submit, cancel, apply reported events, deploy) is ``orchestrator.services``; a loop and
a request that change the same row both go through the state engine (``orchestrator.states``).
"""
