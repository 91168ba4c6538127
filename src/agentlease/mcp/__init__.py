"""agentlease for MCP agents: a server (:mod:`agentlease.mcp.server`, ``agentlease mcp serve``)
whose tools let any MCP agent take part in shared queues and shared state, and a proxy
(:mod:`agentlease.mcp.proxy`, ``agentlease mcp proxy``) that makes another MCP server's tool
calls idempotent.

Both need the ``mcp`` extra (``pip install 'agentlease[mcp]'``); ``import agentlease`` never
imports this package, and this package imports the MCP SDK only in its submodules.
"""
