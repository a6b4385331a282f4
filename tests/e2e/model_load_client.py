"""Serves two models by name through the official `openai` SDK, then unloads one while a
request for it streams; prints what it saw as JSON.

Usage: python model_load_client.py BASE_URL STARTUP_MODEL LOADED_MODEL PROMPT MAX_TOKENS

The loaded model must be ready. The caller compares the greedy texts with `tandem generate`,
waits for the unload to finish and checks the worker's memory; the response shapes are
asserted here.
"""
import json
import sys

import openai

base, startup, loaded, prompt, max_tokens = sys.argv[1:6]
max_tokens = int(max_tokens)
client = openai.OpenAI(base_url=base, api_key="unused", timeout=120, max_retries=0)
out = {}

# Both models listed, both ready.
listed = {m.id: getattr(m, "status", None) for m in client.models.list().data}
out["models"] = listed
assert listed.get(startup) == "ready" and listed.get(loaded) == "ready", listed

# Each served by its name: greedy completions of the same prompt.
for name in (startup, loaded):
    r = client.completions.create(model=name, prompt=prompt, max_tokens=max_tokens, temperature=0)
    assert r.model == name, (r.model, name)
    out.setdefault("completions", {})[name] = {"text": r.choices[0].text, "usage": r.usage.model_dump()}
r = client.chat.completions.create(model=startup, messages=[{"role": "user", "content": "What is the capital of France?"}],
                                   max_tokens=12, temperature=0)
assert r.model == startup and r.choices[0].message.content
out["chat"] = r.choices[0].message.content

# A long request for the loaded model is streaming when the model is deleted.
long_tokens = 64
stream = client.completions.create(model=loaded, prompt=prompt, max_tokens=long_tokens, temperature=0, stream=True,
                                   stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
chunks = iter(stream)
first = next(chunks)
text = "".join(c.text for c in first.choices)
deleted = client.models.delete(loaded)
out["delete"] = deleted.model_dump()
assert deleted.id == loaded and deleted.deleted is False and getattr(deleted, "status", None) == "unloading", out["delete"]
out["status_while_draining"] = getattr(client.models.retrieve(loaded), "status", None)
# New requests for it are refused while it drains; the start-up model serves on.
try:
    client.completions.create(model=loaded, prompt=prompt, max_tokens=2)
    out["new_request_while_draining"] = "served"
except openai.APIStatusError as e:
    out["new_request_while_draining"] = e.status_code
r = client.completions.create(model=startup, prompt=prompt, max_tokens=2)
out["startup_while_draining"] = r.choices[0].finish_reason
finish, usage = None, None
for c in chunks:
    for ch in c.choices:
        text += ch.text
        finish = ch.finish_reason or finish
    if c.usage is not None:
        usage = c.usage.model_dump()
out["in_flight"] = {"text": text, "finish_reason": finish, "usage": usage}
print(json.dumps(out))
