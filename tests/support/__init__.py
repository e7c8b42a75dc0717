"""What the tests and the benchmarks share: real processes (processes), the in-process
inference app (inference_app), one SSE parser (sse), a client that behaves like the page
(site_client), test data (factories), and scripted peers for fault tests (scripted_server,
tcp_proxy). Tests import from here, never from a conftest module."""
