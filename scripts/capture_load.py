#!/usr/bin/env python3
"""Captures streamed answers under load: CLIENTS closed-loop clients send COUNT requests in all
to one API of an engine and keep every SSE event with the time it arrived (ms after its request
was sent), for tests that replay them (scripts/capture-load.sh runs it on a real vLLM).

  capture_load.py HOST:PORT API MODEL PROMPTS CLIENTS COUNT MAX_TOKENS OUT.jsonl.gz

API is responses or messages. Requests are sampled (temperature 1), so some tokens are held
back. One JSON line per request, in the order they were sent: {"api", "clients",
"max_tokens", "events": [[t_ms, raw event text], ...]}. Standard library only: the body is
de-chunked, and each event stamped when the bytes that complete it come off the socket.
"""
import gzip
import json
import sys
import threading
import time

from raw_client import ROUTES, send


def body(api, model, prompt, max_tokens):
    """A sampled streaming request of `api` (responses or messages)."""
    if api == "responses":
        return {"model": model, "input": prompt, "max_output_tokens": max_tokens, "temperature": 1.0, "stream": True}
    return {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "stream": True,
        "messages": [{"role": "user", "content": prompt}],
    }


def stream(addr, path, payload):
    """Sends one request; returns [[t_ms, event text], ...] (the body de-chunked), or raises on a
    status other than 200."""
    sock, sent = send(addr, path, payload)
    raw, body, events, chunked, head_seen = b"", b"", [], False, False
    while True:
        chunk = sock.recv(65536)
        now = time.monotonic()
        if not chunk:
            break
        raw += chunk
        if not head_seen:
            if b"\r\n\r\n" not in raw:
                continue
            head, raw = raw.split(b"\r\n\r\n", 1)
            status = head.split(b"\r\n", 1)[0]
            if b" 200 " not in status:
                raise RuntimeError(f"status {status!r}")
            chunked = b"transfer-encoding: chunked" in head.lower()
            head_seen = True
        if chunked:
            # Whole chunks only: a size line, its bytes, and their CRLF.
            while b"\r\n" in raw:
                size_line, rest = raw.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                if len(rest) < size + 2:
                    break
                body += rest[:size]
                raw = rest[size + 2 :]
        else:
            body, raw = body + raw, b""
        while b"\n\n" in body:
            event, body = body.split(b"\n\n", 1)
            events.append([round((now - sent) * 1e3, 3), event.decode() + "\n\n"])
    sock.close()
    return events


def main():
    addr, api, model, prompts_path, clients, count, max_tokens, out = sys.argv[1:9]
    clients, count, max_tokens = int(clients), int(count), int(max_tokens)
    prompts = [json.loads(line)["prompt"] for line in open(prompts_path)]
    results = [None] * count
    next_index = iter(range(count))
    lock = threading.Lock()

    def client():
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            results[i] = stream(addr, ROUTES[api], body(api, model, prompts[i % len(prompts)], max_tokens))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with gzip.open(out, "wt") as f:
        for events in results:
            f.write(json.dumps({"api": api, "clients": clients, "max_tokens": max_tokens, "events": events}) + "\n")
    print(f"{count} {api} requests from {clients} clients in {out}")


if __name__ == "__main__":
    main()
