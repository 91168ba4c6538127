"""Pure decisions with no I/O: lease arithmetic, backoff, retry. Each takes ``now`` and state."""
