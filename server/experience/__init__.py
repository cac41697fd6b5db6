"""The experience exchange: batch validation, the bounded store, its domain and servicer."""
