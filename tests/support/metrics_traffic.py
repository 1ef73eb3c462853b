"""The traffic the metrics tests send, the same to this project's frontend
and to vLLM's: the toy model with a KV cache of 8 blocks of 16 tokens
(`CACHE_ARGS`), a prompt repeated (prefix-cache hits), two requests of 120
tokens at once (the one admitted second is preempted; the pair is sent again
when the first finished before the second arrived), a chat request with
`n` choices, a request for a route that does not exist, then the engines put
to sleep and woken up (vLLM's frontend serves `/sleep` and `/wake_up` only
with `VLLM_SERVER_DEV_MODE=1`)."""

from __future__ import annotations

import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai

from tests.support.prometheus_text import parse

MODEL = "toy"
#: `serve` options: 8 blocks of 16 tokens, so one request of 120 tokens fills the cache.
CACHE_ARGS = ("--num-gpu-blocks", "8", "--block-size", "16", "--max-model-len", "128")
#: A prompt of 41 tokens (the toy tokenizer: one per byte): two full blocks can be cached.
PROMPT = "The quick brown fox jumps over the lazy d"
#: Every request runs to its `max_tokens` (finish reason `length`).
NO_EOS = {"extra_body": {"ignore_eos": True}}
#: Times the pair of long requests is sent at most, waiting for a preemption.
PREEMPTION_ATTEMPTS = 5


def drive(base_url: str, n: int = 2, api_key: str = "none") -> dict[str, int]:
    """Sends the traffic to the server at `base_url`, the chat request with
    `n` choices (vLLM 0.33's frontend refuses more than 1); returns what the
    client saw: `prompt` and `completion` tokens (each engine request's
    prompt counted once per request), engine `requests` finished, the sums of
    their `max_tokens` and `n`, `http` POST calls answered (`/sleep` and
    `/wake_up` among them) and `completions` calls among them."""
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=120)
    seen = {"prompt": 0, "completion": 0, "requests": 0, "max_tokens": 0, "n": 0, "http": 0, "completions": 0}

    def count(usage, max_tokens: int, children: int = 1, route: str = "completions") -> None:
        seen["prompt"] += usage.prompt_tokens * children
        seen["completion"] += usage.completion_tokens
        seen["requests"] += children
        seen["max_tokens"] += max_tokens * children
        seen["n"] += children * children
        seen["http"] += 1
        seen["completions"] += route == "completions"

    # The same prompt twice: the second finds two blocks in the prefix cache.
    for _ in range(2):
        count(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, **NO_EOS).usage, 4)
    # Two requests of 120 tokens at once: the one admitted second is
    # preempted when the first needs the whole cache, if it arrives before
    # the first finished (on a busy host it may not: then again).
    for _ in range(PREEMPTION_ATTEMPTS):
        first = client.completions.create(
            model=MODEL, prompt=PROMPT[:30], max_tokens=90, stream=True, stream_options={"include_usage": True},
            **NO_EOS,
        )  # fmt: skip
        chunks = iter(first)
        next(chunks)  # the first request runs before the second arrives
        with ThreadPoolExecutor(1) as pool:
            second = pool.submit(client.completions.create, model=MODEL, prompt=PROMPT[1:31], max_tokens=90, **NO_EOS)
            usage = [c.usage for c in chunks if c.usage is not None]
            count(second.result().usage, 90)
        assert len(usage) == 1, usage
        count(usage[0], 90)
        # The preemption was counted before the second request's last output.
        if parse(scrape(base_url)).total("vllm:num_preemptions_total") > 0:
            break
    # With n = 2, two engine requests.
    messages = [{"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, n=n, **NO_EOS)
    count(chat.usage, 3, children=n, route="chat")
    try:
        urllib.request.urlopen(f"{base_url}/nope", timeout=30)
    except urllib.error.HTTPError as e:
        assert e.code == 404
    else:
        raise AssertionError("/nope answered")
    for path in ("/sleep?level=1", "/wake_up"):
        request = urllib.request.Request(
            f"{base_url}{path}", method="POST", headers={"authorization": f"Bearer {api_key}"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200, path
        seen["http"] += 1
    return seen


def scrape(base_url: str) -> str:
    """The text of `GET /metrics`."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as response:
        return response.read().decode()
