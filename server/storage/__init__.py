"""Durable storage: the update log, the state database, model checkpoints, record frames."""
