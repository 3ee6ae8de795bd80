"""A scripted LLM judge: a real HTTP server on 127.0.0.1 with canned OpenAI chat-completions replies (the judge
reward's tests and the judge hack probe)."""

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def chat(content, top=None):
    """An OpenAI chat-completions reply; `top` = [(token, probability)] as the first token's top_logprobs."""
    choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
    if top is not None:
        choice["logprobs"] = {"content": [{
            "token": top[0][0], "logprob": math.log(top[0][1]),
            "top_logprobs": [{"token": t, "logprob": math.log(p)} for t, p in top],
        }]}
    return {"id": "x", "object": "chat.completion", "choices": [choice]}


class JudgeServer:
    """Canned replies chosen by a marker in the last message: marker -> list of replies (the last one repeats).

    A reply is (status, JSON-able body or raw bytes), or a callable(request body) returning one.
    """

    def __init__(self):
        self.routes = {}
        self.requests = []  # (path, headers, body) of every request
        self.lock = threading.Lock()
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append((self.path, dict(self.headers), body))
                content = body["messages"][-1]["content"]
                marker = next((m for m in server.routes if m in content), None)
                if marker is None:
                    status, reply = 404, {"error": "no route"}
                else:
                    with server.lock:
                        queue = server.routes[marker]
                        reply = queue.pop(0) if len(queue) > 1 else queue[0]
                    status, reply = reply(body) if callable(reply) else reply
                data = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def count(self, marker):
        return sum(marker in b["messages"][-1]["content"] for _, _, b in self.requests)
