"""Does federation pay off? Per-participant env steps to a solved model, N together against one.

Run it from the repository root: `python -m bench.federation --quick`. What it
runs, scores and computes, and how to read its output: docs/federation-benchmark.md.
"""
