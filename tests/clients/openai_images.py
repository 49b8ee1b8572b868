"""Images as the official OpenAI Python SDK makes them, through the gateway: a generation and
an edit (multipart), each answered with b64_json, and a refused size.

Usage: openai_images.py BASE_URL API_KEY
Prints one JSON object.
"""
import base64
import io
import json
import sys

import openai
from openai import OpenAI

base_url, api_key = sys.argv[1:3]
client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
out = {}

made = client.images.generate(model="gpt-image-1", prompt="a lighthouse at dawn", size="1024x1024", quality="high")
png = base64.b64decode(made.data[0].b64_json)
out["generated_png"] = png[:8] == b"\x89PNG\r\n\x1a\n"
out["revised_prompt"] = made.data[0].revised_prompt

image = io.BytesIO(png)
image.name = "in.png"
edited = client.images.edit(model="gpt-image-1", image=image, prompt="add a boat")
out["edited_png"] = base64.b64decode(edited.data[0].b64_json)[:4] == b"\x89PNG"
out["edit_prompt"] = edited.data[0].revised_prompt

try:
    client.images.generate(model="gpt-image-1", prompt="tiny", size="256x256")
    out["small"] = "accepted"
except openai.BadRequestError as e:
    out["small"] = e.body.get("code") if isinstance(e.body, dict) else str(e.body)

print(json.dumps(out))
