"""Drives the gateway with the official OpenAI Python SDK and prints what it saw as JSON.

Usage: openai_sdk.py BASE_URL API_KEY MODEL
"""
import json
import sys

from openai import OpenAI

base_url, api_key, model = sys.argv[1:4]
client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
out = {}

# Non-streaming.
r = client.responses.create(model=model, input="Say hello.", store=False)
out["json_status"] = r.status
out["json_text"] = r.output_text
out["json_usage_input"] = r.usage.input_tokens if r.usage else None

# Streaming.
kinds = []
text = []
final = None
with client.responses.create(model=model, input="Say hello again.", stream=True, store=False) as stream:
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text.append(event.delta)
        if event.type == "response.completed":
            final = event.response
out["stream_kinds"] = kinds
out["stream_text"] = "".join(text)
out["stream_final_status"] = final.status if final else None

# Errors surface as the SDK's typed exceptions.
try:
    OpenAI(base_url=base_url, api_key="sk-sy-wrong", max_retries=0).responses.create(model=model, input="x")
    out["bad_key"] = "no error"
except Exception as e:  # noqa: BLE001
    out["bad_key"] = type(e).__name__

print(json.dumps(out))
