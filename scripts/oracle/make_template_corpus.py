"""Renders every chat template of tests/data/chat_templates/ over a fixed set
of conversations with transformers' own renderer, for tests/chat_templates.rs:

    HF_HUB_OFFLINE=1 ~/.cache/mlx-bun/oracle-venv/bin/python \
        scripts/oracle/make_template_corpus.py > goldens/chat_templates.json

The messages go through the steps `apply_chat_template` takes (None-valued
keys dropped, `render_jinja_template`), with the bos/eos tokens of each
family's tokenizer_config (index.json) instead of a loaded tokenizer's.
`strftime_now` reads a fixed instant (index.json's `now`) so the goldens do
not change with the day. firefunction-v2's `functions` is given as llama.cpp
gives it: the tools as JSON indented by 2, "" without tools.

Where transformers raises, the error is recorded; when the conversation opens
with a system message, the conversation with the system text merged into the
first user turn (system + "\n\n" + user) is rendered too, as `merged`.
"""
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import transformers
from transformers.utils import chat_template_utils as ctu

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests/data/chat_templates"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather in a city, e.g. <Paris> & °C – “quoted”",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "description": "Forecast days"}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "filters": {"type": "object", "properties": {"site": {"type": "string"}}}},
            "required": ["query"]}}},
]

SYSTEM = {"role": "system", "content": "You are a terse assistant."}


def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


CALL_TURN = {"role": "assistant", "content": "", "tool_calls": [
    call("call12345", "get_weather", {"city": "Paris", "unit": "celsius", "days": 2})]}
RESULT_TURN = {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
               "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}

CONVERSATIONS = {
    "user": ([{"role": "user", "content": "Hello!"}], False),
    "system_user": ([SYSTEM, {"role": "user", "content": "What is 2+2?"}], False),
    "multi_turn": ([SYSTEM,
                    {"role": "user", "content": "Name a colour."},
                    {"role": "assistant", "content": "Blue."},
                    {"role": "user", "content": "  Another one, please.\n"}], False),
    "unicode": ([{"role": "user", "content": "Héllo 世界 <b>&amp;</b> \"quotes\" \\ back"}], False),
    "tools": ([SYSTEM, {"role": "user", "content": "Weather in Paris?"}], True),
    "tools_no_system": ([{"role": "user", "content": "Weather in Paris?"}], True),
    "tool_call": ([SYSTEM, {"role": "user", "content": "Weather in Paris?"}, CALL_TURN, RESULT_TURN], True),
    "tool_call_null_content": ([
        {"role": "user", "content": "Weather in Paris?"},
        {**CALL_TURN, "content": None}, RESULT_TURN], True),
    "tool_calls_parallel": ([
        {"role": "user", "content": "Weather in Paris and news about it?"},
        {"role": "assistant", "content": "", "tool_calls": [
            call("call12345", "get_weather", {"city": "Paris"}),
            call("call67890", "search", {"query": "Paris news", "filters": {"site": "example.org"}})]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "21 C"},
        {"role": "tool", "tool_call_id": "call67890", "name": "search", "content": "Nothing new."},
        {"role": "assistant", "content": "It is 21 C; nothing new."},
        {"role": "user", "content": "Thanks."}], True),
    "reasoning": ([
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."},
        {"role": "user", "content": "And 3+3?"}], False),
    "reasoning_last": ([
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."}], False),
}


def variants(src):
    out = [{}]
    if "enable_thinking" in src:
        out += [{"enable_thinking": True}, {"enable_thinking": False}]
    if "thinking is defined" in src:
        out += [{"thinking": True}]
    if "reasoning_effort" in src:
        out += [{"reasoning_effort": "high"}]
    return out


def merge_system(messages):
    rest = [dict(m) for m in messages[1:]]
    system = messages[0]["content"]
    if rest and rest[0]["role"] == "user":
        rest[0]["content"] = system + "\n\n" + rest[0]["content"]
        return rest
    return [{"role": "user", "content": system}] + rest


def render(src, messages, tools, gen, entry, kwargs):
    messages = ctu._normalize_chat_messages(json.loads(json.dumps(messages)))
    # A tokenizer without a bos token leaves `bos_token` undefined.
    extra = {k: entry[k] for k in ("bos_token", "eos_token") if entry[k] is not None}
    extra.update(entry["vars"])
    if "functions" in src:
        extra["functions"] = json.dumps(tools, indent=2, ensure_ascii=False) if tools else ""
    extra.update(kwargs)
    rendered, _ = ctu.render_jinja_template(
        conversations=[messages], tools=tools, chat_template=src, add_generation_prompt=gen, **extra)
    return rendered[0]


def attempt(*args):
    try:
        return {"rendered": render(*args)}
    except Exception as e:  # the template's own errors and jinja2's
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    index = json.loads((CORPUS / "index.json").read_text())
    now = datetime.fromisoformat(index["now"].replace("Z", "+00:00")).astimezone(timezone.utc)
    cases = []
    for entry in index["templates"]:
        src = (CORPUS / entry["file"]).read_text()
        env = ctu._compile_jinja_template(src).environment
        env.globals["strftime_now"] = lambda fmt: now.strftime(fmt)
        for conv, (messages, with_tools) in CONVERSATIONS.items():
            tools = TOOLS if with_tools else None
            for kwargs in variants(src):
                for gen in (True, False):
                    case = {"template": entry["name"], "conversation": conv, "kwargs": kwargs,
                            "add_generation_prompt": gen}
                    case.update(attempt(src, messages, tools, gen, entry, kwargs))
                    if "error" in case and messages[0]["role"] == "system":
                        merged = attempt(src, merge_system(messages), tools, gen, entry, kwargs)
                        case["merged"] = merged.get("rendered")
                        if "error" in merged:
                            case["merged_error"] = merged["error"]
                    cases.append(case)
    out = {
        "made_by": "scripts/oracle/make_template_corpus.py",
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "tools": TOOLS,
        "conversations": {k: {"messages": m, "tools": t} for k, (m, t) in CONVERSATIONS.items()},
        "cases": cases,
    }
    json.dump(out, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
