"""Drives skippy-server with the official openai Python package (v1): a chat completion, its greedy
repeat from the cache, a completion, a streamed chat, log-probabilities, structured output (a JSON
schema in response_format) and a wrong key.

    python3 openai_client.py PACKAGES_DIR BASE_URL API_KEY

Exits non-zero (with a message) on any failure.
"""
import json
import sys

packages, base_url, api_key = sys.argv[1:4]
sys.path.insert(0, packages)
import openai  # noqa: E402


def check(cond, what):
    if not cond:
        print("FAIL: " + what, file=sys.stderr)
        sys.exit(1)


# Long enough to be cached in either flash-attention setting (64+ tokens when it is on).
system = "You are a helpful assistant. " * 16
messages = [{"role": "system", "content": system}, {"role": "user", "content": "Say hello."}]

client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
models = client.models.list()
check(len(models.data) == 1, "one model listed")
model = models.data[0].id

chat = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0,
                                      logprobs=True, top_logprobs=2)
check(chat.object == "chat.completion", "chat object")
check(isinstance(chat.choices[0].message.content, str), "chat content is a string")
check(chat.usage and chat.usage.completion_tokens > 0, "chat usage")
lp = chat.choices[0].logprobs
check(lp is not None and len(lp.content) == chat.usage.completion_tokens, "one logprob per token")
check(all(len(t.top_logprobs) == 2 for t in lp.content), "two top logprobs per token")

again = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0,
                                       logprobs=True, top_logprobs=2)
check(again.choices[0].message.content == chat.choices[0].message.content, "greedy repeat is identical")
check(again.choices[0].logprobs == lp, "the repeat's logprobs are identical")
check(again.usage.prompt_tokens_details.cached_tokens > 0, "repeat hits the cache")

completion = client.completions.create(model=model, prompt="Once upon a time", max_tokens=5, temperature=0)
check(completion.object == "text_completion", "completion object")
check(isinstance(completion.choices[0].text, str), "completion text")

chunks, finish = 0, None
for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Stream a few tokens."}],
                                            max_tokens=5, stream=True):
    chunks += 1
    if chunk.choices and chunk.choices[0].finish_reason:
        finish = chunk.choices[0].finish_reason
check(chunks >= 2, "streamed chunks")
check(finish in ("length", "stop"), "stream finish reason")

schema = {"type": "object", "properties": {"answer": {"enum": ["left", "right"]}}, "required": ["answer"],
          "additionalProperties": False}
structured = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Left or right?"}], max_tokens=200, temperature=0,
    response_format={"type": "json_schema", "json_schema": {"name": "pick", "schema": schema, "strict": True}})
try:
    picked = json.loads(structured.choices[0].message.content)
except ValueError:
    picked = None
check(isinstance(picked, dict) and picked.get("answer") in ("left", "right") and len(picked) == 1,
      "a response_format JSON schema shapes the answer: " + repr(structured.choices[0].message.content))
check(structured.choices[0].finish_reason == "stop", "a structured answer ends with the schema")

try:
    openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
    check(False, "a wrong key is refused")
except openai.AuthenticationError as e:
    check(e.status_code == 401, "a wrong key is a 401")

try:
    client.chat.completions.create(model=model, messages=messages, max_tokens=4, top_p=5)
    check(False, "top_p 5 is refused")
except openai.BadRequestError as e:
    check(e.status_code == 400, "a bad parameter is a 400")

print("openai python client: OK")
