"""Environments fedrl ships, registered with Gymnasium on import."""

import gymnasium

from fedrl.envs.trading import ENV_ID

__all__ = ["ENV_ID"]

# Importing twice (or reloading in a test) must not re-register: Gymnasium warns on overrides.
if ENV_ID not in gymnasium.registry:
    gymnasium.register(
        id=ENV_ID,
        entry_point="fedrl.envs.trading:TradingEnv",
        # make_vec picks this native vector env by default, as it does for CartPole.
        vector_entry_point="fedrl.envs.trading_vector:TradingVectorEnv",
    )
