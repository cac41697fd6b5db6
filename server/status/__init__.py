"""The status read model above the features, and global_state.json written from it."""
