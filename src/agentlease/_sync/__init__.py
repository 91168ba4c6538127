# Generated from agentlease/_async/__init__.py by scripts/unasync.py. DO NOT EDIT.
# Edit the asyncio source and run: python scripts/unasync.py
"""The I/O orchestration, written once for asyncio; ``_sync`` is generated from it."""
