"""The I/O orchestration, written once for asyncio; ``_sync`` is generated from it."""
