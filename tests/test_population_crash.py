"""kill -9 of a population's server at random moments: every decision and model it promised stays.

Three members report as fast as they can, each report's model and learner
filled with its sequence number, and take every exploit they are given
(pulling the donor model and learner, retrying through outages). After the
kills and a graceful stop the state database and the files must agree:
every acknowledged report is taken, each member's latest model is on disk
and is the report it names, with that report's learner beside it, every
exploit not yet adopted still has its donor model and learner, generations
run without gaps, counters were counted once, and no file is left that no
row needs.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from fedrl.proto.v1 import population_pb2_grpc as pb_grpc
from fedrl.server.names import DB_FILE
from fedrl.server.population.population import learner_path
from fedrl.server.storage.model_store import read_checkpoint
from tests.support.polling import wait_until
from tests.support.population import (
    enroll,
    join_population,
    pull_donor,
    pull_donor_learner,
    report,
)
from tests.support.ports import free_port
from tests.support.server_harness import ServerProcess, channel, make_spec

SPEC = make_spec([(64, 64)])
MEMBERS = ("alice", "Макар", "小明")
KILLS = 4
STEPS_PER_REPORT = 50


class Reporter(threading.Thread):
    """A member that reports, retries a sequence until it is taken, and adopts every exploit."""

    def __init__(self, participant_id: str, address: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.participant_id = participant_id
        self.address = address
        self.rng = random.Random(seed)
        self.acked: set[int] = set()
        self.adopted: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with channel(self.address) as opened:
            stub = pb_grpc.PopulationStub(opened)  # type: ignore[no-untyped-call]
            sequence, generation = 1, 0
            while not self.stop.is_set():
                try:
                    reply = report(
                        stub,
                        self.participant_id,
                        SPEC,
                        [np.full((64, 64), sequence, np.float32)],
                        sequence=sequence,
                        generation=generation,
                        env_steps=sequence * STEPS_PER_REPORT,
                        episodes=sequence,
                        score=self.rng.uniform(0, 100),
                        learner=[("position/updates", np.asarray(sequence, np.int64))],
                    )
                    assignment = reply.assignment
                    if assignment.adopt and assignment.generation > generation:
                        pull_donor(stub, self.participant_id, assignment.generation)
                        copied = pull_donor_learner(
                            stub, self.participant_id, assignment.generation
                        )
                        assert copied is not None, "a donor model came without its learner"
                        generation = assignment.generation
                        self.adopted.append(generation)
                except grpc.RpcError:
                    time.sleep(0.05)  # the server is down: the same sequence goes again
                    continue
                self.acked.add(sequence)
                sequence += 1


def query(data: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(f"{(data / DB_FILE).resolve().as_uri()}?mode=ro", uri=True) as db:
        return db.execute(sql).fetchall()


@pytest.mark.slow
def test_sigkill_at_random_moments_keeps_every_decision_and_every_model_it_needs(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    rng = random.Random(11)
    server = ServerProcess(
        data, "--pbt-ready-steps", str(2 * STEPS_PER_REPORT), port=free_port()
    ).start()
    federation, population = server.stub(), pb_grpc.PopulationStub(channel(server.address))  # type: ignore[no-untyped-call]
    for member in MEMBERS:
        join_population(federation, member, SPEC)
        enroll(population, member)
    reporters = [Reporter(m, server.address, i) for i, m in enumerate(MEMBERS)]
    for reporter in reporters:
        reporter.start()
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.3, 1.5))  # a random moment to kill at: the test itself
            server.kill()
            server.start()
        before = [len(r.acked) for r in reporters]
        wait_until(
            lambda: all(len(r.acked) > n for r, n in zip(reporters, before, strict=True)),
            120,
            "every member to get through to the last server",
        )
    finally:
        for reporter in reporters:
            reporter.stop.set()
        for reporter in reporters:
            reporter.join(timeout=60)
    assert server.stop() == 0
    server.start()  # one more start: it removes whatever no row needs
    assert server.stop() == 0

    members = {
        pid: (generation, last, path, episodes)
        for pid, generation, last, path, episodes in query(
            data,
            "SELECT participant_id, generation, last_sequence, checkpoint, episodes FROM members",
        )
    }
    generations = query(
        data,
        "SELECT participant_id, generation, adopted_ms, donor_checkpoint FROM member_generations",
    )
    counted = dict(query(data, "SELECT participant_id, episodes FROM participants"))
    for reporter in reporters:
        generation, last, path, episodes = members[reporter.participant_id]
        # Every report the member heard back about was taken, and counted once.
        assert max(reporter.acked) <= last and episodes == last == counted[reporter.participant_id]
        # Its latest model is the one its row names: filled with that report's sequence.
        ((_, latest),) = read_checkpoint(data / str(path))
        assert (latest == float(last)).all()
        ((_, updates),) = read_checkpoint(learner_path(data / str(path)))
        assert int(updates) == last
        own = sorted(g for pid, g, _, _ in generations if pid == reporter.participant_id)
        assert own == list(range(generation + 1))
        # The member adopted what it was told to, in order.
        assert reporter.adopted == sorted(set(reporter.adopted))
    pending = [donor for _, g, adopted, donor in generations if g > 0 and adopted == 0]
    for donor in pending:
        assert (data / str(donor)).is_file(), f"an unadopted exploit lost its donor model {donor}"
        assert learner_path(data / str(donor)).is_file(), f"{donor} lost its learner"
    needed = {str(p) for _, (_, _, p, _) in members.items()} | {str(d) for d in pending}
    on_disk = {
        str(path.relative_to(data)) for path in (data / "sessions").rglob("population/*/*.npz")
    }
    learners = {
        str(path.relative_to(data))
        for path in (data / "sessions").rglob("population/*/learner/*.npz")
    }
    assert on_disk == needed
    assert learners == {str(learner_path(data / p).relative_to(data)) for p in needed}
    assert sum(1 for _, g, _, _ in generations if g > 0) > 0, "no exploit was ever decided"
