//! Every tool-call format on published model outputs, read the way
//! mlx-lm 0.32.2 reads them; markers inside string arguments; several calls
//! and content before them; and a forced call streamed over HTTP whose
//! arguments arrive in pieces that join to the non-streamed answer's.
//!
//! The cases in `MLX_LM_CASES` are the test data of mlx-lm's
//! `tests/test_tool_parsing.py` (github.com/ml-explore/mlx-lm at commit
//! d78bf58e217c904ec282ed8da9b947491f78c022, with the Kimi K3 cases of
//! 7d505c285b801108a52c23353c7fb6af07204717 and the MiniCPM5 cases of
//! 93e15d21aba761a144f7a2ad3ac6e0a77e78c4b1), each wrapped in its format's
//! markers as the model writes it; the expected calls are what the parsers
//! of the mlx-lm 0.32.2 release return for the text between the markers
//! (`null`: they raise).

mod common;

use common::server::Server;

use mlx_bun::tool_calls::{call_grammar, Function, ToolChoice, ToolFormat};
use serde_json::{json, Value};

const MLX_LM_CASES: &str = r##"[
{"format": "function_gemma", "text": "<start_function_call>call:multiply{a:12234585,b:48838483920}<end_function_call>", "tools": [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}], "calls": [{"name": "multiply", "arguments": {"a": 12234585, "b": 48838483920}}]},
{"format": "gemma4", "text": "<|tool_call>call:multiply{a:12234585,b:48838483920}<tool_call|>", "tools": [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}], "calls": [{"name": "multiply", "arguments": {"a": 12234585, "b": 48838483920}}]},
{"format": "glm47", "text": "<tool_call>{\"name\": \"multiply\", \"arguments\": {\"a\": 12234585, \"b\": 48838483920}}</tool_call>", "tools": [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}], "calls": [{"name": "multiply", "arguments": {"a": 12234585, "b": 48838483920}}]},
{"format": "glm47", "text": "<tool_call>multiply a=12234585 b=48838483920</tool_call>", "tools": [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}], "calls": [{"name": "multiply", "arguments": {"a": 12234585, "b": 48838483920}}]},
{"format": "glm47", "text": "<tool_call>multiply<arg_key>a</arg_key><arg_value>12234585</arg_value><arg_key>b</arg_key><arg_value>48838483920</arg_value></tool_call>", "tools": [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}], "calls": [{"name": "multiply", "arguments": {"a": 12234585, "b": 48838483920}}]},
{"format": "laguna", "text": "<tool_call>multiply<arg_key>a</arg_key><arg_value>12234585</arg_value><arg_key>b</arg_key><arg_value>48838483920</arg_value></tool_call>", "tools": [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}], "calls": [{"name": "multiply", "arguments": {"a": 12234585, "b": 48838483920}}]},
{"format": "json_tools", "text": "<tool_call>{\"name\": \"multiply\", \"arguments\": {\"a\": 12234585, \"b\": 48838483920}}</tool_call>", "tools": [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}], "calls": [{"name": "multiply", "arguments": {"a": 12234585, "b": 48838483920}}]},
{"format": "minimax_m2", "text": "<minimax:tool_call><invoke name=\"multiply\">\n<parameter name=\"a\">12234585</parameter>\n<parameter name=\"b\">48838483920</parameter>\n</invoke></minimax:tool_call>", "tools": [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}], "calls": [{"name": "multiply", "arguments": {"a": 12234585, "b": 48838483920}}]},
{"format": "qwen3_coder", "text": "<tool_call>\n<function=multiply>\n<parameter=a>\n12234585\n</parameter>\n<parameter=b>\n48838483920\n</parameter>\n</function>\n</tool_call>", "tools": [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}], "calls": [{"name": "multiply", "arguments": {"a": 12234585, "b": 48838483920}}]},
{"format": "longcat", "text": "<longcat_tool_call>multiply<longcat_arg_key>a</longcat_arg_key>\n<longcat_arg_value>12234585</longcat_arg_value>\n<longcat_arg_key>b</longcat_arg_key>\n<longcat_arg_value>48838483920</longcat_arg_value></longcat_tool_call>", "tools": [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}], "calls": [{"name": "multiply", "arguments": {"a": 12234585, "b": 48838483920}}]},
{"format": "longcat", "text": "<longcat_tool_call>{\"name\": \"multiply\", \"arguments\": {\"a\": 12234585, \"b\": 48838483920}}</longcat_tool_call>", "tools": [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}], "calls": [{"name": "multiply", "arguments": {"a": 12234585, "b": 48838483920}}]},
{"format": "pythonic", "text": "<|tool_call_start|>[multiply(a=12234585, b=48838483920)]<|tool_call_end|>", "tools": [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}], "calls": [{"name": "multiply", "arguments": {"a": 12234585, "b": 48838483920}}]},
{"format": "mistral", "text": "[TOOL_CALLS]multiply[ARGS]{\"a\": 12234585, \"b\": 48838483920}", "tools": [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}], "calls": [{"name": "multiply", "arguments": {"a": 12234585, "b": 48838483920}}]},
{"format": "minicpm5", "text": "<function name=\"multiply\"><param name=\"a\">12234585</param><param name=\"b\">48838483920</param></function>", "tools": [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}], "calls": [{"name": "multiply", "arguments": {"a": 12234585, "b": 48838483920}}]},
{"format": "function_gemma", "text": "<start_function_call>call:get_current_temperature{location:<escape>London<escape>}<end_function_call>", "tools": [{"type": "function", "function": {"name": "get_current_temperature", "parameters": {"type": "object", "properties": {"location": {"type": "str"}}, "required": ["location"]}}}], "calls": [{"name": "get_current_temperature", "arguments": {"location": "London"}}]},
{"format": "gemma4", "text": "<|tool_call>call:get_current_temperature{location:<|\"|>London<|\"|>}<tool_call|>", "tools": [{"type": "function", "function": {"name": "get_current_temperature", "parameters": {"type": "object", "properties": {"location": {"type": "str"}}, "required": ["location"]}}}], "calls": [{"name": "get_current_temperature", "arguments": {"location": "London"}}]},
{"format": "glm47", "text": "<tool_call>get_current_temperature<arg_key>location</arg_key><arg_value>\"London\"</arg_value></tool_call>", "tools": [{"type": "function", "function": {"name": "get_current_temperature", "parameters": {"type": "object", "properties": {"location": {"type": "str"}}, "required": ["location"]}}}], "calls": [{"name": "get_current_temperature", "arguments": {"location": "London"}}]},
{"format": "json_tools", "text": "<tool_call>{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"London\"}}</tool_call>", "tools": [{"type": "function", "function": {"name": "get_current_temperature", "parameters": {"type": "object", "properties": {"location": {"type": "str"}}, "required": ["location"]}}}], "calls": [{"name": "get_current_temperature", "arguments": {"location": "London"}}]},
{"format": "minimax_m2", "text": "<minimax:tool_call><invoke name=\"get_current_temperature\">\n<parameter name=\"location\">London</parameter>\n</invoke></minimax:tool_call>", "tools": [{"type": "function", "function": {"name": "get_current_temperature", "parameters": {"type": "object", "properties": {"location": {"type": "str"}}, "required": ["location"]}}}], "calls": [{"name": "get_current_temperature", "arguments": {"location": "London"}}]},
{"format": "qwen3_coder", "text": "<tool_call>\n<function=get_current_temperature>\n<parameter=location>\nLondon\n</parameter>\n</function>\n</tool_call>", "tools": [{"type": "function", "function": {"name": "get_current_temperature", "parameters": {"type": "object", "properties": {"location": {"type": "str"}}, "required": ["location"]}}}], "calls": [{"name": "get_current_temperature", "arguments": {"location": "London"}}]},
{"format": "longcat", "text": "<longcat_tool_call>get_current_temperature<longcat_arg_key>location</longcat_arg_key>\n<longcat_arg_value>London</longcat_arg_value></longcat_tool_call>", "tools": [{"type": "function", "function": {"name": "get_current_temperature", "parameters": {"type": "object", "properties": {"location": {"type": "str"}}, "required": ["location"]}}}], "calls": [{"name": "get_current_temperature", "arguments": {"location": "London"}}]},
{"format": "pythonic", "text": "<|tool_call_start|>[get_current_temperature(location=\"London\")]<|tool_call_end|>", "tools": [{"type": "function", "function": {"name": "get_current_temperature", "parameters": {"type": "object", "properties": {"location": {"type": "str"}}, "required": ["location"]}}}], "calls": [{"name": "get_current_temperature", "arguments": {"location": "London"}}]},
{"format": "mistral", "text": "[TOOL_CALLS]get_current_temperature[ARGS]{\"location\": \"London\"}", "tools": [{"type": "function", "function": {"name": "get_current_temperature", "parameters": {"type": "object", "properties": {"location": {"type": "str"}}, "required": ["location"]}}}], "calls": [{"name": "get_current_temperature", "arguments": {"location": "London"}}]},
{"format": "qwen3_coder", "text": "<tool_call>\n<function=search><parameter=filters>{'category': 'books', 'in_stock': True}</parameter><parameter=tags>['fiction', 'new']</parameter></function>\n</tool_call>", "tools": [{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {"filters": {"type": "object"}, "tags": {"type": "array"}}}}}], "calls": [{"name": "search", "arguments": {"filters": {"category": "books", "in_stock": true}, "tags": ["fiction", "new"]}}]},
{"format": "qwen3_coder", "text": "<tool_call>\n<function=search><parameter=filters>{\"category\": \"books\"}</parameter><parameter=tags>[\"fiction\", \"new\"]</parameter></function>\n</tool_call>", "tools": [{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {"filters": {"type": "object"}, "tags": {"type": "array"}}}}}], "calls": [{"name": "search", "arguments": {"filters": {"category": "books"}, "tags": ["fiction", "new"]}}]},
{"format": "gemma4", "text": "<|tool_call>call:configure{settings:{enabled:true,name:<|\"|>test<|\"|>}}<tool_call|>", "tools": null, "calls": [{"name": "configure", "arguments": {"settings": {"enabled": true, "name": "test"}}}]},
{"format": "gemma4", "text": "<|tool_call>call:tag{items:[<|\"|>foo<|\"|>,<|\"|>bar<|\"|>]}<tool_call|>", "tools": null, "calls": [{"name": "tag", "arguments": {"items": ["foo", "bar"]}}]},
{"format": "gemma4", "text": "<|tool_call>call:search{query:<|\"|>hello world<|\"|>,limit:10,verbose:false}<tool_call|>", "tools": null, "calls": [{"name": "search", "arguments": {"query": "hello world", "limit": 10, "verbose": false}}]},
{"format": "gemma4", "text": "<|tool_call>call:glob{pattern:<|\"|>README*.md<|\"|>}call:glob{pattern:<|\"|>CONTRIBUTING.md<|\"|>}<tool_call|>", "tools": null, "calls": [{"name": "glob", "arguments": {"pattern": "README*.md"}}, {"name": "glob", "arguments": {"pattern": "CONTRIBUTING.md"}}]},
{"format": "gemma4", "text": "<|tool_call>call:search{query:<|\"|>weather<|\"|>,limit:5}call:configure{settings:{enabled:true,name:<|\"|>test<|\"|>}}<tool_call|>", "tools": null, "calls": [{"name": "search", "arguments": {"query": "weather", "limit": 5}}, {"name": "configure", "arguments": {"settings": {"enabled": true, "name": "test"}}}]},
{"format": "gemma4", "text": "<|tool_call>call:manim-video{mode:<|\"|>plan<|\"|>,prompt:<|\"|>explain KV caching<|\"|>}<tool_call|>", "tools": null, "calls": [{"name": "manim-video", "arguments": {"mode": "plan", "prompt": "explain KV caching"}}]},
{"format": "gemma4", "text": "<|tool_call>call:skill_manage{action:<|\"|>create<|\"|>,content:<|\"|>use a dict like {key: value} in your code<|\"|>}<tool_call|>", "tools": null, "calls": [{"name": "skill_manage", "arguments": {"action": "create", "content": "use a dict like {key: value} in your code"}}]},
{"format": "kimi_k2", "text": "<|tool_calls_section_begin|><|tool_call_begin|>functions.multiply:0<|tool_call_argument_begin|>{\"a\": 12234585, \"b\": 48838483920}<|tool_call_end|><|tool_calls_section_end|>", "tools": null, "calls": [{"id": "functions.multiply:0", "name": "multiply", "arguments": {"a": 12234585, "b": 48838483920}}]},
{"format": "kimi_k2", "text": "<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>{\"query\": \"weather\"}<|tool_call_end|><|tool_call_begin|>functions.read_file:1<|tool_call_argument_begin|>{\"path\": \"/tmp/test.txt\"}<|tool_call_end|><|tool_calls_section_end|>", "tools": null, "calls": [{"id": "functions.search:0", "name": "search", "arguments": {"query": "weather"}}, {"id": "functions.read_file:1", "name": "read_file", "arguments": {"path": "/tmp/test.txt"}}]},
{"format": "minimax_m2", "text": "<minimax:tool_call><invoke name=\"search\">\n<parameter name=\"query\">weather</parameter>\n</invoke>\n<invoke name=\"read_file\">\n<parameter name=\"path\">/tmp/test.txt</parameter>\n</invoke></minimax:tool_call>", "tools": null, "calls": [{"name": "search", "arguments": {"query": "weather"}}, {"name": "read_file", "arguments": {"path": "/tmp/test.txt"}}]},
{"format": "qwen3_coder", "text": "<tool_call>\n<function=schedule>\n<parameter=name>\ndeploy\n</parameter>\n<parameter=deadline>\n2025-06-15T10:30:00Z\n</parameter>\n</function>\n</tool_call>", "tools": [{"type": "function", "function": {"name": "schedule", "parameters": {"type": "object", "properties": {"name": {"type": "string"}, "deadline": {"type": "string"}}, "required": ["name", "deadline"]}}}], "calls": [{"name": "schedule", "arguments": {"name": "deploy", "deadline": "2025-06-15T10:30:00Z"}}]},
{"format": "qwen3_coder", "text": "<tool_call>\n<function=log>\n<parameter=msg>\nversion 3.10.5-beta\n</parameter>\n</function>\n</tool_call>", "tools": [{"type": "function", "function": {"name": "log", "parameters": {"type": "object", "properties": {"msg": {"type": "string"}}, "required": ["msg"]}}}], "calls": [{"name": "log", "arguments": {"msg": "version 3.10.5-beta"}}]},
{"format": "kimi_k3", "text": "<|open|>tools<|sep|><|open|>call tool=\"multiply\" index=\"1\"<|sep|><|open|>argument key=\"a\" type=\"number\"<|sep|>12234585<|close|>argument<|sep|><|open|>argument key=\"b\" type=\"number\"<|sep|>48838483920<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>", "tools": null, "calls": [{"name": "multiply", "arguments": {"a": 12234585, "b": 48838483920}}]},
{"format": "kimi_k3", "text": "<|open|>tools<|sep|><|open|>call tool=\"search\" index=\"1\"<|sep|><|open|>argument key=\"query\" type=\"string\"<|sep|>{\"not\": \"json\"}<|close|>argument<|sep|><|open|>argument key=\"limit\" type=\"number\"<|sep|>5<|close|>argument<|sep|><|open|>argument key=\"safe\" type=\"boolean\"<|sep|>true<|close|>argument<|sep|><|open|>argument key=\"filters\" type=\"array\"<|sep|>[\"a\", \"b\"]<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>", "tools": null, "calls": [{"name": "search", "arguments": {"query": "{\"not\": \"json\"}", "limit": 5, "safe": true, "filters": ["a", "b"]}}]},
{"format": "kimi_k3", "text": "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>json type=\"object\"<|sep|>{\"city\": \"Tokyo\"}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>", "tools": null, "calls": [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]},
{"format": "kimi_k3", "text": "<|open|>tools<|sep|><|open|>call tool=\"say\" index=\"1\"<|sep|><|open|>argument key=\"text\" type=\"string\"<|sep|>hi<|close|>argument<|sep|><|close|>call<|sep|><|open|>call tool=\"echo&amp;log\" index=\"2\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>", "tools": null, "calls": [{"name": "say", "arguments": {"text": "hi"}}, {"name": "echo&log", "arguments": {}}]},
{"format": "kimi_k3", "text": "<|open|>tools<|sep|><|open|>call index=\"1\"<|sep|><|close|>call<|sep|><|open|>call tool=\"say\" index=\"2\"<|sep|><|open|>argument key=\"text\" type=\"string\"<|sep|>hi<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>", "tools": null, "calls": [{"name": "say", "arguments": {"text": "hi"}}]},
{"format": "kimi_k3", "text": "<|open|>tools<|sep|><|open|>call tool=\"say\" index=\"1\"<|sep|><|open|>argument key=\"text\" type=\"string\"<|sep|>hi<|close|>argument<|sep|><|close|>call<|sep|><|open|>call tool=\"broken\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>{not json<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>", "tools": null, "calls": [{"name": "say", "arguments": {"text": "hi"}}]},
{"format": "kimi_k3", "text": "<|open|>tools<|sep|><|open|>call tool=\"say\" index=\"1\"<|sep|><|open|>argument key=\"text\" type=\"string\"<|sep|>hi<|close|>argument<|sep|><|close|>call<|sep|><|open|>call tool=\"cut\" index=\"2\"<|sep|><|open|>argument key=\"x\" type=\"num<|close|>tools<|sep|>", "tools": null, "calls": [{"name": "say", "arguments": {"text": "hi"}}]},
{"format": "kimi_k3", "text": "<|open|>tools<|sep|><|open|>call index=\"1\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>", "tools": null, "calls": null},
{"format": "pythonic", "text": "<|tool_call_start|>[write(filePath='/tmp/hello.py', content='# Hello, world!')]<|tool_call_end|>", "tools": null, "calls": [{"name": "write", "arguments": {"filePath": "/tmp/hello.py", "content": "# Hello, world!"}}]},
{"format": "pythonic", "text": "<|tool_call_start|>[search(query=\"hello, world\")]<|tool_call_end|>", "tools": null, "calls": [{"name": "search", "arguments": {"query": "hello, world"}}]},
{"format": "minicpm5", "text": "<function name=\"get_weather\"><param name=\"city\"><![CDATA[Bei\njing]]></param><param name=\"date\">2024-06-27</param></function>", "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "date": {"type": "string"}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "sum_values", "parameters": {"type": "object", "properties": {"nums": {"type": "array"}, "exact": {"type": "boolean"}}, "required": ["nums"]}}}], "calls": [{"name": "get_weather", "arguments": {"city": "Bei\njing", "date": "2024-06-27"}}]},
{"format": "minicpm5", "text": "<function name=\"sum_values\"><param name=\"nums\">[1, 2, 3]</param><param name=\"exact\">true</param></function>", "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "date": {"type": "string"}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "sum_values", "parameters": {"type": "object", "properties": {"nums": {"type": "array"}, "exact": {"type": "boolean"}}, "required": ["nums"]}}}], "calls": [{"name": "sum_values", "arguments": {"nums": [1, 2, 3], "exact": true}}]},
{"format": "minicpm5", "text": "<function name='get_weather'><param name='city'>Osaka</param></function>", "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "date": {"type": "string"}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "sum_values", "parameters": {"type": "object", "properties": {"nums": {"type": "array"}, "exact": {"type": "boolean"}}, "required": ["nums"]}}}], "calls": [{"name": "get_weather", "arguments": {"city": "Osaka"}}]},
{"format": "minicpm5", "text": "<function name=\"search\"><param name=\"query\">weather</param></function><function name=\"read_file\"><param name=\"path\">/tmp/test.txt</param></function>", "tools": null, "calls": [{"name": "search", "arguments": {"query": "weather"}}, {"name": "read_file", "arguments": {"path": "/tmp/test.txt"}}]},
{"format": "minicpm5", "text": "<function name=\"write\"><param name=\"content\"><![CDATA[hello & world <foo>]]></param></function>", "tools": [{"type": "function", "function": {"name": "write", "parameters": {"type": "object", "properties": {"content": {"type": "string"}}}}}], "calls": [{"name": "write", "arguments": {"content": "hello & world <foo>"}}]},
{"format": "minicpm5", "text": "<function name=\"ping\"></function>", "tools": null, "calls": [{"name": "ping", "arguments": {}}]}
]"##;

fn functions(tools: &Value) -> Vec<Function> {
    tools
        .as_array()
        .map(|ts| {
            ts.iter()
                .map(|t| Function {
                    name: t["function"]["name"].as_str().unwrap().to_string(),
                    parameters: t["function"]["parameters"].clone(),
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_format_on_mlx_lm_cases() {
    let cases: Vec<Value> = serde_json::from_str(MLX_LM_CASES).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for case in &cases {
        let name = case["format"].as_str().unwrap();
        let format = ToolFormat::from_name(name).unwrap();
        seen.insert(name);
        let text = case["text"].as_str().unwrap();
        let functions = functions(&case["tools"]);
        let got = format.parse_with(text, &functions);
        let Some(expected) = case["calls"].as_array() else {
            assert!(got.is_err(), "{name}: {text:?} parsed as {got:?}");
            continue;
        };
        let got = got.unwrap_or_else(|e| panic!("{name}: {text:?}: {e:#}"));
        assert_eq!(got.len(), expected.len(), "{name}: {text:?}: {got:?}");
        for (call, want) in got.iter().zip(expected) {
            assert_eq!(call.name, want["name"], "{name}: {text:?}");
            assert_eq!(call.arguments, want["arguments"], "{name}: {text:?}");
            assert_eq!(call.id.as_deref(), want["id"].as_str(), "{name}: {text:?}");
        }
        // Text before the start marker is content.
        let (content, calls) = format.split_with(&format!("Sure.\n{text}"), &functions);
        assert_eq!(content, "Sure.\n", "{name}: {text:?}");
        assert_eq!(calls, got, "{name}: {text:?}");
    }
    // Muse Spark has no published case; it is read in the tests below.
    assert_eq!(seen.len(), 13, "{seen:?}");
}

#[test]
fn inference_follows_mlx_lm_order() {
    for (template, want) in [
        (
            "<minimax:tool_call><tool_call>{{ tool_call.name }}",
            "minimax_m2",
        ),
        ("<|tool_call>call:{{ name }}<tool_call|>", "gemma4"),
        ("<start_function_call>call:", "function_gemma"),
        ("<longcat_tool_call>{{ name }}<longcat_arg_key>", "longcat"),
        (
            "<tool_call>{{ tool_call.name }}<arg_key>{{ k }}</arg_key>",
            "glm47",
        ),
        (
            "<|tool_list_start|>{{ tools }}<|tool_list_end|>",
            "pythonic",
        ),
        (
            "{{- '<tool_call>\\n<function=' + tool_call.name }}",
            "qwen3_coder",
        ),
        (
            "<tool_call>\n<function={{ tool_call.name }}>",
            "qwen3_coder",
        ),
        ("<|tool_calls_section_begin|>", "kimi_k2"),
        (
            "<function name=\"' ~ tool_call.name ~ '\"><param name=\"",
            "minicpm5",
        ),
        ("[TOOL_CALLS]", "mistral"),
        ("<atem:function_calls>", "muse_spark"),
        (
            "<tool_call>\n{\"name\": \"{{ tool_call.name }}\"}",
            "json_tools",
        ),
        ("<|tool_call|>{{ tool_calls }}<|/tool_call|>", "phi"),
        ("<|channel|>commentary to=functions.{{ name }}", "harmony"),
        ("{{- '<|python_tag|>' + tool_call.name }}", "llama3"),
    ] {
        let got = ToolFormat::infer(template).map(ToolFormat::name);
        assert_eq!(got, Some(want), "{template}");
    }
    assert_eq!(ToolFormat::infer("{{ messages }}"), None);
    fn vocab(tokens: &'static [&'static str]) -> impl Fn(&str) -> bool {
        move |t: &str| tokens.contains(&t)
    }
    let xtml = vocab(&["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"]);
    assert_eq!(
        ToolFormat::infer_from_vocab(&xtml),
        Some(ToolFormat::KimiK3)
    );
    let lfm = vocab(&["<|tool_call_start|>", "<|tool_call_end|>"]);
    assert_eq!(
        ToolFormat::infer_from_vocab(&lfm),
        Some(ToolFormat::Pythonic)
    );
    assert_eq!(ToolFormat::infer_from_vocab(&vocab(&[])), None);
    for name in [
        "json_tools",
        "llama3",
        "mistral",
        "function_gemma",
        "phi",
        "harmony",
        "gemma4",
        "glm47",
        "laguna",
        "kimi_k3",
        "longcat",
        "minicpm5",
        "minimax_m2",
        "muse_spark",
        "pythonic",
    ] {
        assert_eq!(ToolFormat::from_name(name).unwrap().name(), name);
    }
}

#[test]
fn end_markers_inside_string_arguments() {
    // Hermes: python code that prints the end marker.
    let code = "print(\"</tool_call>\")\nx = {'a': \"<tool_call>\"}";
    let out = format!(
        "Running it.\n<tool_call>\n{}\n</tool_call>",
        json!({"name": "python", "arguments": {"code": code}})
    );
    let (content, calls) = ToolFormat::JsonTools.split(&out);
    assert_eq!(content, "Running it.\n");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].arguments["code"], code);
    // Phi's list and harmony's message hold the same.
    let phi = format!(
        "<|tool_call|>[{}]<|/tool_call|>",
        json!({"name": "python", "arguments": {"code": "'<|/tool_call|>'"}})
    );
    let calls = ToolFormat::Phi.parse(&phi).unwrap();
    assert_eq!(calls[0].arguments["code"], "'<|/tool_call|>'");
    let harmony = "<|channel|>commentary to=functions.python <|constrain|>json<|message|>{\"code\": \"s = '<|call|>'\"}<|call|>";
    let calls = ToolFormat::Harmony.parse(harmony).unwrap();
    assert_eq!(calls[0].arguments["code"], "s = '<|call|>'");
}

#[test]
fn several_calls_and_content_before_them() {
    let functions = [Function {
        name: "a".into(),
        parameters: json!({"type": "object", "properties": {"x": {"type": "integer"}}}),
    }];
    for (format, calls) in [
        (ToolFormat::JsonTools, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>"),
        (ToolFormat::Mistral, "[TOOL_CALLS]a[ARGS]{\"x\": 1}[TOOL_CALLS]b[ARGS]{}"),
        (ToolFormat::Phi, "<|tool_call|>[{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]<|/tool_call|>"),
        (ToolFormat::Harmony, "<|channel|>commentary to=functions.a <|constrain|>json<|message|>{\"x\": 1}<|call|><|start|>assistant<|channel|>commentary to=functions.b <|constrain|>json<|message|>{}<|call|>"),
        (ToolFormat::Gemma4, "<|tool_call>call:a{x:1}<tool_call|><|tool_call>call:b{}<tool_call|>"),
        (ToolFormat::Glm47, "<tool_call>a\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n</tool_call><tool_call>b</tool_call>"),
        (ToolFormat::Qwen3Coder, "<tool_call>\n<function=a>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=b>\n</function>\n</tool_call>"),
        (ToolFormat::MinimaxM2, "<minimax:tool_call>\n<invoke name=\"a\">\n<parameter name=\"x\">1</parameter>\n</invoke>\n<invoke name=\"b\">\n</invoke>\n</minimax:tool_call>"),
        (ToolFormat::KimiK2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>{\"x\": 1}<|tool_call_end|><|tool_call_begin|>functions.b:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"),
        (ToolFormat::KimiK3, "<|open|>tools<|sep|><|open|>call tool=\"a\"<|sep|><|open|>argument key=\"x\" type=\"number\"<|sep|>1<|close|>argument<|sep|><|close|>call<|sep|><|open|>call tool=\"b\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"),
        (ToolFormat::Pythonic, "<|tool_call_start|>[a(x=1), b()]<|tool_call_end|>"),
        (ToolFormat::MuseSpark, "<atem:function_calls><atem:invoke name=\"a\"><atem:parameter name=\"x\">1</atem:parameter></atem:invoke><atem:invoke name=\"b\"></atem:invoke></atem:function_calls>"),
        (ToolFormat::Longcat, "<longcat_tool_call>a<longcat_arg_key>x</longcat_arg_key><longcat_arg_value>1</longcat_arg_value></longcat_tool_call><longcat_tool_call>{\"name\": \"b\", \"arguments\": {}}</longcat_tool_call>"),
        (ToolFormat::MiniCpm5, "<function name=\"a\"><param name=\"x\">1</param></function>\n<function name=\"b\"></function>"),
    ] {
        let out = format!("Let me check both.\n{calls}");
        let (content, calls) = format.split_with(&out, &functions);
        assert_eq!(content, "Let me check both.\n", "{format:?}");
        let names: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b"], "{format:?}");
        assert_eq!(calls[0].arguments, json!({"x": 1}), "{format:?}");
        assert_eq!(calls[1].arguments, json!({}), "{format:?}");
    }
}

#[test]
fn forcing_a_call_in_a_format_without_a_grammar_is_a_clear_error() {
    let functions = [Function {
        name: "f".into(),
        parameters: json!({}),
    }];
    for name in [
        "gemma4",
        "glm47",
        "laguna",
        "kimi_k3",
        "longcat",
        "minicpm5",
        "minimax_m2",
        "muse_spark",
        "pythonic",
    ] {
        let format = ToolFormat::from_name(name).unwrap();
        let err = call_grammar(
            format,
            &functions,
            &ToolChoice::Required,
            true,
            None,
            &|_| None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("not supported") && err.contains(name), "{err}");
    }
}

/// The `tool_calls` deltas of an SSE chat stream, in order.
fn call_deltas(sse: &str) -> Vec<Value> {
    sse.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().cloned())
        .flatten()
        .collect()
}

#[test]
fn forced_call_arguments_stream_in_pieces() {
    let server = Server::start(&common::model_dir(), &[]);
    let client = reqwest::blocking::Client::new();
    let body = json!({
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        }}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 60,
        "temperature": 0,
    });
    let url = format!("{}/v1/chat/completions", server.base);
    let whole: Value = client
        .post(&url)
        .json(&body)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let call = &whole["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather", "{whole}");
    let arguments = call["function"]["arguments"].as_str().unwrap();

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let sse = client
        .post(&url)
        .json(&streamed)
        .send()
        .unwrap()
        .text()
        .unwrap();
    let deltas = call_deltas(&sse);
    let head = &deltas[0];
    assert_eq!(head["index"], 0, "{sse}");
    assert_eq!(head["type"], "function", "{sse}");
    assert!(head["id"].as_str().unwrap().starts_with("call_"), "{sse}");
    assert_eq!(head["function"]["name"], "get_weather", "{sse}");
    assert_eq!(head["function"]["arguments"], "", "{sse}");
    let pieces: Vec<&str> = deltas[1..]
        .iter()
        .map(|d| {
            assert_eq!(d["index"], 0, "{sse}");
            assert!(d.get("id").is_none(), "{sse}");
            d["function"]["arguments"].as_str().unwrap()
        })
        .collect();
    assert!(pieces.len() > 1, "{sse}");
    let joined = pieces.concat();
    let parsed: Value = serde_json::from_str(&joined).unwrap();
    assert!(
        parsed["city"].is_string() && parsed["days"].is_i64(),
        "{joined}"
    );
    assert_eq!(joined, arguments);
    assert!(sse.contains("\"finish_reason\":\"tool_calls\""), "{sse}");
}
