"""The learning engine: actor processes, shared memory, replay and rollouts, networks, learners."""
