"""Sweeps on Ray Tune: the sweep's Ray job driver and the Tuner whose trials are Ray Train runs."""
