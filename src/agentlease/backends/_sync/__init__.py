# Generated from agentlease/backends/_async/__init__.py by scripts/unasync.py. DO NOT EDIT.
# Edit the asyncio source and run: python scripts/unasync.py
"""Backends written once for asyncio; ``backends/_sync`` is generated from them."""
