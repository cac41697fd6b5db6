"""Benchmarks that print figures; packages among them run from the repository root with -m."""
