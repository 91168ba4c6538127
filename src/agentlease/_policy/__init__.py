"""Pure decisions, no I/O: lease arithmetic, retry and backoff, keys, transitions, record writes."""
