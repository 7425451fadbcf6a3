#!/usr/bin/env python3
"""A routing sidecar for checks outside CI that follows llm-d's P/D protocol (its nixlv2
connector) as its public source documents it; written for llmslo. For a request naming a
prefill pod in x-prefiller-host-port it sends the prompt there as a one-token, non-streamed
prefill leg (kv_transfer_params.do_remote_decode: true), then the request to the decode engine
with the kv_transfer_params the prefill pod answered, streaming the answer back. The client's
headers go on both legs. Needs aiohttp (vLLM's environment has it).

    pd_routing_sidecar.py --port 8100 --vllm-port 8102
"""
import argparse
import json
import uuid

from aiohttp import ClientSession, ClientTimeout, web

SKIP = {"host", "content-length", "transfer-encoding", "connection"}


def headers_of(request, request_id):
    headers = {k: v for k, v in request.headers.items() if k.lower() not in SKIP}
    headers["x-request-id"] = request_id
    return headers


async def route(request):
    session = request.app["session"]
    decode = request.app["decode"]
    body = await request.read()
    prefill = request.headers.get("x-prefiller-host-port", "").split(",")[0].strip()
    request_id = str(uuid.uuid4())
    headers = headers_of(request, request_id)
    if prefill:
        completion = json.loads(body)
        leg = dict(completion)
        leg["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False,
                                     "remote_engine_id": None, "remote_block_ids": None,
                                     "remote_host": None, "remote_port": None}
        leg["stream"] = False
        leg.pop("stream_options", None)
        leg["max_tokens"] = 1
        async with session.post(f"http://{prefill}{request.path}", json=leg, headers=headers) as answer:
            if answer.status // 100 != 2:
                return web.Response(status=answer.status)
            params = (await answer.json()).get("kv_transfer_params")
        completion["kv_transfer_params"] = params
        body = json.dumps(completion).encode()
    headers["content-type"] = "application/json"
    async with session.post(f"http://{decode}{request.path}", data=body, headers=headers) as answer:
        response = web.StreamResponse(status=answer.status,
                                      headers={"content-type": answer.headers.get("content-type", "")})
        await response.prepare(request)
        async for chunk in answer.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def session_ctx(app):
    app["session"] = ClientSession(timeout=ClientTimeout(total=None))
    yield
    await app["session"].close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--vllm-port", type=int, default=8001)
    args = parser.parse_args()
    app = web.Application()
    app["decode"] = f"127.0.0.1:{args.vllm_port}"
    app.cleanup_ctx.append(session_ctx)
    app.router.add_post("/v1/chat/completions", route)
    app.router.add_post("/v1/completions", route)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
