"""The aggregation rule: one Strategy per file over the pure numpy math of aggregate.py."""
