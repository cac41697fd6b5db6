"""Q-network shape, dueling identity, and its weights as named arrays."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from fedrl.client.training.q_network import (
    QNetwork,
    architecture_name,
    build_q_network,
    load_named_arrays,
    named_arrays,
)


def test_q_network_flattens_observations_to_one_value_per_action() -> None:
    network = build_q_network((2, 3), 4, hidden=(8, 8))

    q = network(torch.zeros(5, 2, 3))

    assert q.shape == (5, 4)
    assert q.dtype == torch.float32


def test_dueling_q_values_average_to_the_state_value() -> None:
    torch.manual_seed(0)
    network = build_q_network((3,), 5, hidden=(16,), dueling=True)
    assert isinstance(network, QNetwork)
    obs = torch.randn(7, 3)

    q = network(obs)

    # Q = V + A - mean(A)  =>  mean_a Q = V.
    value = network.value(network.torso(obs)).squeeze(1)
    torch.testing.assert_close(q.mean(dim=1), value)


def test_named_arrays_are_float32_copies_in_parameter_order() -> None:
    network = build_q_network((4,), 2, hidden=(8,), dueling=False)

    arrays = named_arrays(network)
    arrays[0][1][...] = 123.0

    assert [name for name, _ in arrays] == [name for name, _ in network.named_parameters()]
    assert all(array.dtype == np.float32 for _, array in arrays)
    assert not torch.any(next(network.parameters()) == 123.0)


def test_load_named_arrays_round_trips_between_networks() -> None:
    source = build_q_network((4,), 2, hidden=(8, 8))
    destination = build_q_network((4,), 2, hidden=(8, 8))
    obs = torch.randn(3, 4)

    load_named_arrays(destination, named_arrays(source))

    torch.testing.assert_close(destination(obs), source(obs))


def test_load_named_arrays_refuses_a_wrong_shape_and_changes_nothing() -> None:
    network = build_q_network((4,), 2, hidden=(8,))
    before = named_arrays(network)
    arrays = [(name, np.ones_like(array)) for name, array in before]
    arrays[-1] = (arrays[-1][0], np.ones((3,), dtype=np.float32))

    with pytest.raises(ValueError, match=r"advantage\.bias' has shape \(3,\), expected \(2,\)"):
        load_named_arrays(network, arrays)

    for (_, old), (_, now) in zip(before, named_arrays(network), strict=True):
        np.testing.assert_array_equal(old, now)


Arrays = list[tuple[str, np.ndarray]]
Edit = Callable[[Arrays], Arrays]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda arrays: arrays[:-1], "expected 6 tensors, got 5"),
        (lambda arrays: [("renamed", arrays[0][1]), *arrays[1:]], "named 'renamed'"),
        (
            lambda arrays: [(arrays[0][0], np.full_like(arrays[0][1], np.nan)), *arrays[1:]],
            "NaN",
        ),
    ],
)
def test_load_named_arrays_names_the_mismatch(edit: Edit, message: str) -> None:
    network = build_q_network((4,), 2, hidden=(8,))

    with pytest.raises(ValueError, match=message):
        load_named_arrays(network, edit(named_arrays(network)))


def test_architecture_name_tells_shapes_apart() -> None:
    assert architecture_name((256, 256), True) == "dqn/dueling-mlp-256x256"
    assert architecture_name((64,), False) == "dqn/mlp-64"


def test_build_q_network_refuses_empty_shapes() -> None:
    with pytest.raises(ValueError, match="obs_shape"):
        build_q_network((), 2)
    with pytest.raises(ValueError, match="n_actions"):
        build_q_network((4,), 0)
