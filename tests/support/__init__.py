"""What the tests share besides fixtures (those are in tests/conftest.py)."""
