"""Does population-based training pay off? A population's best member against independent runs.

Run it from the repository root: `python -m bench.population --quick`. What it
runs and how to read it: docs/scale.md ("Population-based training"); the
current figures: docs/benchmarks.md.
"""
