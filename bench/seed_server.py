"""The seed's serving pattern, the baseline `bench.inference` beats: one thread per request
calling `model.generate` with a TextIteratorStreamer, greedy, exactly max_tokens tokens.

    .venv/bin/python -m bench.seed_server --port 8100 [--dtype auto]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from inference.model_store import LoadedModel, prepare_model
from inference.settings import Settings


def seed_app(loaded: LoadedModel) -> FastAPI:
    from transformers import TextIteratorStreamer

    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        tok = loaded.tokenizer
        ids = tok.apply_chat_template(
            body["messages"], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True)
        n = body["max_tokens"]
        kwargs = dict(**ids, streamer=streamer, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        threading.Thread(target=loaded.model.generate, kwargs=kwargs, daemon=True).start()
        return StreamingResponse(_chunks(streamer, n), media_type="text/event-stream")

    return app


async def _chunks(streamer: Any, n: int) -> AsyncIterator[str]:
    it = iter(streamer)
    while (text := await asyncio.to_thread(next, it, None)) is not None:
        if text:
            yield f"data: {json.dumps({'choices': [{'delta': {'content': text}, 'finish_reason': None}]})}\n\n"
    end = {"choices": [{"delta": {}, "finish_reason": "length"}], "usage": {"completion_tokens": n}}
    yield f"data: {json.dumps(end)}\n\n"
    yield "data: [DONE]\n\n"


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    loaded = prepare_model(
        Settings(model="", dtype=args.dtype, device="auto"), progress=lambda _: None
    )
    uvicorn.run(seed_app(loaded), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
