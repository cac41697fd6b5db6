"""`fedrl-server`: the aggregation server's command line."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """fedrl aggregation server: asynchronous federated averaging over gRPC."""
