"""The participant: rollout actors, DQN learner, replay, sync loop, local store, CLI."""
