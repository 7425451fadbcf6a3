"""The official OpenAI and Anthropic Python SDKs through llmslo, checked against llmslo's own
per-request log.

Sends ROUNDS rounds of sequential requests, each round one chat completion
(`chat.completions.create(stream=True)`), one Responses request (`responses.create(stream=True)`)
and one Messages request (`messages.stream`), all greedy with the same prompt and output length,
so the three APIs share the engine and its load. Each SDK event is stamped as it arrives; the
first one carrying generated text is the client's TTFT, and the usage of the last events is the
client's token count. Then llmslo's debug log (`request finished`, one line per request, in
order) is read and compared:

- per request, llmslo's TTFT before the SDK's and within 5 ms of it (llmslo stamps when it
  forwards the event; the SDK later, after its own parsing in Python: scripts/raw_client.py
  holds llmslo to 1 ms of a raw-socket client);
- per request, llmslo's output and input tokens equal to the usage the SDK reports;
- per API, llmslo's mean TPOT within 3 % of chat completions' mean TPOT.

Usage: sdk_client.py BASE_URL MODEL LLMSLO_LOG ROUNDS OUTPUT_TOKENS
"""

import json
import sys
import time

import anthropic
import openai

base, model, log_path, rounds, output_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
PROMPT = "Tell me a short story about a lighthouse keeper."
oai = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
claude = anthropic.Anthropic(base_url=base, api_key="none", max_retries=0)


def chat():
    sent = time.perf_counter()
    first, usage = None, None
    stream = oai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=output_tokens,
        temperature=0, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    for chunk in stream:
        now = time.perf_counter()
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = now
        if chunk.usage:
            usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
    return sent, first, usage


def responses():
    sent = time.perf_counter()
    first, usage = None, None
    stream = oai.responses.create(model=model, input=PROMPT, max_output_tokens=output_tokens, temperature=0,
                                  stream=True, extra_body={"ignore_eos": True})
    for event in stream:
        now = time.perf_counter()
        if first is None and event.type == "response.output_text.delta" and event.delta:
            first = now
        if event.type == "response.completed":
            usage = (event.response.usage.input_tokens, event.response.usage.output_tokens)
    return sent, first, usage


def messages():
    sent = time.perf_counter()
    first, usage, input_tokens = None, None, None
    with claude.messages.stream(model=model, max_tokens=output_tokens,
                                messages=[{"role": "user", "content": PROMPT}],
                                extra_body={"ignore_eos": True, "temperature": 0}) as stream:
        for event in stream:
            now = time.perf_counter()
            if event.type == "message_start":
                input_tokens = event.message.usage.input_tokens
            if first is None and event.type == "content_block_delta" and getattr(event.delta, "text", ""):
                first = now
            if event.type == "message_delta":
                usage = (input_tokens, event.usage.output_tokens)
    return sent, first, usage


APIS = [("chat", chat), ("responses", responses), ("messages", messages)]
# One warm-up round that is not compared.
for _, call in APIS:
    call()
with open(log_path) as log:
    skip = sum(1 for line in log if '"request finished"' in line)

client = []
for _ in range(rounds):
    for api, call in APIS:
        sent, first, usage = call()
        client.append((api, (first - sent) * 1e3, usage))
time.sleep(0.5)
with open(log_path) as log:
    logged = [json.loads(l)["fields"] for l in log if '"request finished"' in l][skip:]

ok = len(logged) == len(client)
print(f"{len(client)} requests sent through the SDKs, {len(logged)} recorded by llmslo")
tpot = {api: [] for api, _ in APIS}
worst = {api: 0.0 for api, _ in APIS}
for (api, client_ttft, usage), fields in zip(client, logged):
    if fields["operation"] != api or fields["outcome"] != "success":
        print(f"  mismatch: client {api}, llmslo {fields['operation']} {fields['outcome']}")
        ok = False
        continue
    # llmslo's clock starts when the request head arrives, a little after the SDK sent it.
    gap = client_ttft - fields["ttft_ms"]
    worst[api] = max(worst[api], abs(gap))
    if not 0 <= gap <= 5.0:
        print(f"  {api}: client TTFT {client_ttft:.2f} ms, llmslo {fields['ttft_ms']:.2f} ms")
        ok = False
    if usage != (fields.get("input_tokens", usage[0]), fields["output_tokens"]):
        print(f"  {api}: the SDK's usage {usage}, llmslo's output tokens {fields['output_tokens']}")
        ok = False
    tpot[api].append(fields["tpot_ms"])
chat_tpot = sum(tpot["chat"]) / len(tpot["chat"])
print(f"{'API':<10} {'requests':>8} {'TPOT mean':>10} {'vs chat':>8} {'worst |TTFT gap|':>17}")
for api, _ in APIS:
    mean = sum(tpot[api]) / len(tpot[api])
    off = (mean - chat_tpot) / chat_tpot
    ok &= abs(off) <= 0.03
    print(f"{api:<10} {len(tpot[api]):>8} {mean:>8.2f}ms {off * 100:>+7.1f}% {worst[api]:>15.2f}ms")
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
