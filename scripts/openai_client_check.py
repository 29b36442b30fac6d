#!/usr/bin/env python3
"""Check mllm-server's OpenAI compatibility with the official `openai` Python client.

Usage:
    python3 scripts/openai_client_check.py --base-url http://127.0.0.1:PORT/v1 [--api-key KEY]

Needs the `openai` package (`pip install openai`); scripts/openai_client_check.sh installs
it into a throwaway virtual environment. The checks:

  * GET /models lists at least one model; the first one's id is used below;
  * a non-streamed chat completion answers "Paris" with a finish_reason of stop/length
    and a usage with prompt and completion tokens;
  * the same chat streamed with stream_options.include_usage gives exactly the same
    text and a final usage chunk;
  * a non-streamed text completion returns non-empty text;
  * a bad request (temperature=-1) raises openai.BadRequestError with an error body.

Prints "openai client: N checks passed" and exits 0, or prints each failure and exits 1.
"""

import argparse
import os
import sys

try:
    import openai
    from openai import OpenAI
except ImportError:
    print("openai client: the `openai` package is not installed (pip install openai)")
    sys.exit(1)

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
FINISH_REASONS = ("stop", "length")


class CheckFailed(Exception):
    """One expectation did not hold."""


class Checker:
    """Counts passed expectations and collects failures of whole check steps."""

    def __init__(self):
        self.passed = 0
        self.failures = []

    def expect(self, condition, what):
        if not condition:
            raise CheckFailed(what)
        self.passed += 1

    def run(self, name, step, *args):
        """Runs one step; returns its result, or None after recording its failure."""
        try:
            return step(self, *args)
        except CheckFailed as e:
            self.failures.append(f"{name}: {e}")
        except Exception as e:  # any client or protocol error fails the step
            cause = f" ({e.__cause__!r})" if e.__cause__ is not None else ""
            self.failures.append(f"{name}: {type(e).__name__}: {e}{cause}")
        return None


def list_models(c, client):
    models = client.models.list().data
    c.expect(len(models) > 0, "GET /models returned no models")
    c.expect(
        all(m.object == "model" for m in models),
        f"model objects must have object='model': {models!r}",
    )
    return models[0].id


def chat(c, client, model):
    resp = client.chat.completions.create(
        model=model, messages=MESSAGES, temperature=0, max_tokens=32
    )
    c.expect(len(resp.choices) == 1, f"expected 1 choice, got {len(resp.choices)}")
    choice = resp.choices[0]
    text = choice.message.content or ""
    c.expect("Paris" in text, f"reply does not contain 'Paris': {text!r}")
    c.expect(
        choice.finish_reason in FINISH_REASONS,
        f"finish_reason {choice.finish_reason!r} not in {FINISH_REASONS}",
    )
    usage = resp.usage
    c.expect(
        usage is not None and usage.prompt_tokens > 0,
        f"usage.prompt_tokens must be > 0: {usage!r}",
    )
    c.expect(usage.completion_tokens > 0, f"usage.completion_tokens must be > 0: {usage!r}")
    return text


def chat_stream(c, client, model, expected):
    stream = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        temperature=0,
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage_chunks, finish_reason = [], [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage_chunks.append(chunk)
        for choice in chunk.choices:
            if choice.delta.content:
                parts.append(choice.delta.content)
            if choice.finish_reason is not None:
                finish_reason = choice.finish_reason
    text = "".join(parts)
    c.expect(expected is not None, "no non-streamed reply to compare with")
    c.expect(text == expected, f"streamed text {text!r} != non-streamed text {expected!r}")
    c.expect(
        finish_reason in FINISH_REASONS,
        f"finish_reason {finish_reason!r} not in {FINISH_REASONS}",
    )
    c.expect(len(usage_chunks) == 1, f"expected 1 usage chunk, got {len(usage_chunks)}")
    last = usage_chunks[0]
    c.expect(last.choices == [], f"usage chunk must have choices=[]: {last!r}")
    c.expect(
        last.usage.completion_tokens > 0 and last.usage.prompt_tokens > 0,
        f"usage chunk must count prompt and completion tokens: {last.usage!r}",
    )


def completion(c, client, model):
    resp = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    c.expect(len(resp.choices) == 1, f"expected 1 choice, got {len(resp.choices)}")
    text = resp.choices[0].text
    c.expect(bool(text), f"completion text is empty: {resp!r}")
    c.expect(
        resp.choices[0].finish_reason in FINISH_REASONS,
        f"finish_reason {resp.choices[0].finish_reason!r} not in {FINISH_REASONS}",
    )


def bad_request(c, client, model):
    try:
        client.chat.completions.create(
            model=model, messages=MESSAGES, temperature=-1, max_tokens=8
        )
    except openai.BadRequestError as e:
        c.expect(e.status_code == 400, f"expected HTTP 400, got {e.status_code}")
        c.expect(
            isinstance(e.body, dict) and bool(e.body.get("message")),
            f"error body must have a message: {e.body!r}",
        )
        return
    c.expect(False, "temperature=-1 was accepted")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8080/v1")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY") or "no-key",
        help="API key (default: $OPENAI_API_KEY, else a placeholder)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    client = OpenAI(
        base_url=args.base_url,
        api_key=args.api_key,
        max_retries=0,
        timeout=args.timeout,
        # Talk to the given URL directly, whatever proxy the environment names.
        http_client=openai.DefaultHttpxClient(trust_env=False),
    )
    c = Checker()
    model = c.run("list models", list_models, client)
    if model is not None:
        reply = c.run("chat", chat, client, model)
        c.run("chat stream", chat_stream, client, model, reply)
        c.run("completion", completion, client, model)
        c.run("bad request", bad_request, client, model)

    if c.failures:
        for failure in c.failures:
            print(f"FAIL {failure}")
        print(f"openai client: {c.passed} checks passed, {len(c.failures)} failed")
        return 1
    print(f"openai client: {c.passed} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
