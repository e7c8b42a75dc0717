"""The token relay: for each reply, one asyncio task on the site's event loop streams from
the inference server and republishes every token on the conversation's channel, while one
writer per process saves the streamed text.

manager.py runs the relays (start, stop, the writer, the sweeper); reply.py is one reply's
state and how it ends; stop.py carries Stop between site processes; saving.py writes
replies to the database; prompt.py builds what the model is asked; metrics.py counts.
"""
