"""The Responses API through the official `openai` SDK and the official Agents SDK (`openai-agents`), against a
running zerolayer frontend serving the bundled model.

Run by e2e/tests/responses.rs with ZL_BASE_URL, ZL_API_KEY and ZL_MODEL set; the last line printed is
"responses: ok".
"""

import asyncio
import json
import os
import sys

import openai
import pydantic

from common import expect

BASE = os.environ["ZL_BASE_URL"]
KEY = os.environ["ZL_API_KEY"]
MODEL = os.environ["ZL_MODEL"]
SYSTEM = "You are a helpful assistant."


def check_responses():
    client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)

    plain = client.responses.create(
        model=MODEL, instructions=SYSTEM, input="What is the capital of France?", max_output_tokens=24,
        temperature=0, store=False,
    )
    assert plain.object == "response" and plain.id.startswith("resp_"), plain
    assert plain.status in ("completed", "incomplete"), plain.status
    assert "Paris" in plain.output_text, plain.output_text
    assert plain.output[0].type == "message" and plain.output[0].content[0].type == "output_text", plain.output
    assert plain.usage.total_tokens == plain.usage.input_tokens + plain.usage.output_tokens > 0, plain.usage
    print("responses create:", repr(plain.output_text))

    # Streamed: the official event sequence, numbered, ending with response.completed; the same text.
    events = list(client.responses.create(
        model=MODEL, instructions=SYSTEM, input=[{"role": "user", "content": "What is the capital of France?"}],
        max_output_tokens=24, temperature=0, store=False, stream=True,
    ))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"], kinds
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          events[-1].type], kinds
    assert events[-1].type in ("response.completed", "response.incomplete"), kinds
    assert [e.sequence_number for e in events] == list(range(len(events))), kinds
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == plain.output_text == events[-1].response.output_text, (streamed, plain.output_text)

    # The output text's log-probabilities, with include and top_logprobs: the same in the stream and whole.
    scored = client.responses.create(
        model=MODEL, instructions=SYSTEM, input="What is the capital of France?", max_output_tokens=8, temperature=0,
        store=False, include=["message.output_text.logprobs"], top_logprobs=2,
    )
    entries = scored.output[0].content[0].logprobs
    assert entries and "".join(t.token for t in entries).startswith(scored.output_text), entries
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token and t.logprob <= 0 for t in entries)
    streamed_scores = [t for e in client.responses.create(
        model=MODEL, instructions=SYSTEM, input="What is the capital of France?", max_output_tokens=8, temperature=0,
        store=False, include=["message.output_text.logprobs"], top_logprobs=2, stream=True,
    ) if e.type == "response.output_text.delta" for t in e.logprobs]
    assert [(t.token, t.logprob) for t in streamed_scores] == [(t.token, t.logprob) for t in entries], streamed_scores

    # A function tool round trip: the call comes back as a function_call item; its output, sent with the whole
    # conversation as input items, gives the answer.
    weather = {
        "type": "function", "name": "get_weather", "description": "Current weather for a city.", "strict": True,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                       "additionalProperties": False},
    }
    question = {"role": "user", "content": "What is the weather in Paris?"}
    called = client.responses.create(
        model=MODEL, input=[question], tools=[weather], tool_choice="required", max_output_tokens=64, temperature=0,
        store=False,
    )
    calls = [o for o in called.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments), called.output
    answer = client.responses.create(
        model=MODEL, tools=[weather], max_output_tokens=32, temperature=0, store=False,
        input=[question, {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
                          "arguments": calls[0].arguments},
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 24 C"}],
    )
    assert answer.output_text, answer.output
    print("responses tool round trip:", calls[0].arguments, "->", repr(answer.output_text))
    streamed_call = list(client.responses.create(
        model=MODEL, input=[question], tools=[weather], tool_choice="required", max_output_tokens=64, temperature=0,
        store=False, stream=True,
    ))
    deltas = "".join(e.delta for e in streamed_call if e.type == "response.function_call_arguments.delta")
    done = [e for e in streamed_call if e.type == "response.function_call_arguments.done"]
    assert done and deltas == done[0].arguments == calls[0].arguments, (deltas, done)

    # text.format json_schema, through the SDK's parse helper.
    class Capital(pydantic.BaseModel):
        country: str
        capital: str

    parsed = client.responses.parse(
        model=MODEL, instructions=SYSTEM, input="What is the capital of France?", text_format=Capital,
        max_output_tokens=64, temperature=0, store=False,
    )
    assert isinstance(parsed.output_parsed, Capital), parsed.output
    print("responses parse:", parsed.output_parsed)

    # Stored (the default): the same tool round trip continued with previous_response_id, which reads the stored
    # conversation (the question and the call) before the new input: the same answer as sending it all.
    stored_call = client.responses.create(
        model=MODEL, input=[question], tools=[weather], tool_choice="required", max_output_tokens=64, temperature=0,
    )
    assert stored_call.store is True and stored_call.output[0].type == "function_call", stored_call
    call_id = stored_call.output[0].call_id
    continued = client.responses.create(
        model=MODEL, tools=[weather], max_output_tokens=32, temperature=0, previous_response_id=stored_call.id,
        input=[{"type": "function_call_output", "call_id": call_id, "output": "Sunny, 24 C"}],
    )
    assert continued.previous_response_id == stored_call.id, continued
    assert continued.output_text == answer.output_text, (continued.output_text, answer.output_text)
    print("responses previous_response_id round trip:", repr(continued.output_text))
    got = client.responses.retrieve(stored_call.id)
    assert got.id == stored_call.id and got.output[0].arguments == stored_call.output[0].arguments, got
    items = client.responses.input_items.list(continued.id)
    assert [i.type for i in items.data] == ["function_call_output"], items.data
    first = client.responses.input_items.list(stored_call.id, order="asc")
    assert first.data[0].type == "message" and first.data[0].role == "user", first.data
    # Streamed and stored: the completed event comes once the record is stored, so it reads back at once.
    events = list(client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=8, temperature=0,
                                          stream=True))
    streamed_id = events[-1].response.id
    assert events[-1].type in ("response.completed", "response.incomplete"), events[-1]
    assert client.responses.retrieve(streamed_id).output_text == events[-1].response.output_text
    client.responses.delete(streamed_id)
    expect(openai.NotFoundError, lambda: client.responses.retrieve(streamed_id))
    print("stored id:", stored_call.id)

    # What is not served is refused by name; unknown stored responses are not found.
    e = expect(openai.NotFoundError, lambda: client.responses.create(
        model=MODEL, input="hi", previous_response_id="resp_x"))
    assert e.body["param"] == "previous_response_id", e.body
    e = expect(openai.BadRequestError, lambda: client.responses.create(
        model=MODEL, input="hi", conversation="conv_1", store=False))
    assert e.body["param"] == "conversation", e.body
    e = expect(openai.BadRequestError, lambda: client.responses.create(
        model=MODEL, input="hi", tools=[{"type": "web_search"}], store=False))
    assert e.body["param"] == "tools" and "web_search" in e.message, e.body
    e = expect(openai.BadRequestError, lambda: client.responses.create(
        model=MODEL, input="hi", max_output_tokens=0, store=False))
    assert e.body["param"] == "max_output_tokens", e.body
    expect(openai.NotFoundError, lambda: client.responses.retrieve("resp_nothing"))
    expect(openai.NotFoundError, lambda: client.responses.delete("resp_nothing"))


def check_agents():
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    seen = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        seen.append(city)
        return f"Sunny, 24 C in {city}"

    client = openai.AsyncOpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
    agent = Agent(
        name="weather",
        instructions="Use the get_weather tool to answer questions about the weather.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=MODEL, openai_client=client),
        model_settings=ModelSettings(temperature=0, max_tokens=64, store=False, tool_choice="required"),
        tool_use_behavior="stop_on_first_tool",
    )
    result = asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=3))
    assert seen, "the agent called no tool"
    assert result.final_output.startswith("Sunny, 24 C in"), result.final_output
    print("agents:", seen, "->", repr(result.final_output))


check_responses()
print("responses api: ok")
check_agents()
print("agents sdk: ok")
print("responses: ok")
sys.stdout.flush()
