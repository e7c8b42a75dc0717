"""Writes to a socket tried at the end of the loop turn, not after a round through epoll.

Twisted's asyncio reactor registers a socket for writing on every write, waits for the
next poll to say it is writable, writes, and removes the registration: for one token event
to one open stream that is two epoll changes, a poll result and four layers of Twisted's
logging context. At 200 streams that was about a tenth of the site's CPU (bench.relay's
profile). Here the first write of a loop turn schedules one callback that writes every
socket written to in that turn; only a socket that does not take all its data at once is
registered with the loop, as before, and finishes through epoll.

Only `python -m tokenstream_site.serve` installs it (TOKENSTREAM_EAGER_WRITES=0 does not).
"""

from twisted.internet.asyncioreactor import AsyncioSelectorReactor

_register = AsyncioSelectorReactor.addWriter
_unregister = AsyncioSelectorReactor.removeWriter


def _add_writer(self, writer) -> None:
    if writer in self._writers:
        return
    pending = self.__dict__.setdefault("_eager_pending", {})
    if writer in pending:
        return
    if not pending:
        self._asyncioEventloop.call_soon(_write_pending, self)
    pending[writer] = True


def _remove_writer(self, writer) -> None:
    for name in ("_eager_pending", "_eager_writing"):
        waiting = self.__dict__.get(name)
        if waiting and writer in waiting:
            del waiting[writer]  # it wrote all it had (or closed) before being registered
            return
    _unregister(self, writer)


def _write_pending(self) -> None:
    pending, self._eager_pending = self._eager_pending, {}
    for writer in pending:
        # A writer that sends everything calls stopWriting, which removes it from here.
        self._eager_writing = {writer: True}
        self._readOrWrite(writer, False)
        wants_more = writer in self._eager_writing
        self._eager_writing = None
        if wants_more and writer.fileno() != -1:
            _register(self, writer)


def install() -> None:
    AsyncioSelectorReactor.addWriter = _add_writer
    AsyncioSelectorReactor.removeWriter = _remove_writer
