"""tokenstream inference server: an OpenAI-compatible, continuously batching model server.

Run it with ``python -m inference`` (``--help`` lists every setting). It never imports Django.
"""
