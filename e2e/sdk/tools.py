"""Tool use and structured outputs with the official Anthropic and OpenAI Python SDKs against a running zerolayer
frontend, and the schema property check: constrained answers to two dozen varied JSON Schemas, across seeds, all
validate (with the `jsonschema` package, independent of the server's grammar engine).

Run by e2e/tests/tools.rs with ZL_BASE_URL, ZL_API_KEY and ZL_MODEL set. Every check raises on failure; the last
line printed is "tools: ok".
"""

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import anthropic
import jsonschema
import openai
import pydantic

from common import expect

BASE = os.environ["ZL_BASE_URL"]
KEY = os.environ["ZL_API_KEY"]
MODEL = os.environ["ZL_MODEL"]
SYSTEM = "You are a helpful assistant."

WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
    },
}
TIME = {
    "name": "get_time",
    "description": "Current local time in a time zone.",
    "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_anthropic():
    client = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)
    forced = {"type": "tool", "name": "get_weather"}

    # A forced call: one tool_use block whose input validates against the tool's schema.
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=100, system=SYSTEM, messages=ASK, tools=[WEATHER, TIME], tool_choice=forced,
        extra_body={"temperature": 0},
    )
    msg = raw.parse()
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert len(uses) >= 1 and msg.stop_reason == "tool_use", msg
    call = uses[0]
    assert call.name == "get_weather" and call.id.startswith("toolu_"), call
    jsonschema.validate(call.input, WEATHER["input_schema"])
    print("anthropic forced call:", call.input)
    # Deterministic, so cached: the same request answers from the cache; another schema does not.
    again = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=100, system=SYSTEM, messages=ASK, tools=[WEATHER, TIME], tool_choice=forced,
        extra_body={"temperature": 0},
    )
    assert again.headers["x-zl-cache"] == "hit", again.headers
    assert [b.input for b in again.parse().content if b.type == "tool_use"][0] == call.input
    other = dict(WEATHER, input_schema={"type": "object", "properties": {"town": {"type": "string"}}, "required": ["town"]})
    miss = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=100, system=SYSTEM, messages=ASK, tools=[other], tool_choice=forced,
        extra_body={"temperature": 0},
    )
    assert miss.headers["x-zl-cache"] == "miss", miss.headers
    assert "town" in [b for b in miss.parse().content if b.type == "tool_use"][0].input

    # The tool's result goes back, and the model answers.
    follow = client.messages.create(
        model=MODEL, max_tokens=60, system=SYSTEM, tools=[WEATHER, TIME],
        messages=ASK + [
            {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees and sunny"}]},
        ],
        extra_body={"temperature": 0},
    )
    assert follow.content and follow.stop_reason in ("end_turn", "max_tokens", "tool_use"), follow
    print("anthropic after tool_result:", follow.content[0])
    # A result that answers no call is refused as the hosted API refuses it.
    e = expect(anthropic.BadRequestError, lambda: client.messages.create(
        model=MODEL, max_tokens=8, tools=[WEATHER],
        messages=ASK + [{"role": "assistant", "content": "Let me see."},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "x"}]}],
    ))
    assert "tool_use_id" in e.message, e.message

    # Streaming tool use, assembled by the SDK's stream helper from input_json_delta events.
    with client.messages.stream(
        model=MODEL, max_tokens=100, system=SYSTEM, messages=ASK, tools=[WEATHER, TIME],
        tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body={"temperature": 0.8, "seed": 3},
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds or "content_block_delta" in kinds, kinds
    uses = [b for b in final.content if b.type == "tool_use"]
    assert len(uses) == 1 and final.stop_reason == "tool_use", final
    schema = {"get_weather": WEATHER, "get_time": TIME}[uses[0].name]["input_schema"]
    jsonschema.validate(uses[0].input, schema)
    print("anthropic streamed call:", uses[0].name, uses[0].input)

    # Tools count as prompt tokens.
    plain = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=ASK).input_tokens
    with_tools = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=ASK, tools=[WEATHER]).input_tokens
    assert with_tools > plain, (plain, with_tools)

    # A schema the engine cannot enforce is a 400 naming the problem, before any token is spent.
    bad = dict(WEATHER, input_schema={"type": "object", "properties": {"x": {"type": "wizard"}}})
    e = expect(anthropic.BadRequestError, lambda: client.messages.create(
        model=MODEL, max_tokens=8, messages=ASK, tools=[bad], tool_choice=forced,
    ))
    assert "wizard" in e.message, e.message


class City(pydantic.BaseModel):
    name: str
    country: str
    population: int
    landmarks: list[str]


def check_openai():
    client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
    tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                "parameters": t["input_schema"]}} for t in (WEATHER, TIME)]
    messages = [{"role": "system", "content": SYSTEM}] + ASK

    done = client.chat.completions.create(model=MODEL, max_tokens=100, temperature=0, messages=messages,
                                          tools=tools, tool_choice="required")
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, done
    call = choice.message.tool_calls[0]
    schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]["input_schema"]
    jsonschema.validate(json.loads(call.function.arguments), schema)
    print("openai tool call:", call.function.name, call.function.arguments)

    # The result goes back as a tool message.
    follow = client.chat.completions.create(
        model=MODEL, max_tokens=60, temperature=0, tools=tools,
        messages=messages + [choice.message.model_dump(exclude_none=True),
                             {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}],
    )
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls"), follow

    # Streamed tool calls: indexed deltas, the arguments assembled.
    chunks = list(client.chat.completions.create(
        model=MODEL, max_tokens=100, seed=9, messages=messages, tools=tools, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False,
    ))
    args, names = {}, {}
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            if d.function and d.function.name:
                names[d.index] = d.function.name
            args[d.index] = args.get(d.index, "") + (d.function.arguments or "" if d.function else "")
    assert names == {0: "get_weather"}, names
    jsonschema.validate(json.loads(args[0]), WEATHER["input_schema"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls", chunks[-1]

    # response_format with a Pydantic model, through the SDK's parse helper.
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    parsed = parse(model=MODEL, max_tokens=200, temperature=0, response_format=City,
                   messages=[{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": "Describe Paris as JSON."}])
    city = parsed.choices[0].message.parsed
    assert isinstance(city, City), parsed
    print("openai parsed:", city)
    obj = client.chat.completions.create(model=MODEL, max_tokens=120, seed=1, response_format={"type": "json_object"},
                                         messages=[{"role": "user", "content": "Give me a JSON object about cats."}])
    assert isinstance(json.loads(obj.choices[0].message.content), dict), obj


# Two dozen schemas: nested objects, arrays, enums, bounded numbers, optional fields, anyOf, $defs.
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150}}, "required": ["age"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": "string", "maxLength": 30}}, "required": ["ok"]},
    {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}}, "required": ["colour"]},
    {"type": "object", "properties": {"score": {"type": "number", "minimum": -1, "maximum": 1}}, "required": ["score"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 4}}, "required": ["tags"]},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"], "additionalProperties": False}}, "required": ["point"]},
    {"type": "object", "properties": {"id": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 12}]}}, "required": ["id"]},
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}, "country": {"type": "string", "maxLength": 40}, "population": {"type": "integer", "minimum": 0}}, "required": ["city", "country"]},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 2, "maxItems": 5},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30}, "email": {"type": "string", "maxLength": 40}}, "required": ["name"]}, "active": {"type": "boolean"}}, "required": ["user", "active"]},
    {"type": "object", "properties": {"level": {"type": "integer", "enum": [1, 2, 3]}, "label": {"const": "fixed"}}, "required": ["level", "label"]},
    {"type": "object", "properties": {"temperature": {"type": "number", "exclusiveMinimum": -50, "exclusiveMaximum": 60}, "unit": {"enum": ["C", "F"]}}, "required": ["temperature", "unit"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {"sku": {"type": "string", "maxLength": 10}, "qty": {"type": "integer", "minimum": 1, "maximum": 99}}, "required": ["sku", "qty"], "additionalProperties": False}}}, "required": ["items"]},
    {"type": "object", "properties": {"answer": {"type": ["string", "null"], "maxLength": 50}}, "required": ["answer"]},
    {"type": "object", "properties": {"shape": {"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "radius": {"type": "number", "minimum": 0}}, "required": ["kind", "radius"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number", "minimum": 0}}, "required": ["kind", "side"], "additionalProperties": False}]}},
     "required": ["shape"]},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 3, "items": {"type": "array", "maxItems": 3, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}}, "required": ["matrix"]},
    {"type": "object", "$defs": {"person": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": False}},
     "properties": {"author": {"$ref": "#/$defs/person"}, "reviewer": {"$ref": "#/$defs/person"}}, "required": ["author"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}}, "required": ["code"]},
    {"type": "object", "properties": {"priority": {"enum": ["low", "medium", "high"]}, "due": {"type": "string", "maxLength": 10}, "done": {"type": "boolean"}}, "required": ["priority", "done"], "additionalProperties": False},
    {"type": "object", "properties": {"values": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 100}, "maxItems": 6}, "mean": {"type": "number"}}, "required": ["values", "mean"]},
    {"type": "object", "properties": {"meta": {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 3}}, "required": ["meta"]},
    {"type": "object", "properties": {"yes": {"type": "boolean"}}, "required": ["yes"], "additionalProperties": False},
    {"type": "object", "properties": {"count": {"type": "integer", "minimum": 10, "maximum": 20}, "word": {"type": "string", "minLength": 2, "maxLength": 8}}, "required": ["count", "word"], "additionalProperties": False},
]


def check_schemas():
    client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=300)

    def one(job):
        i, seed = job
        schema = SCHEMAS[i]
        kwargs = {"temperature": 0} if seed is None else {"seed": seed, "temperature": 1.0}
        out = client.chat.completions.create(
            model=MODEL, max_tokens=400, **kwargs,
            response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}},
            messages=[{"role": "system", "content": "Reply with JSON only."},
                      {"role": "user", "content": f"Give an example value for this JSON Schema: {json.dumps(schema)}"}],
        )
        text = out.choices[0].message.content
        try:
            jsonschema.validate(json.loads(text), schema)
        except Exception as e:
            return f"schema {i} seed {seed}: {e!r}: {text!r} ({out.choices[0].finish_reason})"
        return None

    jobs = [(i, seed) for i in range(len(SCHEMAS)) for seed in (None, 1, 2)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        failures = [f for f in pool.map(one, jobs) if f]
    assert not failures, "\n".join(failures)
    print(f"schemas: {len(jobs)} constrained answers to {len(SCHEMAS)} schemas all validate")


check_anthropic()
print("anthropic: ok")
check_openai()
print("openai: ok")
check_schemas()
print("tools: ok")
sys.stdout.flush()
