"""`python -m tokenstream_site.serve`: daphne, with two settings that matter under load.

- uvloop as the asyncio loop under daphne's Twisted reactor when it is installed (and
  TOKENSTREAM_UVLOOP is not 0): every SSE write registers the socket with the loop for
  writing and back, and every relayed token wakes a few tasks; uvloop does both in C.
- A listen backlog of 2048 (daphne's default is Twisted's 50): a burst of new pages (a
  reconnect storm after a restart) otherwise finds its connections refused before the
  process even sees them.
- Twisted's own parsing of POST bodies off: it parsed every POST's Content-Type through the
  `email` package (and form bodies into request.args), which daphne never reads; Django
  parses the body it is handed itself.
- The open-file limit raised to what the system allows (up to 65,536): every open event
  stream is an open file, and the site admits streams up to half of this limit.

Arguments are daphne's; `--port`/`--bind` become an endpoint with that backlog.
"""

import os
import resource
import sys

BACKLOG = int(os.environ.get("TOKENSTREAM_LISTEN_BACKLOG", "2048"))
APPLICATION = "tokenstream_site.asgi:application"


def use_uvloop() -> bool:
    if os.environ.get("TOKENSTREAM_UVLOOP", "1") == "0":
        return False
    try:
        import uvloop
    except ImportError:
        return False
    # Before daphne.server is imported: it creates its loop at import time.
    uvloop.install()
    return True


def skip_twisted_form_parsing() -> None:
    """Every request daphne makes is built without Twisted's POST form parsing."""
    from daphne.http_protocol import WebRequest

    init = WebRequest.__init__
    if getattr(init, "skips_form_parsing", False):
        return

    def __init__(self, *args, **kwargs):
        init(self, *args, **{"parsePOSTFormSubmission": False, **kwargs})

    __init__.skips_form_parsing = True
    WebRequest.__init__ = __init__


def raise_open_file_limit(ceiling: int = 65536) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def daphne_args(host: str, port: int) -> list[str]:
    interface = host.replace(":", r"\:")
    return ["-e", f"tcp:port={port}:interface={interface}:backlog={BACKLOG}", APPLICATION]


def main(argv: list[str]) -> None:
    use_uvloop()
    raise_open_file_limit()
    skip_twisted_form_parsing()
    from daphne.cli import CommandLineInterface

    host = os.environ.get("SITE_HOST", "127.0.0.1")
    port = int(os.environ.get("SITE_PORT", "8000"))
    args = argv or daphne_args(host, port)
    CommandLineInterface().run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
