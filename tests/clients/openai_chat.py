"""Chat Completions as the official OpenAI Python SDK uses them, through the gateway: a plain
answer, a streamed one with `include_usage`, and a tool-call round trip.

Usage: openai_chat.py BASE_URL API_KEY MODEL
Prints one JSON object with what it saw.
"""
import json
import sys

import openai
from openai import OpenAI

base_url, api_key, model = sys.argv[1:4]
client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
out = {}

plain = client.chat.completions.create(
    model=model,
    messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello."},
    ],
)
out["plain_object"] = plain.object
out["plain_text"] = plain.choices[0].message.content
out["plain_finish"] = plain.choices[0].finish_reason
out["plain_usage"] = plain.usage.model_dump() if plain.usage else None

stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Say hello in a stream."}],
    stream=True,
    stream_options={"include_usage": True},
)
text, finish, usage, chunks = "", None, None, 0
for chunk in stream:
    chunks += 1
    if chunk.usage:
        usage = chunk.usage.model_dump()
    for choice in chunk.choices:
        if choice.delta.content:
            text += choice.delta.content
        if choice.finish_reason:
            finish = choice.finish_reason
out["stream_text"] = text
out["stream_finish"] = finish
out["stream_usage"] = usage
out["stream_chunks"] = chunks

tools = [{
    "type": "function",
    "function": {
        "name": "exec_command",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
}]
messages = [{"role": "user", "content": "run: echo hello"}]
first = client.chat.completions.create(model=model, messages=messages, tools=tools)
call = first.choices[0].message.tool_calls[0]
out["tool_finish"] = first.choices[0].finish_reason
out["tool_name"] = call.function.name
out["tool_args"] = json.loads(call.function.arguments)
messages.append(first.choices[0].message.model_dump(exclude_none=True))
messages.append({"role": "tool", "tool_call_id": call.id, "content": "hello"})
second = client.chat.completions.create(model=model, messages=messages, tools=tools, stream=True)
reply = "".join(c.choices[0].delta.content or "" for c in second if c.choices)
out["tool_reply"] = reply

try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], n=2)
    out["n2"] = "accepted"
except openai.BadRequestError as e:
    out["n2"] = e.body.get("code") if isinstance(e.body, dict) else str(e.body)

print(json.dumps(out))
