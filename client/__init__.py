"""The participant: training/ learns, federation/ talks to the server, commands/ are run."""
