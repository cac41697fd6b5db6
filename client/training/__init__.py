"""The learning engine: actor processes, shared memory, replay, the Q-network and its learner."""
