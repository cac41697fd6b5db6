"""Population-based training: the ranking rule, its records, its domain and servicer."""
