"""Renders tests/data/qwen3_chat_template.jinja with a tool conversation through
transformers (the oracle environment), for the template parity test:
    python make_template_golden.py TOKENIZER_DIR TEMPLATE OUT.json
"""
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
src = open(sys.argv[2]).read()
messages = [
    {"role": "system", "content": "You are <b>helpful</b> & brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"},
]
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, e.g. <Paris> – °C",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]
out = {}
for thinking in (True, False):
    out[str(thinking).lower()] = tok.apply_chat_template(messages, tools=tools, chat_template=src, tokenize=False,
        add_generation_prompt=True, enable_thinking=thinking)
json.dump({"messages": messages, "tools": tools, "rendered": out}, open(sys.argv[3], "w"), indent=1, ensure_ascii=False)
