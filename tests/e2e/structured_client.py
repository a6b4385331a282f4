"""Structured outputs through a running Tandem with the clients applications use: the official
`openai` SDK (`chat.completions.parse` with nested Pydantic models, `response_format`, vLLM's
`structured_outputs` in `extra_body`), LangChain's `with_structured_output` and LiteLLM.
Prints what it got as JSON; every check that needs only the response is asserted here.

Usage: python structured_client.py BASE_URL MODEL
"""
import enum
import json
import os
import sys
from typing import List, Optional

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import jsonschema
import openai
from pydantic import BaseModel, ConfigDict, Field

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base, api_key="unused", timeout=120, max_retries=0)
out = {}


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Address(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=24)
    zip_code: str = Field(pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=120)
    favourite: Color
    address: Address
    nicknames: List[str] = Field(max_length=3)
    employer: Optional[str] = Field(default=None, max_length=24)


ask = [{"role": "user", "content": "Invent a person and describe them as JSON."}]

# The SDK's parse: Pydantic model -> strict json_schema -> parsed object, greedy and sampled.
parsed = []
for temperature in (0, 1):
    r = client.chat.completions.parse(model=model, messages=ask, response_format=Person,
                                      temperature=temperature, seed=3, max_tokens=300)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "stop", r
    assert isinstance(m.parsed, Person), m
    parsed.append(m.parsed.model_dump(mode="json"))
out["parse"] = parsed

# Streamed json_schema: the deltas join into valid JSON.
schema = Person.model_json_schema()
text, finish = "", None
for ch in client.chat.completions.create(
        model=model, messages=ask, stream=True, max_tokens=300, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}):
    for c in ch.choices:
        text += c.delta.content or ""
        finish = c.finish_reason or finish
assert finish == "stop", (finish, text)
jsonschema.validate(json.loads(text), schema)
out["stream_schema"] = json.loads(text)

# json_object: any object (it may run out of tokens, so only a finished one is checked).
r = client.chat.completions.create(model=model, messages=ask, max_tokens=200, temperature=0,
                                   response_format={"type": "json_object"})
if r.choices[0].finish_reason == "stop":
    assert isinstance(json.loads(r.choices[0].message.content), dict)
out["json_object_finish"] = r.choices[0].finish_reason

# vLLM's structured_outputs and guided_* fields, chat and completions.
capital = [{"role": "user", "content": "What is the capital of France?"}]
r = client.chat.completions.create(model=model, messages=capital, max_tokens=10, temperature=1, n=4, seed=1,
                                   extra_body={"structured_outputs": {"choice": ["Paris", "Lyon", "Marseille"]}})
out["choice"] = [c.message.content for c in r.choices]
r = client.completions.create(model=model, prompt="Call me on", max_tokens=20, temperature=1, seed=2,
                              extra_body={"structured_outputs": {"regex": r" \+1-[0-9]{3}-[0-9]{4}"}})
out["regex"] = r.choices[0].text
r = client.completions.create(model=model, prompt="2 + 2 =", max_tokens=20, temperature=0,
                              extra_body={"structured_outputs": {"grammar": 'start: " " NUM "."\nNUM: /[0-9]+/'}})
out["grammar"] = r.choices[0].text
r = client.completions.create(model=model, prompt="Is water wet?", max_tokens=5, temperature=0,
                              extra_body={"guided_choice": ["yes", "no"]})
out["guided_choice"] = r.choices[0].text
# llama-server's fields: a GBNF `grammar` (streamed, chat) and a top-level `json_schema`.
gbnf = '''# yes or no, then a reason
root   ::= answer ", because " reason "."
answer ::= "Yes" | "No"
reason ::= [a-z] [a-z ]{1,40}
'''
stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Is water wet?"}],
                                        max_tokens=80, temperature=1, seed=3, stream=True, extra_body={"grammar": gbnf})
out["gbnf"] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
r = client.completions.create(model=model, prompt="A point:", max_tokens=40, temperature=0,
                              extra_body={"json_schema": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"], "additionalProperties": False}})
out["llama_json_schema"] = json.loads(r.choices[0].text)

# Refusals: the OpenAI error JSON, naming the field.
errors = {}
bad = {
    "bad_schema": dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}}),
    "bad_regex": dict(extra_body={"structured_outputs": {"regex": "[0-9"}}),
    "bad_grammar": dict(extra_body={"structured_outputs": {"grammar": "start: nowhere"}}),
    "bad_gbnf": dict(extra_body={"grammar": "root ::= answer\n"}),
    "two_constraints": dict(response_format={"type": "json_object"}, extra_body={"guided_choice": ["a"]}),
    "unknown_format": dict(response_format={"type": "xml"}),
    "ignore_eos": dict(response_format={"type": "json_object"}, extra_body={"ignore_eos": True}),
}
for name, kw in bad.items():
    try:
        client.chat.completions.create(model=model, messages=capital, max_tokens=5, **kw)
        errors[name] = None
    except openai.BadRequestError as e:
        errors[name] = {"status": e.status_code, "param": e.body.get("param"), "message": e.body.get("message")}
out["errors"] = errors

# LangChain: with_structured_output, json_schema (parsed Pydantic) and json_mode (a dict).
from langchain_openai import ChatOpenAI

llm = ChatOpenAI(base_url=base, api_key="unused", model=model, temperature=0, max_tokens=300, max_retries=0)
p = llm.with_structured_output(Person, method="json_schema").invoke("Invent a person.")
assert isinstance(p, Person), p
out["langchain_json_schema"] = p.model_dump(mode="json")
d = llm.with_structured_output({"title": "anything", "type": "object"}, method="json_mode").invoke(
    "Describe a cat as a JSON object with keys name and colour.")
out["langchain_json_mode"] = type(d).__name__

# LiteLLM, as an OpenAI-compatible provider, with a Pydantic response_format.
import litellm

r = litellm.completion(model="openai/" + model, api_base=base, api_key="unused", messages=ask,
                       response_format=Person, temperature=0, max_tokens=300)
out["litellm"] = Person.model_validate_json(r.choices[0].message.content).model_dump(mode="json")

print(json.dumps(out))
