"""A tool-calling conversation over OpenAI's Responses API against
`mlx-bun serve`, driven by the official `openai` Python client: the user
asks for the weather, the model must call `get_weather` (forced with a named
`tool_choice`, so the call is grammar-enforced and deterministic even on
tiny models), then the call's output goes back twice, once with the whole
conversation as input and once with `previous_response_id`, and the model
answers in text.

    python responses_conversation.py BASE_URL {stream,plain}

Prints one JSON line with what each turn returned; exits non-zero (with
the reason) when the server's answers do not have the client's shapes.
"""

import json
import sys

import openai

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": WEATHER,
        "strict": False,
    }
]
INSTRUCTIONS = "You are a weather assistant."
QUESTION = "What is the weather in Paris?"
RESULT = json.dumps({"temperature": 21, "unit": "celsius", "sky": "sunny"})


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")


def streamed(client, args):
    """The final response of a streamed request, checked against its events."""
    kinds, text, arguments, final = [], "", "", None
    for n, event in enumerate(client.responses.create(stream=True, **args)):
        check(event.sequence_number == n, f"event {n} has sequence_number {event.sequence_number}")
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.function_call_arguments.delta":
            arguments += event.delta
        elif event.type in ("response.completed", "response.incomplete"):
            final = event.response
    check(kinds[:2] == ["response.created", "response.in_progress"], f"stream opens with {kinds[:2]}")
    check(final is not None and kinds[-1] == final_kind(final), f"stream ends with {kinds[-1:]}")
    check(text == final_text(final), f"streamed text {text!r} is not the final {final_text(final)!r}")
    calls = [o.arguments for o in final.output if o.type == "function_call"]
    check(arguments == "".join(calls), f"streamed arguments {arguments!r}, final {calls}")
    for kind in ("output_item.added", "output_item.done"):
        count = kinds.count("response." + kind)
        check(count == len(final.output), f"{count} {kind} events for {len(final.output)} items")
    return final


def final_kind(response):
    return "response.completed" if response.status == "completed" else "response.incomplete"


def final_text(response):
    return "".join(
        part.text
        for item in response.output
        if item.type == "message"
        for part in item.content
        if part.type == "output_text"
    )


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    base, stream = sys.argv[1].rstrip("/"), sys.argv[2] == "stream"
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused")

    def ask(**kw):
        args = dict(model="any", instructions=INSTRUCTIONS, tools=TOOLS, **kw)
        return streamed(client, args) if stream else client.responses.create(**args)

    # Turn 1: a forced call. The stream helper must assemble it too.
    first_args = dict(
        input=QUESTION,
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_output_tokens=80,
    )
    r1 = ask(**first_args)
    if stream:
        with client.responses.stream(
            model="any", instructions=INSTRUCTIONS, tools=TOOLS, **first_args
        ) as s:
            for _ in s:
                pass
            helper = s.get_final_response()
        check(
            [o.type for o in helper.output] == ["function_call"],
            f"the stream helper's output {helper.output}",
        )
    check(r1.id.startswith("resp_") and r1.object == "response", f"turn 1 id {r1.id!r}")
    check(r1.status == "completed", f"turn 1 status {r1.status!r}")
    calls = [o for o in r1.output if o.type == "function_call"]
    check(len(calls) == 1, f"turn 1 output {r1.output}")
    call = calls[0]
    check(call.call_id and call.id and call.name == "get_weather", f"turn 1 call {call}")
    check(call.status == "completed", f"turn 1 call status {call.status!r}")
    args = json.loads(call.arguments)
    check(isinstance(args.get("city"), str), f"turn 1 arguments {args}")
    u = r1.usage
    check(u.input_tokens > 0 and u.output_tokens > 0, f"turn 1 usage {u}")
    check(u.total_tokens == u.input_tokens + u.output_tokens, f"turn 1 usage {u}")
    check(r1.tool_choice.name == "get_weather" and r1.tools[0].name == "get_weather", "echoed tools")
    check(r1.instructions == INSTRUCTIONS, f"echoed instructions {r1.instructions!r}")
    check(client.responses.retrieve(r1.id).id == r1.id, "the stored turn 1")
    counted = client.responses.input_tokens.count(
        model="any",
        instructions=INSTRUCTIONS,
        tools=TOOLS,
        input=QUESTION,
        tool_choice=first_args["tool_choice"],
    )
    check(counted.input_tokens == u.input_tokens, f"counted {counted}, used {u.input_tokens}")

    # Turn 2, the whole conversation as input.
    output = {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}
    full = [
        {"role": "user", "content": QUESTION},
        call.model_dump(exclude_none=True),
        output,
    ]
    r2 = ask(input=full, tool_choice="none", max_output_tokens=12)
    # Turn 2 again, continuing turn 1 by its id.
    r3 = ask(input=[output], previous_response_id=r1.id, tool_choice="none", max_output_tokens=12)
    answers = []
    for name, r in (("full input", r2), ("previous_response_id", r3)):
        check(r.status in ("completed", "incomplete"), f"{name}: status {r.status!r}")
        if r.status == "incomplete":
            check(r.incomplete_details.reason == "max_output_tokens", f"{name}: {r.incomplete_details}")
        check([o.type for o in r.output] == ["message"], f"{name}: output {r.output}")
        check(r.output_text, f"{name}: output_text {r.output_text!r}")
        answers.append(r.output_text)
    check(r3.previous_response_id == r1.id, f"echoed previous_response_id {r3.previous_response_id!r}")
    check(answers[0] == answers[1], f"the two follow-ups differ: {answers}")
    check(r3.usage.input_tokens == r2.usage.input_tokens, "the two follow-ups' prompts differ")
    print(
        json.dumps(
            {
                "mode": sys.argv[2],
                "call": {"call_id": call.call_id, "name": call.name, "arguments": call.arguments},
                "arguments": args,
                "answer": answers[0],
                "status": r2.status,
            }
        )
    )


if __name__ == "__main__":
    main()
