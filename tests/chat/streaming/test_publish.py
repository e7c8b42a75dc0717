"""Token event data is built as text once per token: it must read exactly as json.dumps of
the same dict would (the log, the SSE frames and the page see the same bytes either way)."""

import json
import uuid

import pytest

from chat.streaming.publish import token_data, token_data_prefix


@pytest.mark.parametrize(
    "text",
    ["one", ' "quoted" ', "back\\slash", "line\nbreak\ttab", "é ü 日本 🙂", "\u2028", ""],
)
@pytest.mark.parametrize("produced_at", [None, 1234.5678901234, 0.0, 1e-07, 1.5e300, 1764600000])
def test_token_data_is_what_json_dumps_writes(text, produced_at):
    message_id = uuid.uuid4()
    data = {"message_id": str(message_id), "seq": 41, "text": text}
    if produced_at is not None:
        data["produced_at"] = produced_at
    built = token_data(token_data_prefix(message_id), 41, text, produced_at)
    assert built == json.dumps(data)
    assert json.loads(built) == data
