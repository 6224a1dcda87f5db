"""Scheduling between projects (docs/scheduling.md): quotas, weighted fair share, the starvation guard and when to
preempt. ``policy`` is pure (plain data in, a plan out); ``quotas`` holds the submit-time checks."""
