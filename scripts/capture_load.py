#!/usr/bin/env python3
"""Captures streamed answers under load: CLIENTS closed-loop clients send COUNT requests in all
to one API of an engine and keep every SSE event with the time it arrived (ms after its request
was sent), for tests that replay them (scripts/capture-load.sh runs it on a real vLLM).

  capture_load.py HOST:PORT API MODEL PROMPTS CLIENTS COUNT MAX_TOKENS OUT.jsonl.gz

API is responses or messages. Requests are sampled (temperature 1), so some tokens are held
back. One JSON line per request, in the order they were sent: {"api", "clients",
"max_tokens", "events": [[t_ms, raw event text], ...]}. Standard library only: HTTP/1.0, so
the body is not chunked, and each event is stamped when the bytes that complete it come off the
socket.
"""
import gzip
import json
import sys
import threading

from raw_client import ROUTES, raw_events, send


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
    """Sends one request; returns [[t_ms, event text], ...], or raises on a status other than
    200."""
    sock, sent = send(addr, path, payload)
    return [[round((now - sent) * 1e3, 3), event.decode() + "\n\n"] for now, event in raw_events(sock)]


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
