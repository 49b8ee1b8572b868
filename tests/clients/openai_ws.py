"""Two turns over the Responses WebSocket with the official OpenAI Python SDK
(`client.responses.connect()`), the second continuing the first with `previous_response_id`.

Usage: openai_ws.py BASE_URL API_KEY MODEL
"""
import json
import sys

from openai import OpenAI

base_url, api_key, model = sys.argv[1:4]
client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
out = {"turns": []}


def turn(conn, **kwargs):
    conn.response.create(model=model, store=False, **kwargs)
    kinds, text, final, error = [], [], None, None
    for event in conn:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text.append(event.delta)
        if event.type == "error":
            error = getattr(event, "error", None)
            error = error.model_dump() if hasattr(error, "model_dump") else str(error)
            break
        if event.type in ("response.completed", "response.failed", "response.incomplete"):
            final = event.response
            break
    return {
        "kinds": kinds,
        "text": "".join(text),
        "id": final.id if final else None,
        "status": final.status if final else None,
        "error": error,
    }


with client.responses.connect() as conn:
    first = turn(conn, input="Say hello.")
    out["turns"].append(first)
    second = turn(conn, input="And again.", previous_response_id=first["id"])
    out["turns"].append(second)
    unknown = turn(conn, input="x", previous_response_id="resp_not_from_here")
    out["turns"].append(unknown)

print(json.dumps(out))
