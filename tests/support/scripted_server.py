"""A scripted OpenAI-compatible server for failure tests: each request gets the next
behaviour from a list (503, an error chunk, silence, a dropped connection…)."""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def chunk(text=None, finish=None, role=False) -> bytes:
    delta = {}
    if role:
        delta["role"] = "assistant"
    if text is not None:
        delta["content"] = text
    # Our server's shape, so that a text chunk takes the relay's fast path.
    body = {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "scripted",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


# What a strict server ("strict") takes; anything else in a request body is a 400.
STANDARD_FIELDS = {"messages", "model", "stream", "stream_options", "max_tokens", "temperature"}
STANDARD_FIELDS |= {"top_p", "frequency_penalty", "presence_penalty", "seed", "stop"}


class ScriptedHandler(BaseHTTPRequestHandler):
    """One request, served with the next behaviour of its ScriptedServer (`server.script`)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._json(200, {"data": [{"id": "scripted", "context_length": 2048}]})

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        script = self.server.script
        script.requests += 1
        script.bodies.append(request)
        behaviour = script.behaviours.pop(0) if script.behaviours else "ok"
        if behaviour == "strict" and set(request) - STANDARD_FIELDS:
            # a strict OpenAI-compatible API: a field it does not know is a 400 naming it
            unknown = ", ".join(sorted(set(request) - STANDARD_FIELDS))
            message = f"Unrecognized request argument supplied: {unknown}"
            self._json(400, {"error": {"message": message, "type": "invalid_request_error"}})
            return
        script.open_streams += 1
        try:
            getattr(self, f"_{behaviour}", None) and getattr(self, f"_{behaviour}")()
            if behaviour in ("503", "401", "404", "400"):
                status = int(behaviour)
                self._json(
                    status, {"error": {"message": f"scripted {status}", "type": "x", "code": None}}
                )
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            script.open_streams -= 1

    def _json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 503:
            self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(data)

    def _start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()

    def _words(self):
        for i, word in enumerate(self.server.script.words):
            self.wfile.write(chunk(word, role=i == 0))
            self.wfile.flush()
            time.sleep(0.02)

    def _ok(self):
        self._start_stream()
        self._words()
        self.wfile.write(chunk(finish="stop") + b"data: [DONE]\n\n")

    def _strict(self):  # a request with no unknown field
        self._ok()

    def _error_chunk(self):
        self._start_stream()
        self._words()
        self.wfile.write(
            b'data: {"error": {"message": "CUDA fell over", "type": "server_error"}}\n\n'
        )

    def _silent(self):
        self._start_stream()
        self._idle()

    def _stall(self):
        self._start_stream()
        self._words()
        self._idle()

    def _idle(self):
        # SSE comments carry no text, so they must not count as progress; writing
        # them lets this server notice when the client hangs up.
        for _ in range(300):
            self.wfile.write(b": ping\n\n")
            self.wfile.flush()
            time.sleep(0.1)

    def _drop(self):
        self._start_stream()
        self._words()
        self.connection.shutdown(socket.SHUT_RDWR)


class ScriptedServer:
    """Behaviours: "ok", "503", "401", "404", "400", "error_chunk", "silent", "stall", "drop",
    "strict" (a 400 for a field outside STANDARD_FIELDS, else "ok")."""

    def __init__(self, behaviours: list[str], words=("Hello", " there", " friend")):
        self.behaviours = list(behaviours)
        self.words = words
        self.requests = 0
        self.bodies: list[dict] = []  # each request's JSON, in order
        self.open_streams = 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedHandler)
        self.httpd.script = self
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
