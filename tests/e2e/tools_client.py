"""Tool calling through a running Tandem with the official `openai` SDK, LangChain's
`bind_tools` / `with_structured_output(method="function_calling")` and LiteLLM. Prints what it
got as JSON; every check that needs only the response is asserted here.

Usage: python tools_client.py BASE_URL MODEL [single]

With `single`, forced calls ask for one call per turn (`parallel_tool_calls: false`): with a
template that shows calls its own way, the small test model repeats parallel calls until
max_tokens.
"""
import json
import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import jsonschema
import openai
from pydantic import BaseModel, Field

base, model = sys.argv[1], sys.argv[2]
parallel = sys.argv[3:] != ["single"]
client = openai.OpenAI(base_url=base, api_key="unused", timeout=120, max_retries=0)
out = {}

weather = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
add = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
        "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
        "required": ["a", "b"], "additionalProperties": False}}}
tools = [weather, add]
schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
ask = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_calls(calls, only=None):
    assert calls, "no tool calls"
    got = []
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_"), c
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, schemas[c.function.name])
        assert only is None or c.function.name == only, c
        got.append({"name": c.function.name, "arguments": args})
    return got


# required and named, whole.
for choice, only in (("required", None), ({"type": "function", "function": {"name": "add"}}, "add")):
    r = client.chat.completions.create(model=model, messages=ask, tools=tools, tool_choice=choice,
                                       max_tokens=120, temperature=0, parallel_tool_calls=parallel, logprobs=True)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    out["named" if only else "required"] = check_calls(c.message.tool_calls, only)
    # The text the model wrote (its tokens, from the log-probs): the call format in use.
    out["raw_named" if only else "raw_required"] = "".join(t.token for t in c.logprobs.content)

# required, streamed: OpenAI's chunk format, arguments joined from deltas.
calls, finish, roles = {}, None, 0
for ch in client.chat.completions.create(model=model, messages=ask, tools=tools, tool_choice="required",
                                         max_tokens=120, temperature=0, stream=True, parallel_tool_calls=False):
    for x in ch.choices:
        roles += x.delta.role == "assistant"
        finish = x.finish_reason or finish
        for tc in x.delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                assert slot["id"] is None, "id sent twice"
                slot["id"] = tc.id
            if tc.function and tc.function.name:
                slot["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                slot["arguments"] += tc.function.arguments
assert finish == "tool_calls" and roles == 1 and len(calls) == 1, (finish, roles, calls)
for slot in calls.values():
    assert slot["id"].startswith("call_")
    jsonschema.validate(json.loads(slot["arguments"]), schemas[slot["name"]])
out["stream"] = [{"name": s["name"], "arguments": json.loads(s["arguments"])} for s in calls.values()]
assert out["stream"][0] == out["required"][0], (out["stream"], out["required"])

# A history with the call and its result: the model answers in text (tool_choice none).
first = out["required"][0]
history = ask + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": first["name"], "arguments": json.dumps(first["arguments"])}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"},
]
r = client.chat.completions.create(model=model, messages=history, tools=tools, tool_choice="none",
                                   max_tokens=30, temperature=0)
assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
out["after_result"] = r.choices[0].message.content
# auto: whatever the model chose, the response is well-formed.
r = client.chat.completions.create(model=model, messages=ask, tools=tools, max_tokens=60, temperature=0)
m = r.choices[0].message
if m.tool_calls:
    check_calls(m.tool_calls)
    assert r.choices[0].finish_reason == "tool_calls"
out["auto"] = {"tool_calls": bool(m.tool_calls), "finish_reason": r.choices[0].finish_reason}

# Bad tool definitions and choices: 400 naming the field.
errors = {}
bad = {
    "bad_name": dict(tools=[{"type": "function", "function": {"name": "no spaces"}}]),
    "bad_parameters": dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]),
    "bad_schema": dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "frob"}}}}}],
                       tool_choice="required"),
    "unknown_function": dict(tools=tools, tool_choice={"type": "function", "function": {"name": "nope"}}),
    "required_without_tools": dict(tool_choice="required"),
    "bad_history": dict(messages=ask + [{"role": "tool", "content": "x"}]),
}
for name, kw in bad.items():
    kw = {"messages": ask, "max_tokens": 5, **kw}
    try:
        client.chat.completions.create(model=model, **kw)
        errors[name] = None
    except openai.BadRequestError as e:
        errors[name] = {"status": e.status_code, "param": e.body.get("param")}
out["errors"] = errors

# LangChain: bind_tools with a forced tool, and with_structured_output over function calling.
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


llm = ChatOpenAI(base_url=base, api_key="unused", model=model, temperature=0, max_tokens=120, max_retries=0)
msg = llm.bind_tools([multiply], tool_choice="multiply", parallel_tool_calls=parallel).invoke("What is 6 times 7?")
assert msg.tool_calls and msg.tool_calls[0]["name"] == "multiply", msg
assert isinstance(msg.tool_calls[0]["args"]["a"], int)
out["langchain_bind_tools"] = msg.tool_calls[0]["args"]


class Answer(BaseModel):
    city: str = Field(max_length=30)
    population: int = Field(ge=0)


a = llm.with_structured_output(Answer, method="function_calling").invoke("Name a big city.")
assert isinstance(a, Answer), a
out["langchain_function_calling"] = a.model_dump()

# LiteLLM with tools.
import litellm

r = litellm.completion(model="openai/" + model, api_base=base, api_key="unused", messages=ask,
                       tools=tools, tool_choice="required", temperature=0, max_tokens=120,
                       parallel_tool_calls=parallel)
out["litellm"] = check_calls(r.choices[0].message.tool_calls)

print(json.dumps(out))
