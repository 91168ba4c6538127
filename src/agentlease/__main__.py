"""``python -m agentlease`` runs the command line."""

from agentlease.cli import main

main()
