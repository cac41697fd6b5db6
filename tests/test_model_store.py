"""ModelStore: exact round trips, plain-numpy readability, atomic writes, retention."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrl.server.storage.model_store import ModelStore

Model = list[tuple[str, np.ndarray]]
# Above Linux's PID_MAX_LIMIT (2**22): no process can have it.
DEAD_PID = 2**22 + 1


def model(seed: int = 0) -> Model:
    rng = np.random.default_rng(seed)
    return [
        ("q.0.weight", rng.standard_normal((4, 3)).astype(np.float32)),
        ("q.0.bias", rng.standard_normal(4).astype(np.float32)),
        ("Макар.scale", np.full((), seed, np.float32)),
        ("steps", np.arange(3, dtype=np.int64)),
        ("empty", np.zeros((0, 5), np.float16)),
    ]


def assert_same(got: Model, expected: Model) -> None:
    assert [name for name, _ in got] == [name for name, _ in expected]
    for (_, a), (_, b) in zip(got, expected, strict=True):
        assert a.dtype == b.dtype
        assert a.shape == b.shape
        assert np.array_equal(a, b)


def test_load_gives_back_names_order_dtypes_and_values(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)

    path = store.write(12, model())

    assert path == tmp_path / "v00000012.npz"
    assert_same(store.load(12), model())


def test_a_checkpoint_loads_with_plain_numpy(tmp_path: Path) -> None:
    path = ModelStore(tmp_path).write(3, model())

    with np.load(path) as archive:
        assert archive.files == [name for name, _ in model()]
        assert np.array_equal(archive["q.0.weight"], model()[0][1])


def test_the_same_model_always_gives_the_same_bytes(tmp_path: Path) -> None:
    first = ModelStore(tmp_path / "a").write(1, model())
    second = ModelStore(tmp_path / "b").write(1, model())

    assert first.read_bytes() == second.read_bytes()


def test_rewriting_identical_content_is_a_no_op(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    path = store.write(4, model())
    before = path.stat().st_mtime_ns

    again = store.write(4, model())

    assert again == path
    assert path.stat().st_mtime_ns == before


def test_rewriting_a_version_with_other_content_is_refused(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    store.write(4, model(seed=1))

    with pytest.raises(ValueError, match=r"version 4 is already stored .* immutable"):
        store.write(4, model(seed=2))

    assert_same(store.load(4), model(seed=1))


def test_versions_ignores_and_removes_temp_files_left_by_a_crash(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    store.write(1, model())
    leftover = tmp_path / f".v00000002.npz.{DEAD_PID}.0123abcd.tmp"
    leftover.write_bytes(b"half a zip")

    assert store.versions() == [1]
    assert not leftover.exists()


def test_opening_a_store_removes_temp_files_left_by_a_crash(tmp_path: Path) -> None:
    leftover = tmp_path / f".v00000002.npz.{DEAD_PID}.ff.tmp"
    leftover.write_bytes(b"half a zip")

    ModelStore(tmp_path)

    assert not leftover.exists()


def test_temp_files_of_a_living_writer_process_are_left_alone(tmp_path: Path) -> None:
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        in_progress = tmp_path / f".v00000002.npz.{writer.pid}.0123abcd.tmp"
        in_progress.write_bytes(b"half a zip")

        store = ModelStore(tmp_path)

        assert store.versions() == []
        assert in_progress.exists()
    finally:
        writer.kill()
        writer.wait()
    assert store.versions() == []
    assert not in_progress.exists()


def test_versions_lists_only_canonical_version_files(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    store.write(7, model())
    store.write(100_000_000, model())
    for name in ("v000000009.npz", "v7.npz", "notes.txt", "v00000008.npz.bak"):
        (tmp_path / name).write_bytes(b"")

    assert store.versions() == [7, 100_000_000]
    assert store.has(7)
    assert not store.has(8)


def test_a_failed_write_leaves_no_version_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ModelStore(tmp_path)

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="Input/output"):
        store.write(1, model())
    monkeypatch.undo()

    assert list(tmp_path.iterdir()) == []
    assert store.versions() == []


def test_retain_keeps_last_best_and_every_mth(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, keep_last=3, keep_every=5)
    for version in range(13):
        store.write(version, model(version))

    deleted = store.retain(current=12, best=2)

    assert deleted == [1, 3, 4, 6, 7, 8, 9]
    assert store.versions() == [0, 2, 5, 10, 11, 12]


def test_retain_never_deletes_current_and_leaves_newer_versions(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, keep_last=1, keep_every=1000)
    for version in (3, 4, 5, 6):
        store.write(version, model(version))

    deleted = store.retain(current=5, best=None)

    assert deleted == [3, 4]
    assert store.versions() == [5, 6]


@st.composite
def retention_cases(draw: st.DrawFn) -> tuple[set[int], int, int, int, int | None]:
    """(stored versions, keep_last, keep_every, current, best)."""
    stored = draw(st.sets(st.integers(0, 24), min_size=1, max_size=12))
    current = draw(st.sampled_from(sorted(stored)))
    best = draw(st.one_of(st.none(), st.integers(0, 24)))
    return stored, draw(st.integers(1, 5)), draw(st.integers(1, 8)), current, best


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=retention_cases())
def test_retain_keeps_exactly_the_retention_set(
    tmp_path: Path, case: tuple[set[int], int, int, int, int | None]
) -> None:
    stored, keep_last, keep_every, current, best = case
    directory = tmp_path / f"store-{len(list(tmp_path.iterdir()))}"
    store = ModelStore(directory, keep_last=keep_last, keep_every=keep_every)
    for version in stored:
        store.write(version, [("w", np.zeros(1, np.float32))])

    deleted = store.retain(current=current, best=best)

    upto = sorted(v for v in stored if v <= current)
    expected_kept = (
        set(upto[-keep_last:])
        | {v for v in stored if v % keep_every == 0}
        | ({best} & stored)
        | {v for v in stored if v >= current}
    )
    assert set(store.versions()) == expected_kept
    assert sorted(deleted) == sorted(stored - expected_kept)


def test_listing_versions_during_a_write_keeps_its_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, lister = ModelStore(tmp_path), ModelStore(tmp_path)
    real_fsync = os.fsync
    listed: list[list[int]] = []

    def fsync_while_listing(fd: int) -> None:
        # Runs while the temp file exists: the moment a crash leftover would be cleaned.
        listed.append(lister.versions())
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync_while_listing)

    writer.write(1, model())

    monkeypatch.undo()
    assert listed[0] == []
    assert_same(writer.load(1), model())


def test_discard_after_removes_versions_never_committed(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    for version in (1, 2, 3):
        store.write(version, model(version))

    deleted = store.discard_after(1)

    assert deleted == [2, 3]
    assert store.versions() == [1]
    store.write(2, model(99))
    assert_same(store.load(2), model(99))


def test_loading_a_missing_version_says_it_is_not_stored(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)

    with pytest.raises(FileNotFoundError, match="version 9 is not in the model store"):
        store.load(9)


def test_loading_a_damaged_checkpoint_names_the_file(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    path = store.write(1, model())
    path.write_bytes(path.read_bytes()[:100])

    with pytest.raises(ValueError, match=r"checkpoint .*v00000001.npz is unreadable"):
        store.load(1)


def test_a_checkpoint_with_a_pickled_entry_is_refused(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    path = store.path(1)
    with zipfile.ZipFile(path, "w") as archive, archive.open("x.npy", "w") as member:
        np.lib.format.write_array(member, np.array([{"a": 1}], dtype=object), allow_pickle=True)

    with pytest.raises(ValueError, match="unreadable"):
        store.load(1)


@pytest.mark.parametrize(
    ("tensors", "error", "message"),
    [
        ([], ValueError, "at least one tensor"),
        ([("a", np.zeros(1)), ("a", np.zeros(1))], ValueError, "appears twice"),
        ([("", np.zeros(1))], ValueError, "non-empty string"),
        ([("a\x00b", np.zeros(1))], ValueError, "NUL"),
        ([("\ud800", np.zeros(1))], ValueError, "not valid Unicode"),
        ([("a", np.array([None]))], ValueError, "object arrays"),
        ([("a", [1.0, 2.0])], TypeError, "numpy.ndarray"),
    ],
)
def test_write_refuses_what_cannot_round_trip(
    tmp_path: Path, tensors: Model, error: type[Exception], message: str
) -> None:
    store = ModelStore(tmp_path)

    with pytest.raises(error, match=message):
        store.write(1, tensors)

    assert store.versions() == []


def test_versions_must_be_non_negative_integers(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)

    with pytest.raises(ValueError, match="version is >= 0"):
        store.path(-1)
    with pytest.raises(TypeError, match="integer"):
        store.path(True)


def test_store_refuses_retention_settings_below_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep_last"):
        ModelStore(tmp_path, keep_last=0)
    with pytest.raises(ValueError, match="keep_every"):
        ModelStore(tmp_path, keep_every=0)


def test_checkpoint_is_fsynced_before_it_becomes_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ModelStore(tmp_path)
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)

    store.write(1, model())

    # File data before the rename, the directory entry after it.
    assert events == ["fsync", "replace", "fsync"]


names = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), min_size=1)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tensor_names=st.lists(names, min_size=1, max_size=5, unique=True))
def test_any_unicode_tensor_names_round_trip(tmp_path: Path, tensor_names: list[str]) -> None:
    store = ModelStore(tmp_path)
    tensors = [(name, np.full(2, i, np.float32)) for i, name in enumerate(tensor_names)]
    version = len(store.versions())

    store.write(version, tensors)

    assert_same(store.load(version), tensors)


WRITER = """
import sys
from pathlib import Path
import numpy as np
from fedrl.server.storage.model_store import ModelStore

store = ModelStore(Path(sys.argv[1]), keep_last=1000)
version = max(store.versions(), default=-1)
while True:
    version += 1
    values = np.random.default_rng(version).standard_normal(500_000).astype(np.float32)
    store.write(version, [("w", values)])
    print(version, flush=True)
"""


def test_kill_9_during_writes_leaves_only_complete_versions(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    acknowledged = -1

    for _ in range(3):
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        for _ in range(int(rng.integers(1, 6))):
            acknowledged = int(child.stdout.readline())
        time.sleep(float(rng.uniform(0, 0.01)))
        child.kill()
        child.wait()
        child.stdout.close()

        store = ModelStore(tmp_path, keep_last=1000)
        versions = store.versions()

        assert versions == list(range(len(versions)))
        assert versions[-1] >= acknowledged
        for version in versions:
            expected = np.random.default_rng(version).standard_normal(500_000)
            assert np.array_equal(store.load(version)[0][1], expected.astype(np.float32))
        assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []
