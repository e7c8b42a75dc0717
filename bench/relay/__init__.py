"""Relay benchmark: how much the site adds between the model and the user's eyes.

Starts `python -m inference` (ENGINE=fake, a known pace, each chunk stamped with the
server's monotonic clock) and the site under daphne, then for each N runs N streams through
the site (sign in, POST a message, read the conversation's SSE stream) and N streams read
directly from the inference server, side by side in one run. Latency = arrival at the client
- production at the inference server (same machine, same monotonic clock). Also prints the
site's CPU per relayed token and per send, and optionally a reconnect storm.

    .venv/bin/python -m bench.relay --streams 1,20,200 --tokens 40 --rate 20
"""

from bench.relay.runner import main, parse_args, report, run

__all__ = ["main", "parse_args", "report", "run"]
