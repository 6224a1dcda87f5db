"""What a request does, behind the thin routers: submitting and cancelling runs, applying what drivers
report (events), deployments' changes, reading and following logs, and what the control plane hands Ray to
start an attempt (launch, runs). The background loops are ``orchestrator.loops``."""
