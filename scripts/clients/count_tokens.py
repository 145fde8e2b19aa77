"""Anthropic's token counting against `mlx-bun serve`, driven by the official
`anthropic` Python client: `messages.count_tokens` and the `usage.input_tokens`
of `messages.create` for the same conversation, with and without a system
prompt and tools.

    python count_tokens.py BASE_URL

Prints one JSON line: a list of [counted, reported] pairs.
"""

import json
import sys

import anthropic

TOOLS = [
    {
        "name": "get_weather",
        "description": "Current weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
CONVERSATION = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
        ],
    },
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C, sunny"}],
    },
]


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    client = anthropic.Anthropic(base_url=sys.argv[1].rstrip("/"), api_key="unused")
    cases = [
        dict(messages=[{"role": "user", "content": "Hi"}]),
        dict(system="You are a weather assistant.", tools=TOOLS, messages=CONVERSATION[:1]),
        dict(
            system=[{"type": "text", "text": "Be brief."}],
            tools=TOOLS,
            tool_choice={"type": "auto"},
            messages=CONVERSATION,
        ),
    ]
    pairs = []
    for case in cases:
        counted = client.messages.count_tokens(model="any", **case).input_tokens
        reported = client.messages.create(model="any", max_tokens=2, **case).usage.input_tokens
        pairs.append([counted, reported])
    print(json.dumps(pairs))


if __name__ == "__main__":
    main()
