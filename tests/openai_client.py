"""Drives a running mlx-bun server with the official `openai` client.

Usage: openai_client.py BASE_URL [API_KEY]  (run through scripts/test-openai-client.sh)
Exits non-zero with a message on the first mismatch.
"""

import sys

import openai


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")


def main():
    base = sys.argv[1].rstrip("/")
    key = sys.argv[2] if len(sys.argv) > 2 else "not-needed"
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=300)

    models = client.models.list()
    check(len(models.data) == 1 and models.data[0].id, "models.list returns the served model")
    model = models.data[0].id

    messages = [{"role": "user", "content": "Name a color."}]
    chat = client.chat.completions.create(
        model=model, messages=messages, max_tokens=6, temperature=0
    )
    text = chat.choices[0].message.content
    check(chat.object == "chat.completion", "chat object type")
    check(chat.choices[0].message.role == "assistant", "assistant role")
    check(bool(text), "chat returns text")
    check(chat.choices[0].finish_reason in ("stop", "length"), "chat finish_reason")
    check(
        chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens,
        "chat usage adds up",
    )

    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(streamed == text, f"streamed chat {streamed!r} equals non-streamed {text!r}")
    check(chunks[-1].usage is not None, "include_usage gives a usage chunk")
    check(
        chunks[-1].usage.completion_tokens == chat.usage.completion_tokens,
        "streamed usage matches",
    )
    check(
        chunks[-1].usage.prompt_tokens_details.cached_tokens > 0,
        "the repeated prompt hits the prompt cache",
    )

    completion = client.completions.create(
        model=model, prompt="The sky is", max_tokens=5, temperature=0, logprobs=2
    )
    check(completion.object == "text_completion", "completion object type")
    check(bool(completion.choices[0].text), "completion returns text")
    lp = completion.choices[0].logprobs
    check(len(lp.tokens) == completion.usage.completion_tokens, "one logprob per token")
    check(all(len(t) <= 2 for t in lp.top_logprobs), "top logprobs are bounded by k")

    pieces = list(
        client.completions.create(
            model=model, prompt="The sky is", max_tokens=5, temperature=0, stream=True
        )
    )
    check(
        "".join(p.choices[0].text for p in pieces if p.choices) == completion.choices[0].text,
        "streamed completion equals non-streamed",
    )

    try:
        client.chat.completions.create(model=model, messages=[], max_tokens=3)
        raise SystemExit("FAILED: empty messages were accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400, "empty messages give 400")

    print("openai client: all checks passed")


if __name__ == "__main__":
    main()
