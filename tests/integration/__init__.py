"""Integration tests: the command line and the bench against real stores."""
