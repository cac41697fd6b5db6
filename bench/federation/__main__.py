"""`python -m bench.federation`: the command line (bench.federation.cli)."""

import sys

if __package__ != "bench.federation":
    # Run as a folder (python bench/federation), its modules cannot import each other.
    sys.exit("run the federation bench from the repository root: python -m bench.federation ...")

from bench.federation.cli import main

main()
