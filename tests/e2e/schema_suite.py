"""Every schema of json_schemas.json (50: nested objects, arrays with bounds, enums, anyOf/oneOf,
patterns, number ranges, required/optional fields, $defs) sent through a running Tandem as
`response_format` json_schema with the official `openai` SDK, at temperature 0 and 1, 32
requests at a time; each output is checked with the `jsonschema` package (Draft 2020-12).
Prints a JSON report: per temperature, how many outputs were valid and which were not.

Usage: python schema_suite.py BASE_URL MODEL
"""
import concurrent.futures
import json
import os
import sys

import jsonschema
import openai

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base, api_key="unused", timeout=600, max_retries=0)
cases = json.load(open(os.path.join(os.path.dirname(__file__), "json_schemas.json")))


def run(case, temperature):
    try:
        r = client.chat.completions.create(
            model=model, temperature=temperature, seed=11, max_tokens=600,
            messages=[{"role": "user", "content": case["prompt"] + " Answer in JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": case["name"], "schema": case["schema"], "strict": True}})
    except openai.BadRequestError as e:
        return {"name": case["name"], "refused": e.body.get("message")}
    text = r.choices[0].message.content
    try:
        jsonschema.Draft202012Validator(case["schema"]).validate(json.loads(text))
        return None
    except Exception as e:  # noqa: BLE001 - any failure is a reportable miss
        return {"name": case["name"], "finish_reason": r.choices[0].finish_reason, "text": text, "error": str(e)[:200]}


report = {}
with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
    for temperature in (0, 1):
        misses = [m for m in pool.map(lambda c: run(c, temperature), cases) if m]
        report[str(temperature)] = {"total": len(cases), "valid": len(cases) - len(misses), "invalid": misses}
print(json.dumps(report))
