"""`fedrl-client`: the participant's command line."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """fedrl participant: trains locally and federates with a fedrl server."""
