"""The demo scenario: many worker processes, some SIGKILLed, some frozen past their lease.

``scenario`` runs it, ``proc`` is the worker process, ``ledger`` records what the handlers and
workers actually did, and ``checks`` holds that record and the store to the invariants.
"""
