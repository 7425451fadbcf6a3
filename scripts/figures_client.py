#!/usr/bin/env python3
"""For scripts/figures-vs-vllm.sh: CLIENTS raw-socket clients at once send PER_CLIENT sampled
streaming requests each through the sidecar, turn by turn on chat, Responses and Messages, for
three tenants (the `x-tenant` header) that ask for 64, 16 and 32 output tokens. Each request's
truth is what the client saw (its first visible token, the usage) and what the engine stated
(vLLM's per-request `mean_itl_ms`; on Messages, which states none, the clock from
`message_start`, sent with the first token, to `content_block_stop`). Then it reads the
sidecar's /metrics, /workload and debug lines and prints, beside the client's figures: each
tenant's requests and tokens, SLO events, burn rates and budgets, cost shares, the cost of a
million tokens, every arrival and length on /workload, and each request's TPOT with its basis.

  figures_client.py SIDECAR METRICS LLMSLO_LOG MODEL CLIENTS PER_CLIENT

The SLOs and cost mirror the sidecar's config written by the script: TTFT <= 1 s and TPOT <=
40 ms at 90 %, min_events 1; 4.0 an hour, input tokens weigh 0.1. Standard library only.
"""
import json
import re
import statistics
import sys
import threading
import time
import urllib.request

from raw_client import ROUTES, finished_lines, is_token, log_length, stream, visible, wait_for_lines

TENANTS = {"alpha": 64, "beta": 16, "gamma": 32}
APIS = ["chat", "responses", "messages"]
SLOS = {"ttft-1s": ("ttft", 1000.0), "tpot-40ms": ("tpot", 40.0)}
OBJECTIVE = 0.90
INPUT_WEIGHT = 0.1


def body_of(api, model, tokens, i):
    question = [{"role": "user", "content": f"Tell me about request {i} in a few words."}]
    body = {"model": model, "stream": True, "ignore_eos": True, "temperature": 1.0}
    if api == "responses":
        body.update(input=question, max_output_tokens=tokens)
    else:
        body.update(messages=question, max_tokens=tokens)
    if api == "chat":
        body["stream_options"] = {"include_usage": True}
    return body


def measure(addr, model, api, tenant, i):
    """One request: what the client saw and what the engine stated."""
    t_sent, events = stream(addr, body_of(api, model, TENANTS[tenant], i), ROUTES[api], {"x-tenant": tenant})
    first = next((t for t, e in events if e and visible(e)), None)
    out = {"api": api, "tenant": tenant, "sent": t_sent, "ttft_ms": None if first is None else (first - t_sent) * 1e3,
           "e2e_ms": (events[-1][0] - t_sent) * 1e3}
    for t, e in events:
        e = e or {}
        kind = e.get("_event")
        if api == "chat" and e.get("usage"):
            out["input"], out["output"] = e["usage"]["prompt_tokens"], e["usage"]["completion_tokens"]
            out["engine_tpot_ms"] = (e.get("metrics") or e["usage"].get("metrics") or {}).get("mean_itl_ms")
        elif kind == "response.completed":
            usage, metrics = e["response"]["usage"], e["response"].get("metrics") or {}
            out["input"], out["output"], out["engine_tpot_ms"] = usage["input_tokens"], usage["output_tokens"], metrics.get("mean_itl_ms")
        elif kind == "message_start":
            out["input"], out["start"] = e["message"]["usage"]["input_tokens"], t
        elif kind == "content_block_stop":
            out["stop"] = t
        elif kind == "message_delta":
            out["output"] = e["usage"]["output_tokens"]
    if api == "chat":
        # Every chat token has its event (held-back ones empty): the client's own clock.
        stamps = [t for t, e in events if e and any(is_token(c) for c in e.get("choices", []))]
        if len(stamps) > 1 and out.get("output", 0) > 1:
            out["client_tpot_ms"] = (stamps[-1] - stamps[0]) * 1e3 / (out["output"] - 1)
    if api == "messages" and out.get("output", 0) > 1:
        out["engine_tpot_ms"] = (out["stop"] - out["start"]) * 1e3 / (out["output"] - 1)
    return out


def run_load(addr, model, clients, per_client):
    results, lock = [], threading.Lock()

    def client(c):
        for i in range(per_client):
            api = APIS[(c + i) % len(APIS)]
            tenant = list(TENANTS)[(c + 2 * i) % len(TENANTS)]
            r = measure(addr, model, api, tenant, c * 1000 + i)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(results, key=lambda r: r["sent"])


def scrape(url):
    """/metrics as {(name, frozenset(labels)): value}."""
    samples = {}
    for line in urllib.request.urlopen(url).read().decode().splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", line)
        if m:
            labels = frozenset(re.findall(r'([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            samples[(m.group(1), labels)] = float(m.group(3))
    return samples


def total(samples, name, **want):
    return sum(v for (n, labels), v in samples.items() if n == name and set(want.items()) <= labels)


def one(samples, name, **want):
    found = [v for (n, labels), v in samples.items() if n == name and set(want.items()) <= labels]
    return found[0] if len(found) == 1 else float("nan")


def judge(r, slo):
    kind, bound = SLOS[slo]
    figure = r["ttft_ms"] if kind == "ttft" else r.get("engine_tpot_ms")
    return None if figure is None else figure > bound


def compare(results, samples, metrics_url, lines):
    print("\n| tenant | requests client / llmslo | output tokens | input tokens |")
    print("| --- | --- | --- | --- |")
    weighted = {t: sum(r["output"] + INPUT_WEIGHT * r["input"] for r in results if r["tenant"] == t) for t in TENANTS}
    for t in TENANTS:
        mine = [r for r in results if r["tenant"] == t]
        print(f"| {t} | {len(mine)} / {total(samples, 'llmslo_requests_total', tenant=t, outcome='success'):.0f} "
              f"| {sum(r['output'] for r in mine)} / {total(samples, 'llmslo_output_tokens_total', tenant=t):.0f} "
              f"| {sum(r['input'] for r in mine)} / {total(samples, 'llmslo_input_tokens_total', tenant=t):.0f} |")

    print("\n| tenant | SLO | bad / valid, client | bad / valid, llmslo | burn rate 5m, client / llmslo | budget left, client / llmslo |")
    print("| --- | --- | --- | --- | --- | --- |")
    for t in TENANTS:
        for slo in SLOS:
            verdicts = [judge(r, slo) for r in results if r["tenant"] == t]
            verdicts = [v for v in verdicts if v is not None]
            bad, valid = sum(verdicts), len(verdicts)
            burn = bad / valid / (1 - OBJECTIVE)
            l_bad = total(samples, "llmslo_slo_bad_events_total", slo=slo, tenant=t)
            l_valid = total(samples, "llmslo_slo_events_total", slo=slo, tenant=t)
            l_burn = one(samples, "llmslo_slo_burn_rate", slo=slo, tenant=t, window="5m")
            l_left = one(samples, "llmslo_slo_error_budget_remaining_ratio", slo=slo, tenant=t)
            print(f"| {t} | {slo} | {bad} / {valid} | {l_bad:.0f} / {l_valid:.0f} | {burn:.3f} / {l_burn:.3f} "
                  f"| {1 - burn:.3f} / {l_left:.3f} |")

    # The window also holds the sequential requests sent before the load, which named no
    # tenant (`unknown`): the whole O + wI is the sidecar's counters' (checked per tenant above).
    counted = total(samples, "llmslo_output_tokens_total") + INPUT_WEIGHT * total(samples, "llmslo_input_tokens_total")
    print("\n| tenant | cost share, client's tokens / llmslo (5m) |")
    print("| --- | --- |")
    for t in TENANTS:
        print(f"| {t} | {weighted[t] / counted:.5f} / {one(samples, 'llmslo_cost_tenant_share_ratio', tenant=t, window='5m'):.5f} |")
    print(f"| unknown (the sequential requests) | {1 - sum(weighted.values()) / counted:.5f} / "
          f"{one(samples, 'llmslo_cost_tenant_share_ratio', tenant='unknown', window='5m'):.5f} |")
    cost = one(samples, "llmslo_cost_over_window", window="5m")
    per_million = one(samples, "llmslo_cost_per_million_output_tokens", window="5m")
    print(f"\ncost over 5m {cost:.6f} ({cost / 4.0 * 3600:.1f} s at 4.0 an hour); a million output tokens: "
          f"llmslo {per_million:.4f}, cost x 1e6 / (O + 0.1 I) from its counters {cost * 1e6 / counted:.4f} "
          f"({(per_million / (cost * 1e6 / counted) - 1) * 100:+.3f} %)")

    rows = [json.loads(l) for l in urllib.request.urlopen(metrics_url + "/workload").read().decode().splitlines()]
    rows = rows[-len(results):]
    # Sends within a millisecond of each other may arrive in either order: each request is
    # matched to the row of its API and lengths nearest its send.
    t0_client, t0_rows = results[0]["sent"], rows[0]["timestamp"]
    free, offsets = list(rows), []
    for r in results:
        at = (r["sent"] - t0_client) * 1e3
        same = [row for row in free if (row["api"], row["input_length"], row["output_length"]) == (r["api"], r["input"], r["output"])]
        if same:
            row = min(same, key=lambda row: abs(row["timestamp"] - t0_rows - at))
            free.remove(row)
            offsets.append(abs(row["timestamp"] - t0_rows - at))
    print(f"\n/workload: {len(rows)} rows for {len(results)} requests; {len(offsets)} with the API and both lengths "
          f"of a request; their arrivals against the client's sends (from the first): "
          f"p50 {statistics.median(offsets):.2f} ms, p99 {sorted(offsets)[int(0.99 * (len(offsets) - 1))]:.2f} ms, "
          f"max {max(offsets):.2f} ms (the timestamps are whole ms)")

    # Each request's debug line: the one of its API and token counts whose TTFT and end are
    # nearest the client's (the lines carry no request id).
    print("\n| API | requests | TTFT, llmslo - client: mean, worst | TPOT within 5 % of the truth | mean error | worst | basis |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    free, flips = list(lines), []
    for api in APIS:
        ttft_diffs, errors, bases, own = [], [], {}, []
        for r in (r for r in results if r["api"] == api):
            same = [f for f in free if f.get("operation") == api and f.get("output_tokens") == r["output"]
                    and f.get("input_tokens") == r["input"] and f.get("ttft_ms") is not None]
            if not same or r["ttft_ms"] is None:
                continue
            f = min(same, key=lambda f: abs(f["ttft_ms"] - r["ttft_ms"]) + abs(f["e2e_ms"] - r["e2e_ms"]))
            free.remove(f)
            ttft_diffs.append(f["ttft_ms"] - r["ttft_ms"])
            bases[f.get("tpot_basis")] = bases.get(f.get("tpot_basis"), 0) + 1
            truth = r.get("engine_tpot_ms")
            if f.get("tpot_ms") and truth:
                errors.append((f["tpot_ms"] - truth) / truth)
                bound = SLOS["tpot-40ms"][1]
                if (f["tpot_ms"] > bound) != (truth > bound):
                    flips.append(f"{api} ({f.get('tpot_basis')}): llmslo {f['tpot_ms']:.2f} ms, the truth "
                                 f"{truth:.2f} ms, the client's own event times {r.get('client_tpot_ms') or float('nan'):.2f} ms")
            if f.get("tpot_ms") and r.get("client_tpot_ms"):
                own.append((f["tpot_ms"] - r["client_tpot_ms"]) / r["client_tpot_ms"])
        within = sum(abs(e) <= 0.05 for e in errors) / max(len(errors), 1) * 100
        worst = max(errors, key=abs) * 100 if errors else float("nan")
        mean = statistics.mean(errors) * 100 if errors else float("nan")
        basis = ", ".join(f"{k} {v}" for k, v in sorted(bases.items(), key=str))
        print(f"| {api} | {len(ttft_diffs)} | {statistics.mean(ttft_diffs):+.3f} ms, {max(ttft_diffs, key=abs):+.3f} ms "
              f"| {within:.1f} % | {mean:+.2f} % | {worst:+.1f} % | {basis} |")
        if own:
            print(f"| {api}, against the client's own event times | {len(own)} | | "
                  f"{sum(abs(e) <= 0.05 for e in own) / len(own) * 100:.1f} % | {statistics.mean(own) * 100:+.3f} % "
                  f"| {max(own, key=abs) * 100:+.2f} % | |")
    for flip in flips:
        print(f"on the other side of the TPOT bound: {flip}")


def main():
    addr, metrics, log, model, clients, per_client = sys.argv[1:7]
    start = log_length(log)
    began = time.monotonic()
    results = run_load(addr, model, int(clients), int(per_client))
    print(f"{len(results)} requests from {clients} clients in {time.monotonic() - began:.1f} s")
    wait_for_lines(log, start, len(results))
    time.sleep(1.5)  # the window gauges are computed each second
    samples = scrape(f"http://{metrics}/metrics")
    compare(results, samples, f"http://{metrics}", finished_lines(log, start))


if __name__ == "__main__":
    main()
