"""The event transport: how a conversation's events reach the browser.

channels.py names a conversation's channel and its events URL; publish.py publishes events;
memory_log.py (one process) and redis_log.py (several) keep recent events so a reconnecting
browser is replayed exactly what it missed; delivery.py carries events between processes
through Redis, over resp.py's lean connection; sse.py is the endpoint browsers subscribe
to. eventstream.py is the only module that touches django-eventstream.
"""
