"""agentlease: leases, fencing and heartbeats for many agents sharing work."""
