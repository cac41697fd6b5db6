"""`fedrl-client config`: the configuration a participant's latest run used, as a config file.

Every training run records its whole configuration — defaults, game settings and the
participant id it resolved included — in its state dir (config.toml, see state_dir). This
command prints it, checked against today's settings, so that `fedrl-client --config FILE`
repeats the run; options given after `--config` change what they name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import click

from fedrl.client.commands.config import TrainConfig, train_config_toml
from fedrl.client.commands.state_dir import CONFIG_FILE, PARTICIPANT_ID_FILE
from fedrl.common.config_cli import config_from_options, doc, takes_config
from fedrl.common.config_file import ConfigFileError, read_config_file
from fedrl.common.config_help import ConfigCommand
from fedrl.common.identity import safe_dirname, validate_participant_id


@dataclass(frozen=True)
class ShowConfig:
    """The config command: whose recorded configuration to print."""

    state_dir: Path = field(
        default=Path("fedrl-state"),
        metadata=doc(
            "Root of the state dirs, as given to training; or one participant's own dir.",
            path="dir",
        ),
    )
    participant_id: str = field(
        default="",
        metadata=doc(
            "Whose configuration; may be left out when the state dirs hold one participant's "
            "run, or remember the id training generated."
        ),
    )


@click.command("config", cls=ConfigCommand)
@takes_config(ShowConfig)
def config_command(config: ShowConfig) -> None:
    """Print the configuration of a participant's latest run, as a file for --config.

    e.g. `fedrl-client config --participant-id Макар > run.toml`, then
    `fedrl-client --config run.toml` runs it again.
    """
    path = recorded_config(config.state_dir, config.participant_id)
    try:
        train = config_from_options(TrainConfig, read_config_file(TrainConfig, path))
    except (ConfigFileError, ValueError) as exc:
        raise click.ClickException(f"{exc} (the configuration recorded in {path})") from None
    click.echo(train_config_toml(train), nl=False)


def recorded_config(root: Path, participant_id: str) -> Path:
    """The config.toml of the participant named, or of the only one there is; ClickException
    saying what to give when that is not clear."""
    if (root / CONFIG_FILE).is_file() and not participant_id:
        return root / CONFIG_FILE
    if not participant_id and (root / PARTICIPANT_ID_FILE).is_file():
        participant_id = (root / PARTICIPANT_ID_FILE).read_text(encoding="utf-8").strip()
    if participant_id:
        try:
            where = root / safe_dirname(validate_participant_id(participant_id))
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        if not (where / CONFIG_FILE).is_file():
            raise click.ClickException(
                f"no recorded configuration in {where}: a run records it when it starts "
                "training (check --state-dir and --participant-id)"
            )
        return where / CONFIG_FILE
    runs = sorted(p.parent.name for p in root.glob(f"*/{CONFIG_FILE}"))
    if len(runs) == 1:
        return root / runs[0] / CONFIG_FILE
    if not runs:
        raise click.ClickException(
            f"no recorded configuration under {root}: a run records it when it starts "
            "training (check --state-dir)"
        )
    raise click.UsageError(
        f"{root} holds the runs of {', '.join(runs)}: name one with --participant-id"
    )
