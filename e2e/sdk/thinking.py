"""Thinking sections through the official SDKs, against `zl up` serving a Qwen3 with Qwen3's thinking switch in its
chat template (random weights: the section is closed by its budget, never by the model).

Run by e2e/tests/thinking.rs with ZL_BASE_URL, ZL_API_KEY and ZL_MODEL set; the last line printed is "thinking: ok".
"""

import os
import sys

import anthropic
import openai
import pydantic

BASE = os.environ["ZL_BASE_URL"]
KEY = os.environ["ZL_API_KEY"]
MODEL = os.environ["ZL_MODEL"]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
MARKERS = ("<think>", "</think>")


def clean(text):
    return not any(m in text for m in MARKERS)


def check_anthropic():
    client = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)
    seeded = {"temperature": 0.8, "seed": 3}
    thinking = {"type": "enabled", "budget_tokens": 8}
    msg = client.messages.create(model=MODEL, max_tokens=24, extra_body=seeded, thinking=thinking, messages=QUESTION)
    kinds = [b.type for b in msg.content]
    assert kinds == ["thinking", "text"], msg.content
    thought, answer = msg.content[0], msg.content[1]
    assert thought.thinking.strip() and thought.signature, thought
    assert clean(thought.thinking) and clean(answer.text), msg.content
    assert msg.usage.output_tokens == 24, msg.usage

    # Streamed: a thinking block (thinking deltas, then its signature), then the text block; the same content.
    with client.messages.stream(
        model=MODEL, max_tokens=24, extra_body=seeded, thinking=thinking, messages=QUESTION
    ) as stream:
        events = [e for e in stream]
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"], final.content
    assert final.content[0].thinking == thought.thinking and final.content[1].text == answer.text, final.content
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert "thinking_delta" in deltas and "signature_delta" in deltas and deltas.index("signature_delta") < len(deltas)
    first_text = next(i for i, d in enumerate(deltas) if d == "text_delta")
    assert deltas.index("signature_delta") < first_text, deltas

    # Thinking sent back in a later turn is accepted (and left out, as the template does).
    again = client.messages.create(
        model=MODEL, max_tokens=4, extra_body=seeded,
        messages=QUESTION + [{"role": "assistant", "content": [b.model_dump() for b in msg.content]},
                             {"role": "user", "content": "And of Spain?"}],
    )
    # Disabled (the default): the template's switch closes the section in the prompt; no thinking block.
    assert [b.type for b in again.content] == ["text"], again.content
    assert clean(again.content[0].text)
    e = None
    try:
        client.messages.create(model=MODEL, max_tokens=8, thinking={"type": "enabled", "budget_tokens": 8},
                               messages=QUESTION)
    except anthropic.BadRequestError as err:
        e = err
    assert e is not None and "budget_tokens" in e.message, e

    # With an output format: the section is the model's, the answer after it the schema's (parsed by the SDK).
    class Capital(pydantic.BaseModel):
        city: str
        population: int

    parsed = client.messages.parse(
        model=MODEL, max_tokens=96, extra_body=seeded, thinking=thinking, messages=QUESTION, output_format=Capital
    )
    assert [b.type for b in parsed.content] == ["thinking", "text"], parsed.content
    assert isinstance(parsed.parsed_output, Capital) and clean(parsed.content[1].text), parsed


def check_openai():
    client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
    done = client.chat.completions.create(
        model=MODEL, max_tokens=700, seed=3, temperature=0.8, reasoning_effort="low", messages=QUESTION,
        stop=None,
    )
    message = done.choices[0].message
    reasoning = message.model_extra.get("reasoning_content")
    assert reasoning and clean(reasoning) and clean(message.content or ""), message
    chunks = list(client.chat.completions.create(
        model=MODEL, max_tokens=700, seed=3, temperature=0.8, reasoning_effort="low", messages=QUESTION, stream=True,
    ))
    streamed_reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed_reasoning == reasoning and streamed == (message.content or ""), (streamed_reasoning, streamed)
    off = client.chat.completions.create(
        model=MODEL, max_tokens=8, seed=3, messages=QUESTION, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    assert off.choices[0].message.model_extra.get("reasoning_content") is None, off


check_anthropic()
print("anthropic thinking: ok")
check_openai()
print("openai reasoning: ok")
print("thinking: ok")
sys.stdout.flush()
