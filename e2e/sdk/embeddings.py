"""The Embeddings API through the official `openai` SDK, against a running zerolayer frontend serving an embedding
model (ZL_MODEL, a random-weight BERT of scripts/embed_models.py) beside the generative ZL_CHAT_MODEL.

Run by e2e/tests/embeddings.rs with ZL_BASE_URL, ZL_API_KEY, ZL_MODEL, ZL_CHAT_MODEL and ZL_DIMS set; the last
line printed is "embeddings: ok".
"""

import base64
import math
import os
import struct

import anthropic
import openai

from common import expect

BASE = os.environ["ZL_BASE_URL"]
KEY = os.environ["ZL_API_KEY"]
MODEL = os.environ["ZL_MODEL"]
CHAT = os.environ["ZL_CHAT_MODEL"]
DIMS = int(os.environ["ZL_DIMS"])
TEXTS = ["The capital of France is Paris.", "hello world", "A quick brown fox jumps over the lazy dog!"]


def norm(v):
    return math.sqrt(sum(x * x for x in v))


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / (norm(a) * norm(b))


def close(a, b, tol=1e-6):
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


# Every field of the SDK's request type, as this server treats it (all applied: `user` keeps an end user's requests
# on one worker). A field the SDK gains fails here until it is classified.
APPLIED = {"dimensions", "encoding_format", "input", "model", "user"}


def check_every_sdk_field():
    from openai.types import embedding_create_params

    fields = set()
    for cls in embedding_create_params.EmbeddingCreateParams.__mro__:
        fields |= set(getattr(cls, "__annotations__", {}))
    assert fields <= APPLIED, f"unclassified SDK fields {sorted(fields - APPLIED)}"


def main():
    check_every_sdk_field()
    client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)

    # Floats, a list of strings: one unit vector per input, in order, with usage.
    floats = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    assert floats.object == "list" and floats.model == MODEL, floats
    assert [d.index for d in floats.data] == [0, 1, 2], floats.data
    vectors = [d.embedding for d in floats.data]
    assert all(len(v) == DIMS and abs(norm(v) - 1) < 1e-5 for v in vectors), [len(v) for v in vectors]
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > len(TEXTS), floats.usage
    assert cosine(vectors[0], vectors[1]) < 0.99, "distinct texts, distinct vectors"
    print("embeddings float:", floats.usage, round(cosine(vectors[0], vectors[1]), 4))

    # The SDK's default: base64, which it decodes itself; the same vectors. And by hand from the raw body.
    default = client.embeddings.create(model=MODEL, input=TEXTS)
    assert all(close(d.embedding, v) for d, v in zip(default.data, vectors)), "base64 decodes to the float vectors"
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=TEXTS[0], encoding_format="base64")
    assert raw.headers.get("request-id", "").startswith("req_"), dict(raw.headers)
    body = raw.http_response.json()
    blob = base64.b64decode(body["data"][0]["embedding"])
    assert close(list(struct.unpack(f"<{len(blob) // 4}f", blob)), vectors[0]), "little-endian f32"

    # One string alone: the same vector as in the batch (batching never changes a vector).
    alone = client.embeddings.create(model=MODEL, input=TEXTS[1], encoding_format="float", user="end-user-7")
    assert close(alone.data[0].embedding, vectors[1]), "alone vs batched"

    # Matryoshka: the leading values, re-normalised.
    short = client.embeddings.create(model=MODEL, input=TEXTS[0], dimensions=16, encoding_format="float")
    head = vectors[0][:16]
    assert close(short.data[0].embedding, [x / norm(head) for x in head], 1e-5), short.data[0].embedding[:4]
    assert abs(norm(short.data[0].embedding) - 1) < 1e-5

    # Token arrays: embedded as they are (the text's own tokens, [CLS] ... [SEP] included, give its vector).
    tokens = client.embeddings.create(model=MODEL, input=[[101, 104, 105, 102]], encoding_format="float")
    assert len(tokens.data[0].embedding) == DIMS and tokens.usage.prompt_tokens == 4, tokens.usage

    # Refusals in OpenAI's shape, by parameter.
    e = expect(openai.BadRequestError, lambda: client.embeddings.create(model=MODEL, input="x", dimensions=DIMS + 1))
    assert e.body["param"] == "dimensions" and "more than" in e.body["message"], e.body
    e = expect(openai.BadRequestError, lambda: client.embeddings.create(model=MODEL, input=""))
    assert e.body["param"] == "input", e.body
    e = expect(openai.BadRequestError, lambda: client.embeddings.create(model=MODEL, input=[[10**9]]))
    assert "vocabulary" in e.body["message"], e.body
    e = expect(openai.BadRequestError, lambda: client.embeddings.create(model=MODEL, input=["word " * 600]))
    assert "context" in e.body["message"], e.body
    e = expect(openai.NotFoundError, lambda: client.embeddings.create(model="no-such-model", input="x"))
    # A generative model has no embeddings, and an embedding model does not chat (either API).
    e = expect(openai.BadRequestError, lambda: client.embeddings.create(model=CHAT, input="x"))
    assert e.body["param"] == "model" and "generates text" in e.body["message"], e.body
    e = expect(openai.BadRequestError, lambda: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4))
    assert "embedding model" in e.body["message"], e.body
    ac = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)
    e = expect(anthropic.BadRequestError, lambda: ac.messages.create(
        model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}]))
    assert "embedding model" in str(e), e
    print("embeddings refusals: ok")
    print("embeddings: ok")


if __name__ == "__main__":
    main()
