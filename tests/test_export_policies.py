"""Export and backtest of PPO policies and transformer networks: they act like the original."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedrl.client.commands.backtest import WindowedPolicy, load_policy, run_backtest
from fedrl.client.commands.export import ExportConfig, ExportError, compare_policy, export_model
from fedrl.client.commands.state_dir import ModelIdentity, StateDir
from fedrl.client.training.architecture import infer_architecture
from fedrl.client.training.counters import Counters
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.obs_window import windowed_shape
from fedrl.client.training.policy_network import GreedyPolicy, build_actor_critic
from fedrl.client.training.q_network import build_q_network, named_arrays
from fedrl.client.training.vector_env import EnvShape, env_shape, make_vector_env
from fedrl.envs.trading import TradingEnv
from fedrl.envs.trading_config import TradingConfig

MLP = NetworkConfig()
TRANSFORMER = NetworkConfig(
    policy="transformer", context=4, transformer_layers=1, transformer_width=16
)


def saved(tmp_path: Path, env_id: str, net: nn.Module, architecture: str) -> Path:
    state = StateDir(tmp_path / "state", "Макар", ModelIdentity(env_id, architecture))
    state.save_model(named_arrays(net), Counters(episodes=3))
    return state.path / "model.pt"


def actor_critic(env_id: str, network: NetworkConfig = MLP) -> nn.Module:
    torch.manual_seed(3)
    env = make_vector_env(env_id, 1, window=network.window)
    shape = env_shape(env, continuous=True)
    env.close()
    net = build_actor_critic(shape.obs_shape, shape, hidden=(16, 16), network=network)
    # A trained policy's logits are far apart; fresh ones (gain 0.01) all but tie.
    with torch.no_grad():
        net.policy.head.weight.mul_(100.0)
    return net.eval()


def load_torchscript(path: Path) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module: nn.Module = torch.jit.load(str(path))
    return module


def test_a_discrete_ppo_policy_exports_its_greedy_action(tmp_path: Path) -> None:
    onnxruntime = pytest.importorskip("onnxruntime")
    net = actor_critic("CartPole-v1")
    model = saved(tmp_path, "CartPole-v1", net, "ppo/mlp-16x16")

    report = export_model(ExportConfig(model=model, format="onnx", out=tmp_path / "pi.onnx"))

    session = onnxruntime.InferenceSession(str(tmp_path / "pi.onnx"))
    obs = np.random.default_rng(5).standard_normal((200, 4)).astype(np.float32)
    (action,) = session.run(["action"], {"obs": obs})
    with torch.no_grad():
        expected = GreedyPolicy(net)(torch.from_numpy(obs)).numpy()
    assert action.dtype == np.int64
    np.testing.assert_array_equal(action, expected)
    assert "'action' int64 [batch]" in report.output


def test_a_box_ppo_policy_exports_its_mean_action_within_the_bounds(tmp_path: Path) -> None:
    net = actor_critic("Pendulum-v1")
    model = saved(tmp_path, "Pendulum-v1", net, "ppo/mlp-16x16")

    report = export_model(ExportConfig(model=model, format="torchscript", out=tmp_path / "pi.pt"))

    obs = np.random.default_rng(5).standard_normal((200, 3)).astype(np.float32) * 5
    with torch.no_grad():
        exported = load_torchscript(tmp_path / "pi.pt")(torch.from_numpy(obs)).numpy()
        mean = net.policy(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(exported, np.clip(mean, -2.0, 2.0), rtol=1e-6)
    assert report.n_actions == 0 and "[batch, 1]: the mean action" in report.output


def test_a_transformer_exports_with_windows_as_its_input(tmp_path: Path) -> None:
    onnxruntime = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    net = build_q_network((4, 5), 2, network=TRANSFORMER).eval()
    model = saved(tmp_path, "CartPole-v1", net, "dqn/dueling-transformer-k4-l1-w16")

    report = export_model(ExportConfig(model=model, format="onnx", out=tmp_path / "q.onnx"))

    session = onnxruntime.InferenceSession(str(tmp_path / "q.onnx"))
    windows = np.random.default_rng(1).standard_normal((9, 4, 5)).astype(np.float32)
    windows[:, :2, -1] = [0.0, 1.0]
    (q,) = session.run(["q_values"], {"obs": windows})
    with torch.no_grad():
        np.testing.assert_allclose(q, net(torch.from_numpy(windows)).numpy(), atol=1e-5)
    assert report.obs_shape == (4, 5)


def test_architectures_are_read_back_from_tensors_alone() -> None:
    box = infer_architecture(named_arrays(actor_critic("Pendulum-v1", TRANSFORMER)))
    dqn = infer_architecture(named_arrays(build_q_network((7,), 3, hidden=(8, 4), dueling=False)))

    assert (box.algorithm, box.action_dim, box.n_actions, box.window) == ("ppo", 1, 0, 4)
    assert box.network == TRANSFORMER and box.obs_dim == 3
    assert (dqn.algorithm, dqn.hidden, dqn.dueling, dqn.n_actions) == ("dqn", (8, 4), False, 3)


def test_a_box_policy_for_another_env_is_refused(tmp_path: Path) -> None:
    model = saved(tmp_path, "Pendulum-v1", actor_critic("Pendulum-v1"), "ppo/mlp-16x16")

    with pytest.raises(ExportError, match="the env has 2 discrete actions, the network 1-dim"):
        export_model(
            ExportConfig(model=model, format="torchscript", out=tmp_path / "x", env="CartPole-v1")
        )


def test_a_box_action_off_by_more_than_the_tolerance_fails_the_check() -> None:
    original = np.array([[0.5], [1.0]], dtype=np.float32)

    with pytest.raises(ExportError, match="differ from the original"):
        compare_policy(original, original + np.array([[0.0], [0.01]], np.float32), None)


def test_a_transformer_ppo_policy_backtests_on_windows(tmp_path: Path) -> None:
    # prepare: a PPO transformer over the trading env's (small) observations
    config = TradingConfig(window=2, synthetic_bars=1_500)
    flat = TradingEnv(config)
    windowed = EnvShape(windowed_shape(flat.obs_shape, 4), flat.n_actions)
    torch.manual_seed(0)
    net = build_actor_critic(windowed.obs_shape, windowed, hidden=(), network=TRANSFORMER)
    torch.save({"tensors": dict(net.named_parameters())}, tmp_path / "model.pt")

    # act
    policy = load_policy(tmp_path / "model.pt", flat.obs_shape, flat.n_actions)
    result = run_backtest(policy, config)

    # assert
    assert isinstance(policy, WindowedPolicy) and policy.context == 4
    assert len(result.policy.positions) == len(result.buy_and_hold.positions) > 100
    with pytest.raises(ValueError, match=r"reads 14 features per observation, .* have 61"):
        load_policy(tmp_path / "model.pt", (61,), flat.n_actions)


def test_a_ppo_learner_state_with_a_shared_transformer_torso_loads_for_backtests(
    tmp_path: Path,
) -> None:
    net = actor_critic("CartPole-v1", TRANSFORMER)
    assert net.shared
    torch.save({"net": net.state_dict(), "updates": 1}, tmp_path / "learner.pt")
    windows = np.random.default_rng(2).standard_normal((6, 4, 5)).astype(np.float32)
    windows[..., -1] = 1.0

    policy = load_policy(tmp_path / "learner.pt", (4,), 2)

    assert isinstance(policy, WindowedPolicy)
    with torch.no_grad():
        expected = net.greedy(torch.from_numpy(windows)).numpy()
    np.testing.assert_array_equal(policy.act(windows), expected)
