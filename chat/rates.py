"""How fast a reply was written, computed the same way everywhere (the relay's
`message.end`, the saved message, the warmup command)."""


def decode_rate(
    tokens: int | None, ttft_seconds: float | None, total_seconds: float
) -> float | None:
    """Tokens per second after the first token: the first one's wait is TTFT, not speed."""
    if not tokens or tokens < 2 or ttft_seconds is None or total_seconds <= ttft_seconds:
        return None
    return (tokens - 1) / (total_seconds - ttft_seconds)
