"""The federation core: sessions, pushes and pulls, the aggregator and its versions."""
