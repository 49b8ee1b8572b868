"""A key's limits as the official OpenAI Python SDK meets them: a model the key may not use
and its rate, over HTTP (`responses.create`) and over the Responses WebSocket
(`responses.connect()`), then the key's own `/v1/usage`.

Usage: openai_key_limits.py BASE_URL API_KEY ALLOWED_MODEL DENIED_MODEL
The key is expected to allow ALLOWED_MODEL only, at 3 requests per minute.
"""
import json
import sys
import urllib.request

import openai
from openai import OpenAI

base_url, api_key, allowed, denied = sys.argv[1:5]
client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
out = {}


def http_error(call):
    try:
        call()
        return {"ok": True}
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        error = body.get("error", body)
        return {
            "class": type(e).__name__,
            "status": e.status_code,
            "code": error.get("code"),
            "retry_after": e.response.headers.get("retry-after"),
        }


def turn(conn, model):
    conn.response.create(model=model, input="Say hello.", store=False)
    for event in conn:
        if event.type == "error":
            error = event.error.model_dump() if hasattr(event.error, "model_dump") else {}
            return {"type": "error", "code": error.get("code"), "status": getattr(event, "status", None)}
        if event.type in ("response.completed", "response.failed", "response.incomplete"):
            return {"type": event.type}
    return {"type": "closed"}


out["http_denied"] = http_error(lambda: client.responses.create(model=denied, input="hi"))
out["http_allowed"] = http_error(lambda: client.responses.create(model=allowed, input="hi"))
with client.responses.connect() as conn:
    out["ws"] = [turn(conn, m) for m in (denied, allowed, allowed, allowed, denied)]
out["http_limited"] = http_error(lambda: client.responses.create(model=allowed, input="hi"))
req = urllib.request.Request(base_url + "/usage", headers={"Authorization": f"Bearer {api_key}"})
with urllib.request.urlopen(req) as resp:
    out["usage"] = json.load(resp)
print(json.dumps(out))
