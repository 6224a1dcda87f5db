"""Serving on Ray Serve: the application that loads a checkpoint's model and answers requests."""
