"""The fault-injection harness: find concurrency bugs on purpose.

Record a trace of a run (model responses and tool calls), replay it with the plan pinned, inject
faults into the execution (never into the plan), run many seeds, and check invariants over the
history of what the simulated world did rather than over outputs. Nothing here is imported by
``import agentlease``; this package imports no store driver until a run needs one.
"""
