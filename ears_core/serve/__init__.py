"""Serving a model pair: sessions (RunConfig, Session: runs, baselines, deadlines), the run summary and export, runs and their threads, server settings and limits, the pair slot, shutdown."""
