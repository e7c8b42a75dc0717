"""Server-sent events as the tests and benchmarks read them: one parser for every stream
(the site's event streams and the inference server's chunks)."""

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass
class SseEvent:
    event: str
    id: str | None
    data: dict | str

    @property
    def json(self) -> dict:
        return self.data if isinstance(self.data, dict) else {}


def parse_sse_block(block: str) -> SseEvent | None:
    event, event_id, data_lines = "message", None, []
    for line in block.split("\n"):
        if line.startswith(":") or not line:
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "id":
            event_id = value
        elif name == "data":
            data_lines.append(value)
    if not data_lines and event == "message":
        return None
    raw = "\n".join(data_lines)
    try:
        data = json.loads(raw) if raw else ""
    except ValueError:
        data = raw
    return SseEvent(event, event_id, data)


def sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The `data:` payloads of an SSE body read line by line, in order."""
    for line in lines:
        if line.startswith("data: "):
            yield line[len("data: ") :]
