"""Environments fedrl ships, registered with Gymnasium on import."""
