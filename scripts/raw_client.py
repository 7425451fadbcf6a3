#!/usr/bin/env python3
"""A raw-socket streaming client for scripts/e2e-vllm.sh: stamps every SSE event as it arrives
and compares each request with what llmslo logged for it.

  raw_client.py ttft HOST:PORT LLMSLO_LOG MODEL COUNT [API]
      COUNT sequential streaming requests to API (chat, the default; responses; messages); per
      request, the client's TTFT (request sent to the first event with visible content) against
      llmslo's ttft_ms. The bar is 1 ms.
  raw_client.py tpot HOST:PORT LLMSLO_LOG MODEL COUNT N MAX_TOKENS LABEL
      COUNT sequential requests with n=N, max_tokens=MAX_TOKENS and ignore_eos, so every choice
      has exactly MAX_TOKENS tokens; per choice the true TPOT is (t_last - t_first) /
      (MAX_TOKENS - 1) from the client's stamps; llmslo logs its slowest choice's TPOT, compared
      with the slowest true one.

Standard library only. HTTP/1.0, so the body is not chunked and events are read as they come.
"""
import json
import socket
import sys
import time


ROUTES = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def send(addr, path, body, headers=None):
    """Sends one JSON POST (with any further `headers`) over HTTP/1.0 on a new connection;
    returns (socket, t_sent)."""
    host, port = addr.rsplit(":", 1)
    payload = json.dumps(body).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (
        f"POST {path} HTTP/1.0\r\nHost: {host}\r\ncontent-type: application/json\r\n{extra}"
        f"content-length: {len(payload)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t_sent = time.monotonic()
    sock.sendall(head + payload)
    return sock, t_sent


def raw_events(sock):
    """Reads a streamed HTTP/1.0 answer off `sock` (not chunked: HTTP/1.0) and yields each
    SSE event's bytes with the time the bytes that complete it arrived; raises on a status
    other than 200."""
    buf, in_body = b"", False
    while True:
        data = sock.recv(65536)
        now = time.monotonic()
        if not data:
            break
        buf += data
        if not in_body:
            if b"\r\n\r\n" not in buf:
                continue
            status = buf.split(b"\r\n", 1)[0]
            if b" 200 " not in status:
                raise RuntimeError(f"request failed: {status!r}")
            buf = buf.split(b"\r\n\r\n", 1)[1]
            in_body = True
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            yield now, event
    sock.close()


def stream(addr, body, path="/v1/chat/completions", headers=None):
    """Sends one request; returns (t_sent, [(t_arrived, event_json_or_None)]); a typed event's
    JSON gets its `event:` type under "_event"."""
    sock, t_sent = send(addr, path, body, headers)
    events = []
    for now, event in raw_events(sock):
        lines = event.split(b"\n")
        kind = next((l[len(b"event: "):].decode() for l in lines if l.startswith(b"event: ")), None)
        payload = next((l[len(b"data: "):] for l in lines if l.startswith(b"data: ")), b"")
        parsed = None if payload in (b"", b"[DONE]") else json.loads(payload)
        if parsed is not None and kind is not None:
            parsed["_event"] = kind
        events.append((now, parsed))
    return t_sent, events


def is_token(choice):
    """A token-carrying choice: content or text, even empty (held back), but not the role chunk."""
    delta = choice.get("delta")
    if delta is None:
        return isinstance(choice.get("text"), str)
    return isinstance(delta.get("content"), str) and "role" not in delta


def content(choice):
    delta = choice.get("delta") or {}
    return choice.get("text") or delta.get("content") or delta.get("reasoning_content") or ""


def finished_lines(log, start):
    """llmslo's "request finished" log lines after line `start`."""
    lines = open(log).read().splitlines()[start:]
    return [json.loads(l)["fields"] for l in lines if '"request finished"' in l]


def log_length(log):
    return len(open(log).read().splitlines())


def wait_for_lines(log, start, count):
    for _ in range(100):
        if len(finished_lines(log, start)) >= count:
            return finished_lines(log, start)
        time.sleep(0.05)
    raise SystemExit(f"llmslo logged {len(finished_lines(log, start))} of {count} requests")


def visible(event):
    """Whether an event (of any API) carries visible generated text."""
    kind = event.get("_event")
    if kind is None:
        return any(content(c) for c in event.get("choices", []))
    if kind == "content_block_delta":
        delta = event.get("delta") or {}
        return bool(delta.get("text") or delta.get("thinking") or delta.get("partial_json"))
    return kind.endswith(".delta") and bool(event.get("delta"))


def ttft(addr, log, model, count, api="chat"):
    start = log_length(log)
    client = []
    for i in range(count):
        question = [{"role": "user", "content": f"request {i}"}]
        body = {"model": model, "stream": True, "ignore_eos": True}
        if api == "responses":
            body.update(input=question, max_output_tokens=16)
        else:
            body.update(messages=question, max_tokens=16)
        t_sent, events = stream(addr, body, ROUTES[api])
        visible_at = (t for t, e in events if e and visible(e))
        first = next(visible_at, None)  # a random-weight model can hold back every token
        client.append(None if first is None else (first - t_sent) * 1e3)
    logged = [f.get("ttft_ms") for f in wait_for_lines(log, start, count)]
    pairs = [(c, l) for c, l in zip(client, logged) if c is not None or l is not None]
    if any(c is None or l is None for c, l in pairs):
        print("a request had a visible first token on one side only")
        return False
    diffs = [l - c for c, l in pairs]
    worst = max(abs(d) for d in diffs)
    print(f"{api} TTFT, {len(diffs)} sequential requests with a visible token: client mean "
          f"{sum(c for c, _ in pairs) / len(pairs):.2f} ms; "
          f"llmslo - client: mean {sum(diffs) / len(diffs):+.3f} ms, min {min(diffs):+.3f} ms, max {max(diffs):+.3f} ms; "
          f"{sum(abs(d) > 1.0 for d in diffs)} over 1 ms")
    return worst <= 1.0


def tpot(addr, log, model, count, n, max_tokens, label):
    start = log_length(log)
    truths = []
    for i in range(count):
        body = {"model": model, "stream": True, "n": n, "max_tokens": max_tokens, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"request {i}"}]}
        _, events = stream(addr, body)
        stamps = {}
        for t, e in events:
            for c in (e or {}).get("choices", []):
                if is_token(c):
                    stamps.setdefault(c.get("index", 0), []).append(t)
        truth = max((s[-1] - s[0]) / (max_tokens - 1) for s in stamps.values())
        truths.append((truth * 1e3, len(stamps[0])))
    rows = wait_for_lines(log, start, count)
    errors = []
    for (truth, events), f in zip(truths, rows):
        got = f.get("tpot_ms")
        errors.append(None if got is None else got - truth)
    known = [e for e in errors if e is not None]
    sources = sorted({f.get("token_count_source") or "-" for f in rows})
    tokens = sorted({f.get("output_tokens") for f in rows}, key=str)
    mean_truth = sum(t for t, _ in truths) / count
    if known:
        worst = max(abs(e) for e in known)
        verdict = f"llmslo - truth: mean {sum(known) / len(known):+.3f} ms, worst {worst:.3f} ms"
    else:
        verdict = "llmslo published no TPOT"
    print(f"{label}: n={n}, {max_tokens} tokens a choice, {truths[0][1]} events a choice; true TPOT mean "
          f"{mean_truth:.2f} ms; {len(known)}/{count} with a TPOT; {verdict}; source {','.join(sources)}; "
          f"output_tokens {tokens}")
    return all(abs(e) <= 1.0 for e in known)


if __name__ == "__main__":
    mode, addr, log, model, count = sys.argv[1:6]
    if mode == "ttft":
        ok = ttft(addr, log, model, int(count), *sys.argv[6:7])
    else:
        n, max_tokens, label = sys.argv[6:9]
        ok = tpot(addr, log, model, int(count), int(n), int(max_tokens), label)
    sys.exit(0 if ok else 1)
