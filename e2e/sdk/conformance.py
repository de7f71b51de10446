"""The official Anthropic and OpenAI Python SDKs against a running zerolayer frontend.

Run by e2e/tests/frontend.rs with ZL_BASE_URL, ZL_API_KEY, ZL_LIMITED_KEY (a key whose project allows one request
per minute) and ZL_MODEL set. Every check raises on failure; the last line printed is "conformance: ok".
"""

import json
import os
import sys
import urllib.error
import urllib.request

import anthropic
import openai
import pydantic

from common import expect

BASE = os.environ["ZL_BASE_URL"]
KEY = os.environ["ZL_API_KEY"]
LIMITED = os.environ["ZL_LIMITED_KEY"]
MODEL = os.environ["ZL_MODEL"]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# Without a system prompt the GGUF's template injects SmolLM's own, after which this 135M model talks about French
# landmarks instead (candle's reference implementation does the same).
SYSTEM = "You are a helpful assistant."


def check_anthropic():
    client = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)

    # The current SDK has no sampling parameters of its own; they travel in extra_body.
    greedy = {"temperature": 0}
    msg = client.messages.create(model=MODEL, max_tokens=24, extra_body=greedy, system=SYSTEM, messages=QUESTION)
    assert msg.type == "message" and msg.role == "assistant", msg
    assert msg.id.startswith("msg_"), msg.id
    assert "Paris" in msg.content[0].text, msg.content
    assert msg.stop_reason in ("end_turn", "max_tokens"), msg.stop_reason
    assert msg.usage.input_tokens > 0 and 0 < msg.usage.output_tokens <= 24, msg.usage
    print("anthropic create:", repr(msg.content[0].text))

    # The same deterministic request again: identical text, served from the cache.
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=24, extra_body=greedy, system=SYSTEM, messages=QUESTION
    )
    assert raw.headers["x-zl-cache"] == "hit", raw.headers
    assert raw.headers["request-id"].startswith("req_")
    assert raw.parse().content[0].text == msg.content[0].text

    with client.messages.stream(
        model=MODEL, max_tokens=16, extra_body={"temperature": 0.7, "seed": 11}, system="Answer briefly.",
        messages=[{"role": "user", "content": "Name a colour."}],
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed and final.content[0].text == streamed, (streamed, final)
    assert final.usage.output_tokens > 0

    events = [e.type for e in client.messages.create(
        model=MODEL, max_tokens=8, extra_body=greedy, stream=True, messages=[{"role": "user", "content": "Hi!"}]
    )]
    # The SDK's iterator drops `ping` events; the raw stream below shows them.
    assert events[:2] == ["message_start", "content_block_start"], events
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"], events
    assert set(events[2:-3]) == {"content_block_delta"}, events
    with client.messages.with_streaming_response.create(
        model=MODEL, max_tokens=8, extra_body=greedy, stream=True, messages=[{"role": "user", "content": "Hi!"}]
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        names = [line[len("event: "):] for line in response.iter_lines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "content_block_start", "ping"], names
    assert names[3:] == events[2:], (names, events)

    # A prefilled assistant turn is continued, not restarted: the answer is what follows it.
    prefilled = client.messages.create(
        model=MODEL, max_tokens=8, extra_body=greedy, system=SYSTEM,
        messages=QUESTION + [{"role": "assistant", "content": "The capital of France is"}],
    )
    text = prefilled.content[0].text
    assert "Paris" in text and not text.lstrip().startswith("The capital"), text
    print("anthropic prefill:", repr(text))

    # The current SDK's structured output (`output_format` becomes `output_config.format`): a parsed object.
    class Capital(pydantic.BaseModel):
        country: str
        capital: str

    parsed = client.messages.parse(
        model=MODEL, max_tokens=64, extra_body=greedy, system=SYSTEM, messages=QUESTION, output_format=Capital
    )
    assert isinstance(parsed.parsed_output, Capital), parsed
    print("anthropic parse:", parsed.parsed_output)
    e = expect(anthropic.BadRequestError, lambda: client.messages.create(
        model=MODEL, max_tokens=4, messages=QUESTION, output_config={"effort": "high"}))
    assert "output_config.effort" in e.message, e.message

    count = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=QUESTION)
    assert count.input_tokens == msg.usage.input_tokens, (count, msg.usage)

    models = list(client.models.list())
    assert [m.id for m in models] == [MODEL], models
    assert client.models.retrieve(MODEL).id == MODEL

    bad = anthropic.Anthropic(base_url=BASE, api_key="sk-wrong", max_retries=0)
    expect(anthropic.AuthenticationError, lambda: bad.messages.create(model=MODEL, max_tokens=4, messages=QUESTION))
    e = expect(anthropic.NotFoundError, lambda: client.messages.create(model="no-such-model", max_tokens=4, messages=QUESTION))
    assert e.body["error"]["type"] == "not_found_error", e.body
    e = expect(anthropic.BadRequestError, lambda: client.messages.create(model=MODEL, max_tokens=4, extra_body={"temperature": 5}, messages=QUESTION))
    assert "temperature" in e.message, e.message
    expect(anthropic.NotFoundError, lambda: client.models.retrieve("no-such-model"))

    limited = anthropic.Anthropic(base_url=BASE, api_key=LIMITED, max_retries=0)
    limited.messages.create(model=MODEL, max_tokens=2, messages=QUESTION)
    e = expect(anthropic.RateLimitError, lambda: limited.messages.create(model=MODEL, max_tokens=2, messages=QUESTION))
    assert int(e.response.headers["retry-after"]) > 0
    assert e.response.headers["anthropic-ratelimit-requests-remaining"] == "0"


def check_openai():
    client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)

    done = client.chat.completions.create(
        model=MODEL, max_tokens=24, temperature=0, messages=[{"role": "system", "content": SYSTEM}] + QUESTION
    )
    assert done.object == "chat.completion", done
    assert "Paris" in done.choices[0].message.content, done
    assert done.choices[0].finish_reason in ("stop", "length")
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens

    chunks = list(client.chat.completions.create(
        model=MODEL, max_tokens=8, seed=5, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}],
    ))
    assert chunks[-1].usage is not None and chunks[-1].choices == [], chunks[-1]
    assert chunks[-2].choices[0].finish_reason in ("stop", "length"), chunks[-2]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text, chunks

    assert [m.id for m in client.models.list()] == [MODEL]

    bad = openai.OpenAI(base_url=BASE + "/v1", api_key="sk-wrong", max_retries=0)
    expect(openai.AuthenticationError, lambda: bad.chat.completions.create(model=MODEL, messages=QUESTION))
    expect(openai.NotFoundError, lambda: client.chat.completions.create(model="no-such-model", messages=QUESTION))
    e = expect(openai.BadRequestError, lambda: client.chat.completions.create(model=MODEL, messages=QUESTION, n=129))
    assert e.body["param"] == "n", e.body
    limited = openai.OpenAI(base_url=BASE + "/v1", api_key=LIMITED, max_retries=0)
    expect(openai.RateLimitError, lambda: limited.chat.completions.create(model=MODEL, max_tokens=2, messages=QUESTION))


def check_openai_completions_and_logprobs():
    client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
    prompt = "The capital of France is"

    # Legacy completions: the prompt continued as is; with echo and logprobs, every token of prompt and answer.
    done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=3, echo=True)
    assert done.object == "text_completion" and done.id.startswith("cmpl-"), done
    choice = done.choices[0]
    assert choice.text.startswith(prompt) and len(choice.text) > len(prompt), choice
    assert choice.finish_reason in ("stop", "length"), choice
    lp = choice.logprobs
    n_prompt, n_out = done.usage.prompt_tokens, done.usage.completion_tokens
    assert len(lp.tokens) == n_prompt + n_out == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset), lp
    assert "".join(lp.tokens) == choice.text, (lp.tokens, choice.text)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, lp
    assert all(x <= 0 for x in lp.token_logprobs[1:]), lp.token_logprobs
    assert all(1 <= len(t) <= 3 for t in lp.top_logprobs[1:]), lp.top_logprobs
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))], lp.text_offset
    # Greedy: each answer token is its position's likeliest.
    for tok, top in zip(lp.tokens[n_prompt:], lp.top_logprobs[n_prompt:]):
        assert max(top, key=top.get) == tok, (tok, top)
    print("completions:", repr(choice.text))

    # Without echo: the answer alone, with the same values.
    plain = client.completions.create(model=MODEL, prompt=[prompt], max_tokens=6, temperature=0, logprobs=3)
    assert plain.choices[0].text == choice.text[len(prompt):], plain
    assert plain.choices[0].logprobs.token_logprobs == lp.token_logprobs[n_prompt:], plain.choices[0].logprobs
    assert plain.choices[0].logprobs.text_offset[0] == 0

    # Streamed: the same text and values, the echoed prompt first.
    chunks = list(client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=3, echo=True, stream=True,
        stream_options={"include_usage": True},
    ))
    assert chunks[-1].usage is not None and chunks[-1].choices == [], chunks[-1]
    body = [c for c in chunks if c.choices]
    assert body[0].choices[0].text == prompt, body[0]
    assert "".join(c.choices[0].text for c in body) == choice.text
    streamed = [x for c in body if c.choices[0].logprobs for x in c.choices[0].logprobs.token_logprobs]
    assert streamed == lp.token_logprobs, (streamed, lp.token_logprobs)
    offsets = [x for c in body if c.choices[0].logprobs for x in c.choices[0].logprobs.text_offset]
    assert offsets == lp.text_offset, offsets
    assert body[-1].choices[0].finish_reason == choice.finish_reason

    # Token prompts: the echo's tokens are the prompt.
    e = expect(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt=prompt, suffix="!"))
    assert "suffix" in e.message and e.body["param"] == "suffix", e.body
    e = expect(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt=[3, 99999999]))
    assert "vocabulary" in e.message, e.message
    e = expect(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt="x", frequency_penalty=3))
    assert e.body["param"] == "frequency_penalty", e.body

    # Penalties as specified: with the raw log-probabilities reported, every greedy token is the best of its
    # alternatives once each is lowered by 1.5 per earlier output and 0.5 once output at all.
    pen = client.completions.create(
        model=MODEL, prompt="one one one one one one one", max_tokens=12, temperature=0, logprobs=20,
        frequency_penalty=1.5, presence_penalty=0.5,
    )
    plp, counts = pen.choices[0].logprobs, {}
    for tok, top in zip(plp.tokens, plp.top_logprobs):
        adjusted = {t: v - 1.5 * counts.get(t, 0) - (0.5 if counts.get(t) else 0.0) for t, v in top.items()}
        assert tok in top and adjusted[tok] >= max(adjusted.values()) - 1e-4, (tok, adjusted)
        counts[tok] = counts.get(tok, 0) + 1
    unpenalized = client.completions.create(model=MODEL, prompt="one one one one one one one", max_tokens=12, temperature=0)
    assert unpenalized.choices[0].text != pen.choices[0].text, (unpenalized.choices[0].text, pen.choices[0].text)
    # A bias of +100 makes one token the whole answer; a token id outside the vocabulary is refused.
    biased = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=5, temperature=0.9, seed=1, logprobs=1, logit_bias={"1000": 100}
    )
    assert len(set(biased.choices[0].logprobs.tokens)) == 1 and len(biased.choices[0].logprobs.tokens) == 5, biased
    e = expect(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt="x", logit_bias={"99999999": 1}))
    assert "vocabulary" in e.message, e.message

    # Chat with logprobs and top_logprobs, complete and streamed.
    messages = [{"role": "system", "content": SYSTEM}] + QUESTION
    chat = client.chat.completions.create(
        model=MODEL, max_tokens=8, temperature=0, messages=messages, logprobs=True, top_logprobs=2
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens or chat.choices[0].finish_reason == "stop", content
    assert "".join(t.token for t in content).startswith(chat.choices[0].message.content), content
    for t in content:
        assert len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token, t
        assert t.top_logprobs[0].logprob == t.logprob and t.logprob <= 0 and bytes(t.bytes).decode() == t.token, t
    streamed = list(client.chat.completions.create(
        model=MODEL, max_tokens=8, temperature=0, messages=messages, logprobs=True, top_logprobs=2, stream=True
    ))
    tokens = [t for c in streamed if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in tokens] == [(t.token, t.logprob) for t in content], (tokens, content)
    e = expect(openai.BadRequestError, lambda: client.chat.completions.create(model=MODEL, messages=QUESTION, top_logprobs=2))
    assert e.body["param"] == "top_logprobs", e.body

    # Errors on OpenAI's paths are in OpenAI's shape, unknown paths and methods included.
    for method, path in [("POST", "/v1/completions/nope"), ("GET", "/v1/completions"), ("POST", "/v1/chat/nothing")]:
        request = urllib.request.Request(BASE + path, method=method, data=b"{}" if method == "POST" else None,
                                         headers={"authorization": "Bearer " + KEY, "content-type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=30)
            raise AssertionError(f"{method} {path} succeeded")
        except urllib.error.HTTPError as err:
            body = json.loads(err.read())
            assert err.code in (404, 405) and set(body) == {"error"}, (path, body)
            assert {"message", "type", "param", "code"} <= set(body["error"]), (path, body)


# Every field of the SDKs' request types, as this server treats it: applied, refused by name (a request sending the
# value shown is a 400 naming the field), or accepted without effect on the answer (hints about the hosted service:
# caching, tiers, storage, identifiers). A field the SDK gains fails here until it is classified.
APPLIED = {
    "chat": {"frequency_penalty", "logit_bias", "logprobs", "max_completion_tokens", "max_tokens", "messages", "model",
             "n", "parallel_tool_calls", "presence_penalty", "reasoning_effort", "response_format", "seed", "stop",
             "stream_options", "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user"},
    "completions": {"echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "model", "n", "best_of",
                    "presence_penalty", "prompt", "seed", "stop", "stream_options", "temperature", "top_p", "user"},
    "messages": {"max_tokens", "messages", "metadata", "model", "output_config", "stop_sequences", "system", "thinking",
                 "tool_choice", "tools"},
    "responses": {"include", "input", "instructions", "max_output_tokens", "max_tool_calls", "metadata", "model",
                  "parallel_tool_calls", "previous_response_id", "reasoning", "store", "temperature", "text",
                  "tool_choice", "tools", "top_logprobs", "top_p", "truncation", "user"},
}
REFUSED = {
    "chat": {"audio": {"voice": "alloy", "format": "wav"}, "functions": [{"name": "f", "parameters": {}}],
             "function_call": "auto", "modalities": ["text", "audio"], "moderation": {"model": "omni"},
             "verbosity": "low", "web_search_options": {}},
    "completions": {"suffix": "!"},
    "messages": {"container": "c", "inference_geo": "us"},
    "responses": {"access_programs": ["p"], "background": True, "background_options": {}, "conversation": "conv_1",
                  "context_management": [{"type": "compaction"}], "image": {"size": "auto"}, "max_tool_calls": 3,
                  "moderation": {"model": "omni"}, "prompt": {"id": "pmpt_1"}, "truncation": "auto"},
}
NO_EFFECT = {
    "chat": {"metadata", "prediction", "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention",
             "safety_identifier", "service_tier", "store"},
    "completions": set(),
    "messages": {"cache_control", "diagnostics", "service_tier", "speed", "user_profile_id", "workspace_id"},
    "responses": {"prompt_cache_key", "prompt_cache_options", "prompt_cache_retention", "safety_identifier",
                  "service_tier", "stream_options"},
}


def fields_of(typed_dict):
    names = set()
    for cls in typed_dict.__mro__:
        names |= set(getattr(cls, "__annotations__", {}))
    return names


def check_every_sdk_field():
    from anthropic.types import message_create_params
    from openai.types import completion_create_params as legacy_params
    from openai.types.chat import completion_create_params as chat_params
    from openai.types.responses import response_create_params as responses_params

    kinds = {
        "chat": fields_of(chat_params.CompletionCreateParamsBase),
        "completions": fields_of(legacy_params.CompletionCreateParamsBase),
        "messages": fields_of(message_create_params.MessageCreateParamsBase),
        "responses": fields_of(responses_params.ResponseCreateParamsBase),
    }
    for kind, fields in kinds.items():
        known = APPLIED[kind] | set(REFUSED[kind]) | NO_EFFECT[kind]
        assert fields <= known, f"{kind}: unclassified SDK fields {sorted(fields - known)}"
    base = {
        "chat": ("/v1/chat/completions", {"model": MODEL, "max_tokens": 2, "messages": QUESTION}),
        "completions": ("/v1/completions", {"model": MODEL, "max_tokens": 2, "prompt": "Hi"}),
        "messages": ("/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": QUESTION}),
        "responses": ("/v1/responses", {"model": MODEL, "max_output_tokens": 2, "input": "Hi", "store": False}),
    }
    for kind, refused in REFUSED.items():
        path, body = base[kind]
        for field, value in refused.items():
            request = urllib.request.Request(
                BASE + path, method="POST", data=json.dumps({**body, field: value}).encode(),
                headers={"authorization": "Bearer " + KEY, "content-type": "application/json"},
            )
            try:
                urllib.request.urlopen(request, timeout=60)
                raise AssertionError(f"{kind}: {field}={value!r} was accepted")
            except urllib.error.HTTPError as err:
                answer = json.loads(err.read())
                error = answer["error"]
                assert err.code == 400 and field in error["message"], (kind, field, answer)
        # The fields without effect are accepted.
        for field in NO_EFFECT[kind]:
            sample = {"metadata": {"k": "v"}, "store": False, "service_tier": "auto", "speed": "standard",
                      "cache_control": {"type": "ephemeral"}, "prediction": {"type": "content", "content": "x"},
                      "prompt_cache_key": "k", "safety_identifier": "u1"}
            if field in sample:
                request = urllib.request.Request(
                    BASE + path, method="POST", data=json.dumps({**body, field: sample[field]}).encode(),
                    headers={"authorization": "Bearer " + KEY, "content-type": "application/json"},
                )
                with urllib.request.urlopen(request, timeout=60) as response:
                    assert response.status == 200, (kind, field)


def check_openai_choices():
    """`n` answers, and several prompts in one completions request: every choice, in index order."""
    client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
    ask = dict(model=MODEL, max_tokens=12, temperature=1.0, seed=11, messages=QUESTION)
    one = client.chat.completions.create(**ask)
    three = client.chat.completions.create(n=3, **ask)
    assert [c.index for c in three.choices] == [0, 1, 2], three
    texts = [c.message.content for c in three.choices]
    # The first answer is the one n=1 gives for the seed; the others are seeded apart from it.
    assert texts[0] == one.choices[0].message.content, (texts, one)
    assert len(set(texts)) >= 2, texts
    assert three.usage.prompt_tokens == one.usage.prompt_tokens, three.usage
    assert three.usage.completion_tokens >= 3 and three.usage.total_tokens == (
        three.usage.prompt_tokens + three.usage.completion_tokens), three.usage
    # Streamed: the choices' chunks interleave, each with its index; one usage chunk, totalled, at the end.
    chunks = list(client.chat.completions.create(n=3, stream=True, stream_options={"include_usage": True}, **ask))
    streamed = {}
    for c in chunks:
        for ch in c.choices:
            streamed[ch.index] = streamed.get(ch.index, "") + (ch.delta.content or "")
    assert [streamed[i] for i in range(3)] == texts, (streamed, texts)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == three.usage.completion_tokens, chunks[-1]
    assert sum(1 for c in chunks if c.usage is not None) == 1
    finished = [ch.index for c in chunks for ch in c.choices if ch.finish_reason]
    assert sorted(finished) == [0, 1, 2], finished
    assert len({c.id for c in chunks}) == 1, {c.id for c in chunks}

    # Legacy completions: two prompts, two answers each; prompt p's answer i is choice p * 2 + i.
    prompts = ["The capital of France is", "Water boils at"]
    both = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=6, temperature=0.8, seed=3, echo=True)
    assert [c.index for c in both.choices] == [0, 1, 2, 3], both
    assert all(c.text.startswith(prompts[c.index // 2]) for c in both.choices), both
    alone = client.completions.create(model=MODEL, prompt=prompts[1], max_tokens=6, temperature=0.8, seed=3)
    assert both.choices[2].text == prompts[1] + alone.choices[0].text, (both.choices[2], alone)
    singles = [client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0) for p in prompts]
    assert both.usage.prompt_tokens == sum(x.usage.prompt_tokens for x in singles), both.usage
    streamed = {}
    for c in client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=6, temperature=0.8, seed=3,
                                       stream=True):
        for ch in c.choices:
            streamed[ch.index] = streamed.get(ch.index, "") + ch.text
    assert [prompts[i // 2] + streamed[i] for i in range(4)] == [c.text for c in both.choices], streamed
    e = expect(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt=["a"] * 65, n=2))
    assert e.body["param"] == "n", e.body
    e = expect(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt="a", best_of=3))
    assert e.body["param"] == "best_of", e.body


check_every_sdk_field()
print("sdk fields: ok")
check_anthropic()
print("anthropic: ok")
check_openai()
print("openai: ok")
check_openai_completions_and_logprobs()
print("openai completions and logprobs: ok")
check_openai_choices()
print("openai choices: ok")
print("conformance: ok")
sys.stdout.flush()
