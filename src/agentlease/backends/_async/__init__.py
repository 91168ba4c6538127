"""Backends written once for asyncio; ``backends/_sync`` is generated from them."""
