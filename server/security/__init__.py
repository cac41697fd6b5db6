"""Who may call: authentication of every call, and the TLS material commands."""
