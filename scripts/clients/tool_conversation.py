"""A multi-turn tool-calling conversation against `mlx-bun serve`, driven by
the official `openai` or `anthropic` Python client: the user asks for the
weather, the model must call `get_weather` (the call is forced with a named
`tool_choice`, so it is grammar-enforced and deterministic even on tiny or
random models), the tool's result goes back, and the model answers.

    python tool_conversation.py BASE_URL {openai,anthropic} {stream,plain} [--no-thinking]

Prints one JSON line with what each turn returned; exits non-zero (with
the reason) when the server's answers do not have the client's shapes.
"""

import json
import sys

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
}
QUESTION = "What is the weather in Paris?"
RESULT = json.dumps({"temperature": 21, "unit": "celsius", "sky": "sunny"})


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")


def openai_turns(base, stream, extra):
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key="unused")
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city",
                "parameters": WEATHER,
            },
        }
    ]
    messages = [{"role": "user", "content": QUESTION}]

    def ask(**kw):
        args = dict(model="any", messages=messages, tools=tools, extra_body=extra, **kw)
        if not stream:
            r = client.chat.completions.create(**args)
            c = r.choices[0]
            calls = [
                {"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
                for t in (c.message.tool_calls or [])
            ]
            return c.message.content, calls, c.finish_reason
        content, calls, finish = "", {}, None
        for chunk in client.chat.completions.create(stream=True, **args):
            if not chunk.choices:
                continue
            c = chunk.choices[0]
            if c.delta.content:
                content += c.delta.content
            for t in c.delta.tool_calls or []:
                slot = calls.setdefault(t.index, {"id": None, "name": "", "arguments": ""})
                if t.id:
                    slot["id"] = t.id
                if t.function and t.function.name:
                    slot["name"] += t.function.name
                if t.function and t.function.arguments:
                    slot["arguments"] += t.function.arguments
            if c.finish_reason:
                finish = c.finish_reason
        return content, [calls[i] for i in sorted(calls)], finish

    _, calls, finish = ask(
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        max_tokens=80,
    )
    check(finish == "tool_calls", f"turn 1 finish_reason {finish!r}")
    check(len(calls) == 1, f"turn 1 has {len(calls)} calls")
    call = calls[0]
    check(call["id"] and call["name"] == "get_weather", f"turn 1 call {call}")
    args = json.loads(call["arguments"])
    check(isinstance(args.get("city"), str), f"turn 1 arguments {args}")
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": RESULT})
    content, calls2, finish2 = ask(tool_choice="none", max_tokens=12)
    check(finish2 in ("stop", "length"), f"turn 2 finish_reason {finish2!r}")
    check(isinstance(content, str) and content, f"turn 2 content {content!r}")
    check(not calls2, f"turn 2 calls {calls2}")
    return {"call": call, "arguments": args, "answer": content, "finish": finish2}


def anthropic_turns(base, stream, extra):
    import anthropic

    client = anthropic.Anthropic(base_url=base, api_key="unused")
    tools = [
        {
            "name": "get_weather",
            "description": "Current weather in a city",
            "input_schema": WEATHER,
        }
    ]
    messages = [{"role": "user", "content": QUESTION}]

    def ask(**kw):
        args = dict(model="any", messages=messages, tools=tools, extra_body=extra, **kw)
        if not stream:
            return client.messages.create(**args)
        with client.messages.stream(**args) as s:
            for _ in s:
                pass
            return s.get_final_message()

    m = ask(
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        max_tokens=80,
    )
    check(m.stop_reason == "tool_use", f"turn 1 stop_reason {m.stop_reason!r}")
    uses = [b for b in m.content if b.type == "tool_use"]
    check(len(uses) == 1, f"turn 1 content {m.content}")
    use = uses[0]
    check(use.id and use.name == "get_weather", f"turn 1 tool_use {use}")
    check(isinstance(use.input.get("city"), str), f"turn 1 input {use.input}")
    messages.append({"role": "assistant", "content": [b.model_dump() for b in m.content]})
    messages.append(
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": RESULT}],
        }
    )
    m2 = ask(tool_choice={"type": "none"}, max_tokens=12)
    check(m2.stop_reason in ("end_turn", "max_tokens"), f"turn 2 stop_reason {m2.stop_reason!r}")
    texts = [b.text for b in m2.content if b.type == "text"]
    check(texts and texts[0], f"turn 2 content {m2.content}")
    check(m2.usage.input_tokens > 0 and m2.usage.output_tokens > 0, f"usage {m2.usage}")
    return {"tool_use": {"id": use.id, "input": use.input}, "answer": texts[0], "stop": m2.stop_reason}


def main():
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    base, which, mode = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
    extra = {}
    if "--no-thinking" in sys.argv[4:]:
        extra["chat_template_kwargs"] = {"enable_thinking": False}
    turns = openai_turns if which == "openai" else anthropic_turns
    out = turns(base, mode == "stream", extra)
    print(json.dumps({"client": which, "mode": mode, **out}))


if __name__ == "__main__":
    main()
