"""`python -m tokenstream_site.serve`'s changes to daphne (its live use: tests/e2e sign in
through forms served by it)."""

from types import SimpleNamespace

from daphne.http_protocol import WebRequest
from twisted.web.test.requesthelper import DummyChannel

from tokenstream_site import serve


def _request() -> WebRequest:
    channel = DummyChannel()
    channel.factory = SimpleNamespace(server=SimpleNamespace(protocol_connected=lambda r: None))
    return WebRequest(channel)


def test_daphnes_requests_leave_post_bodies_to_django(monkeypatch):
    monkeypatch.setattr(WebRequest, "__init__", WebRequest.__init__)  # put back afterwards
    assert _request()._parsePOSTFormSubmission is True  # Twisted's default
    serve.skip_twisted_form_parsing()
    serve.skip_twisted_form_parsing()  # once is enough: not wrapped twice
    assert _request()._parsePOSTFormSubmission is False
    assert WebRequest.__init__.skips_form_parsing
