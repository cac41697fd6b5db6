"""The aggregation server. numpy only: nothing under fedrl.server imports torch."""
