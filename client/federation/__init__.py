"""Everything a participant says to the server: weights, experience, the outbox, the channel."""
