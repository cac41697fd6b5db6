"""The session sets its group's rules: fixed at creation, sent at Join, refused when asked
otherwise, shown everywhere, kept across restarts and old data dirs; real servers on loopback."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner

from fedrl.client.commands.config import TrainConfig
from fedrl.client.federation.errors import SyncError
from fedrl.client.federation.sync_plan import sync_plan
from fedrl.common.config_cli import config_from_options
from fedrl.common.config_file import read_config_file
from fedrl.common.group_rules import LEGACY_RULES, GroupRules, RuleChoices
from fedrl.common.group_rules_serde import choices_to_proto, rules_from_proto
from fedrl.common.status_table import render_status
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.server.cli import ServeConfig
from fedrl.server.cli import main as server_main
from fedrl.server.config import ServerConfig
from fedrl.server.dashboard.status_json import status_document
from fedrl.server.names import DB_FILE
from tests.support.participant import participant
from tests.support.ports import free_port
from tests.support.server_harness import (
    InProcessServer,
    ServerProcess,
    join,
    make_spec,
    server_config,
)

CLIENT = [sys.executable, "-c", "from fedrl.client.commands.cli import main; main()"]
SMALL_RUN = [
    *("--episodes", "2", "--workers", "0", "--envs-per-worker", "2", "--eval-interval", "0"),
    *("--hidden", "16", "--learning-starts", "32", "--batch-size", "8"),
    *("--tensorboard", "off", "--save-model-every", "1"),
]
"""A tiny serial DQN participant: two of them and a server share two cores."""
SPEC = make_spec([(4, 2), (2,)])
CHOSEN = RuleChoices(
    sync_interval=5,
    sync_steps=64,
    round_wait_s=3.0,
    rounds_from=2,
    shared_warmup=False,
    delta_dtype="float16",
    foreign_credit=1.5,
    round_foreign_credit=3.0,
    credit_at_own_pace=False,
)
"""A choice of every rule but the share, each away from its default."""


def client(
    address: str, state_dir: Path, pid: str, *options: str
) -> subprocess.CompletedProcess[str]:
    """One `fedrl-client` run to its end."""
    return subprocess.run(
        [
            *CLIENT,
            *("--participant-id", pid, "--server", address, "--state-dir", str(state_dir)),
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def session_rules(stub: pb_grpc.FederationStub, session: str = "default") -> GroupRules:
    """The session's rules as the Status RPC shows them."""
    reply = stub.Status(pb.StatusRequest(session=session))
    return rules_from_proto(reply.sessions[0].config.rules)


def session_made_by_ann(tmp_path: Path, **choices: Any) -> ServerConfig:
    """A server on a fixed port where ann's participant (with `choices`) made the default
    session, stopped: the config starts it again."""
    config = server_config(tmp_path / "server", port=free_port())
    with (
        InProcessServer(config) as server,
        participant(server.address, tmp_path / "ann", "ann", **choices),
    ):
        pass
    return config


def refused(call: Callable[[], object]) -> grpc.RpcError:
    """The error a call fails with."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def old_recorded_config(path: Path, rounds_from: int) -> Path:
    """The rules as a run recorded them before they were the session's: every one at its
    value then, in the [federation] and [exchange] tables."""
    path.write_text(
        "[federation]\n"
        'share = "both"\n'
        "sync_interval = 2\n"
        'sync_steps = "none"\n'
        'round_wait_s = "none"\n'
        f"rounds_from = {rounds_from}\n"
        "shared_warmup = true\n"
        'target_at_adoption = "shift"\n'
        "[exchange]\n"
        "foreign_credit = 2.0\n"
        "round_foreign_credit = 4.0\n"
        "push_transitions = 4096\n"
        "pull_transitions = 4096\n"
        "credit_at_own_pace = true\n",
        encoding="utf-8",
    )
    return path


def test_a_member_whose_flag_disagrees_with_its_session_is_refused_naming_both_values(
    tmp_path: Path,
) -> None:
    # prepare: ann's run creates the session choosing rounds from two members and the
    # credits runs recorded before the rules were the session's
    state = tmp_path / "state"
    credits = ("--foreign-credit", "2", "--round-foreign-credit", "4")
    with InProcessServer(server_config(tmp_path / "server")) as server:
        first = client(server.address, state, "ann", *SMALL_RUN, "--rounds-from", "2", *credits)
        assert first.returncode == 0, first.stderr

        # act: bob asks for rounds from four, carl repeats the session's own value; dave and
        # erin run configurations recorded before the rules were the session's
        bob = client(server.address, state, "bob", *SMALL_RUN, "--rounds-from", "4")
        carl = client(server.address, state, "carl", *SMALL_RUN, "--rounds-from", "2")
        agreeing = old_recorded_config(tmp_path / "agreeing.toml", rounds_from=2)
        dave = client(server.address, state, "dave", *SMALL_RUN, "--config", str(agreeing))
        old = old_recorded_config(tmp_path / "old.toml", rounds_from=3)
        erin = client(server.address, state, "erin", *SMALL_RUN, "--config", str(old))
        members = {
            p.participant_id
            for p in server.stub().Status(pb.StatusRequest()).sessions[0].participants
        }

    # assert
    assert bob.returncode != 0 and erin.returncode != 0
    assert (
        "session 'default' has --rounds-from 2 (rounds from 2 members pushing), you asked for "
        "--rounds-from 4: drop the flag or join another session"
    ) in " ".join(bob.stderr.split())
    refused_old = " ".join(erin.stderr.split())
    assert "has --rounds-from 2" in refused_old and "you asked for --rounds-from 3" in refused_old
    assert str(old) in refused_old
    assert carl.returncode == 0, carl.stderr
    assert dave.returncode == 0, dave.stderr
    assert "its rules are --share both --sync-interval 2" in first.stderr
    assert members == {"ann", "carl", "dave"}
    assert not (state / "bob" / "sync").exists()


def test_a_config_recorded_before_the_rules_reads_as_the_choices_it_holds(tmp_path: Path) -> None:
    settings = read_config_file(TrainConfig, old_recorded_config(tmp_path / "old.toml", 3))

    config = config_from_options(TrainConfig, settings)

    assert config.rules == RuleChoices(
        share="both",
        sync_interval=2,
        rounds_from=3,
        shared_warmup=True,
        foreign_credit=2.0,
        round_foreign_credit=4.0,
        credit_at_own_pace=True,
    )


def test_a_server_config_file_with_the_sync_interval_where_it_was_reads_as_the_rule(
    tmp_path: Path,
) -> None:
    file = tmp_path / "serve.toml"
    file.write_text("[serve]\nsync_interval = 5\n", encoding="utf-8")

    config = config_from_options(ServeConfig, read_config_file(ServeConfig, file))

    assert config.server.rules == GroupRules(sync_interval=5)


def test_two_members_run_the_same_rules_the_first_ones_choice_fixed(tmp_path: Path) -> None:
    # prepare: ann chooses every rule; bob chooses none (not even the share)
    expected = GroupRules().with_choices(CHOSEN)
    with (
        InProcessServer(server_config(tmp_path / "server")) as server,
        participant(server.address, tmp_path / "ann", "ann", rules=CHOSEN) as (_, ann),
        participant(server.address, tmp_path / "bob", "bob", None, rules=RuleChoices()) as (
            engine,
            bob,
        ),
    ):
        # act: bob trains a little by the session's rules
        for _ in range(5):
            bob.after_poll(engine.poll())
        shown = session_rules(server.stub())

    # assert: one set of rules, one plan, the session's
    assert ann.rules == bob.rules == shown == expected
    assert ann.plan == bob.plan == sync_plan(expected, on_policy=False)
    rounds = bob.plan.rounds
    assert rounds is not None and bob.plan.rounds_from == 2
    assert (rounds.round_wait_s, rounds.interval.env_steps, rounds.delta_dtype) == (
        3.0,
        64,
        "float16",
    )
    assert bob.plan.alone.interval.episodes == 5 and bob.plan.warmup is None


def test_the_servers_defaults_make_a_new_sessions_rules_and_a_first_choice_overrides_them(
    tmp_path: Path,
) -> None:
    defaults = GroupRules(rounds_from=2, sync_interval=4)
    with InProcessServer(server_config(tmp_path / "server", rules=defaults)) as server:
        stub = server.stub()

        plain = join(stub, "ann", SPEC, "plain")
        chosen = join(
            stub, "ann", SPEC, "chosen", rules=choices_to_proto(RuleChoices(sync_interval=6))
        )
        # A later member takes the session's, whatever the server's defaults.
        later = join(stub, "bob", SPEC, "chosen")

    assert rules_from_proto(plain.config.rules) == defaults
    assert rules_from_proto(chosen.config.rules) == GroupRules(rounds_from=2, sync_interval=6)
    assert later.config.rules == chosen.config.rules
    assert plain.config.sync_interval == 4 and chosen.config.sync_interval == 6


def test_a_rule_the_server_fixes_for_one_session_refuses_a_first_participant_asking_otherwise(
    tmp_path: Path,
) -> None:
    config = server_config(tmp_path / "server", session_rule=("pairs=rounds-from=2",))
    with InProcessServer(config) as server:
        stub = server.stub()

        error = refused(
            lambda: join(
                stub, "ann", SPEC, "pairs", rules=choices_to_proto(RuleChoices(rounds_from=4))
            )
        )
        joined = join(
            stub, "ann", SPEC, "pairs", rules=choices_to_proto(RuleChoices(sync_interval=7))
        )
        elsewhere = join(
            stub, "ann", SPEC, "fours", rules=choices_to_proto(RuleChoices(rounds_from=4))
        )

    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "the server fixes this rule" in (error.details() or "")
    assert "--rounds-from 2" in (error.details() or "")
    assert "you asked for --rounds-from 4" in (error.details() or "")
    assert rules_from_proto(joined.config.rules) == GroupRules(rounds_from=2, sync_interval=7)
    assert rules_from_proto(elsewhere.config.rules).rounds_from == 4


def test_choices_that_cannot_go_together_create_no_session(tmp_path: Path) -> None:
    with InProcessServer(server_config(tmp_path / "server")) as server:
        stub = server.stub()
        choices = RuleChoices(share="experience", round_wait_s=5.0)

        error = refused(lambda: join(stub, "ann", SPEC, rules=choices_to_proto(choices)))
        bad_value = refused(
            lambda: join(stub, "ann", SPEC, rules=pb.GroupRules(foreign_credit=float("nan")))
        )
        sessions = stub.Status(pb.StatusRequest()).sessions

    assert error.code() == bad_value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "--share weights or both" in (error.details() or "")
    assert "foreign_credit must be a number" in (bad_value.details() or "")
    assert list(sessions) == []


def test_a_restarted_server_keeps_each_sessions_rules_whatever_its_new_defaults(
    tmp_path: Path,
) -> None:
    data = tmp_path / "server"
    with ServerProcess(data, "--no-dashboard", "--rounds-from", "2") as first:
        join(first.stub(), "ann", SPEC, rules=choices_to_proto(RuleChoices(sync_interval=7)))
        first.stop()

    with ServerProcess(data, "--no-dashboard", "--rounds-from", "5") as second:
        stub = second.stub()
        again = join(stub, "bob", SPEC)
        new = join(stub, "bob", SPEC, "new")
        error = refused(
            lambda: join(stub, "carl", SPEC, rules=choices_to_proto(RuleChoices(rounds_from=5)))
        )

    assert rules_from_proto(again.config.rules) == GroupRules(rounds_from=2, sync_interval=7)
    assert rules_from_proto(new.config.rules) == GroupRules(rounds_from=5)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_a_data_dir_from_before_the_rules_opens_with_the_defaults_recorded(tmp_path: Path) -> None:
    # prepare: a session, then its data dir as a server without rules left it
    data = tmp_path / "server"
    with InProcessServer(server_config(data)) as server:
        join(server.stub(), "ann", SPEC)
    with sqlite3.connect(data / DB_FILE) as db:
        db.execute("DROP TABLE session_rules")

    # act: status reads it as it is; then a server with other defaults opens it
    before = CliRunner().invoke(server_main, ["status", "--data-dir", str(data)])
    with InProcessServer(server_config(data, rules=GroupRules(rounds_from=5))) as server:
        stub = server.stub()
        rejoined = join(stub, "ann", SPEC)
        error = refused(
            lambda: join(stub, "bob", SPEC, rules=choices_to_proto(RuleChoices(rounds_from=5)))
        )
    with sqlite3.connect(data / DB_FILE) as db:
        recorded = db.execute("SELECT session FROM session_rules").fetchall()

    # assert: the rules its members used before, which the session keeps from now on
    assert before.exit_code == 0, before.output
    assert "--rounds-from" in before.output
    assert rules_from_proto(rejoined.config.rules) == LEGACY_RULES
    assert "has --rounds-from 3" in (error.details() or "")
    assert recorded == [("default",)]


def test_the_status_rpc_the_tables_and_the_dashboard_show_the_sessions_rules(
    tmp_path: Path,
) -> None:
    with InProcessServer(server_config(tmp_path / "server")) as server:
        stub = server.stub()
        join(
            stub,
            "ann",
            SPEC,
            rules=choices_to_proto(RuleChoices(rounds_from=2, shared_warmup=False)),
        )
        reply = stub.Status(pb.StatusRequest())
        episodes_zero = client(server.address, tmp_path / "state", "ann", "--episodes", "0")
    data_dir = server.config.data_dir
    server_status = CliRunner().invoke(server_main, ["status", "--data-dir", str(data_dir)])

    table = render_status(reply)
    rules = {r["rule"]: r["value"] for r in status_document(reply)["sessions"][0]["rules"]}
    assert rules_from_proto(reply.sessions[0].config.rules) == GroupRules(
        rounds_from=2, shared_warmup=False
    )
    assert rules["--rounds-from"] == "2" and rules["--shared-warmup"] == "off"
    assert rules["--sync-steps"] == "auto"
    for shown in (table, episodes_zero.stdout, server_status.output):
        assert "what every member does" in shown
        assert "rounds from 2 members pushing" in shown
        assert "no rounds before learning" in shown


def test_a_participant_that_started_while_the_server_was_away_follows_the_session_once_in(
    tmp_path: Path,
) -> None:
    # prepare: ann made the session (every rule chosen) on a server that then went away
    config = session_made_by_ann(tmp_path, rules=CHOSEN)
    with participant(
        f"127.0.0.1:{config.port}",
        tmp_path / "bob",
        "bob",
        None,
        rules=RuleChoices(),
        connect_timeout_s=1.0,
    ) as (engine, bob):
        # act: bob trains by the defaults until the server is back, then joins
        for _ in range(3):
            bob.after_poll(engine.poll())
        before = bob.rules
        with InProcessServer(config):
            deadline = time.monotonic() + 60
            while not bob.view.connected:
                assert time.monotonic() < deadline, "bob never joined"
                bob.after_poll(engine.poll())
            bob.after_poll(engine.poll())
            after = bob.rules

    # assert
    assert before == GroupRules()
    assert after == GroupRules().with_choices(CHOSEN)
    assert bob.plan == sync_plan(after, on_policy=False)


def test_a_participant_that_started_away_from_a_session_sharing_otherwise_stops_saying_so(
    tmp_path: Path,
) -> None:
    # prepare: ann made a session sharing weights on a server that then went away
    config = session_made_by_ann(tmp_path, share="weights")
    with participant(
        f"127.0.0.1:{config.port}", tmp_path / "bob", "bob", None, connect_timeout_s=1.0
    ) as (engine, bob):
        bob.after_poll(engine.poll())
        deadline = time.monotonic() + 60
        with InProcessServer(config), pytest.raises(SyncError, match="has --share weights"):
            while time.monotonic() < deadline:
                bob.after_poll(engine.poll())
