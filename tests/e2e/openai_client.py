"""Drives a running Tandem with the official `openai` SDK and prints what it got as JSON.

Usage: python openai_client.py BASE_URL MODEL PROMPT CHAT_PROMPT MAX_TOKENS

Every call is greedy unless it says otherwise, so the caller can compare the texts with
`tandem generate`. Assertions about the response shapes live here; the comparison with the
reference lives in the Rust test that runs this script.
"""
import json
import sys

import openai

base, model, prompt, chat_prompt, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
client = openai.OpenAI(base_url=base, api_key="unused", timeout=120, max_retries=0)
out = {}

# Models.
out["models"] = [m.id for m in client.models.list().data]

# Completions, whole, greedy, with log-probabilities.
r = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, logprobs=3)
c = r.choices[0]
assert r.object == "text_completion" and r.usage.completion_tokens == len(c.logprobs.tokens)
assert all(len(t) <= 3 for t in c.logprobs.top_logprobs)
out["completion"] = {"text": c.text, "finish_reason": c.finish_reason, "usage": r.usage.model_dump(),
                     "token_logprobs": c.logprobs.token_logprobs}

# Completions, streamed, with usage.
text, finish, usage = "", None, None
for ch in client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
                                    stream_options={"include_usage": True}):
    if ch.usage is not None:
        usage = ch.usage.model_dump()
    for x in ch.choices:
        text += x.text
        finish = x.finish_reason or finish
out["completion_stream"] = {"text": text, "finish_reason": finish, "usage": usage}

# Chat, whole and streamed.
msgs = [{"role": "user", "content": chat_prompt}]
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=max_tokens, temperature=0)
assert r.choices[0].message.role == "assistant"
out["chat"] = {"text": r.choices[0].message.content, "finish_reason": r.choices[0].finish_reason, "usage": r.usage.model_dump()}
text, finish, roles = "", None, 0
for ch in client.chat.completions.create(model=model, messages=msgs, max_tokens=max_tokens, temperature=0, stream=True):
    for x in ch.choices:
        roles += x.delta.role == "assistant"
        text += x.delta.content or ""
        finish = x.finish_reason or finish
assert roles == 1, f"the assistant role is announced once, got {roles}"
out["chat_stream"] = {"text": text, "finish_reason": finish}

# n = 2, sampled with a seed: two choices, reproducible.
def two():
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0.9, n=2, seed=7)
    return sorted((x.index, x.message.content) for x in r.choices)
a, b = two(), two()
assert [i for i, _ in a] == [0, 1], a
assert a == b, f"same seed, same completions: {a} vs {b}"
out["n2"] = [t for _, t in a]

# n = 2 streamed: every choice index appears and finishes.
finished = set()
for ch in client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0.9, n=2, seed=3, stream=True):
    for x in ch.choices:
        if x.finish_reason:
            finished.add(x.index)
assert finished == {0, 1}, finished

# Stop strings.
r = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stop=[" the", "\n"])
out["stop"] = {"text": r.choices[0].text, "finish_reason": r.choices[0].finish_reason}

# Chat log-probabilities with alternatives.
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
content = r.choices[0].logprobs.content
assert len(content) == r.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in content)
assert all(t.logprob <= 0 for t in content)
out["chat_logprobs"] = [[t.token, t.logprob] for t in content]

# Errors surface as the SDK's typed exceptions.
try:
    client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    raise AssertionError("an unknown model must fail")
except openai.NotFoundError as e:
    out["unknown_model"] = e.status_code
try:
    client.completions.create(model=model, prompt="x", max_tokens=-1)
    raise AssertionError("negative max_tokens must fail")
except openai.BadRequestError as e:
    out["bad_request"] = e.body.get("message") if isinstance(e.body, dict) else str(e.body)

print(json.dumps(out))
