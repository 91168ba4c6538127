"""The command line."""


def main() -> None:
    """Entry point."""
