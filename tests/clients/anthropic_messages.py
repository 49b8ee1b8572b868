"""The Anthropic Messages API as the official `anthropic` Python SDK uses it, through the
gateway: a plain message, a streamed one with thinking, a tool-use round trip, count_tokens,
and an error.

Usage: anthropic_messages.py BASE_URL API_KEY MODEL
BASE_URL is the gateway's origin (the SDK adds /v1/messages). Prints one JSON object.
"""
import json
import sys

import anthropic

base_url, api_key, model = sys.argv[1:4]
client = anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0)
out = {}

plain = client.messages.create(
    model=model,
    max_tokens=256,
    system="Be brief.",
    messages=[{"role": "user", "content": "Say hello."}],
)
out["plain_type"] = plain.type
out["plain_text"] = "".join(b.text for b in plain.content if b.type == "text")
out["plain_stop"] = plain.stop_reason
out["plain_usage"] = plain.usage.model_dump()

kinds = []
with client.messages.stream(
    model=model,
    max_tokens=2048,
    thinking={"type": "enabled", "budget_tokens": 1024},
    messages=[{"role": "user", "content": "Say hello in a stream."}],
) as stream:
    for event in stream:
        kinds.append(event.type)
    final = stream.get_final_message()
out["stream_kinds"] = kinds
out["stream_text"] = "".join(b.text for b in final.content if b.type == "text")
out["stream_blocks"] = [b.type for b in final.content]
out["stream_stop"] = final.stop_reason

tools = [{
    "name": "exec_command",
    "description": "Run a shell command.",
    "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}]
messages = [{"role": "user", "content": "run: echo hello"}]
first = client.messages.create(model=model, max_tokens=256, tools=tools, messages=messages)
use = next(b for b in first.content if b.type == "tool_use")
out["tool_stop"] = first.stop_reason
out["tool_name"] = use.name
out["tool_input"] = use.input
messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "hello"}]})
second = client.messages.create(model=model, max_tokens=256, tools=tools, messages=messages)
out["tool_reply"] = "".join(b.text for b in second.content if b.type == "text")

counted = client.messages.count_tokens(model=model, messages=[{"role": "user", "content": "Count me."}])
out["count"] = counted.input_tokens

try:
    anthropic.Anthropic(base_url=base_url, api_key="sk-sy-wrong", max_retries=0).messages.create(
        model=model, max_tokens=16, messages=[{"role": "user", "content": "x"}])
    out["bad_key"] = "accepted"
except anthropic.AuthenticationError as e:
    out["bad_key"] = e.body["error"]["type"] if isinstance(e.body, dict) else str(e.body)

print(json.dumps(out))
