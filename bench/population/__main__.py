"""`python -m bench.population`: see bench.population.cli."""

from bench.population.cli import main

main()
