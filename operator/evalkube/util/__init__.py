"""Leaf helpers every layer may use: fast JSON, GC tuning, the parent-death signal, listen
addresses and bearer tokens, request-body shapes. Imports nothing from evalkube."""
