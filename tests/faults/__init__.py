"""Fault tests that own and break their own private servers."""
