#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};
use zl_wire::message::StopReason;

use super::*;
use crate::cache::FinishInfo;
use crate::dialect::Dialect;
use crate::gateway::GenRequest;

fn weather() -> Value {
    json!({"name": "get_weather", "description": "Weather.", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})
}

fn messages(extra: Value) -> Result<GenRequest, ApiError> {
    let mut body =
        json!({"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    crate::anthropic::parse(&body, false)
}

fn chat(extra: Value) -> Result<GenRequest, ApiError> {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    crate::openai::parse(&body).map(|r| r.req)
}

fn finish(reason: StopReason) -> FinishInfo {
    FinishInfo {
        stop_reason: reason,
        stop_sequence: None,
        input_tokens: 5,
        output_tokens: 9,
        cached_input_tokens: 0,
        draft_tokens: 0,
        accepted_draft_tokens: 0,
        migrated_to: Vec::new(),
        billing_unit: 1.0,
    }
}

const CALL: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

#[test]
fn anthropic_tools_and_choices_decide_the_grammar() {
    let auto = messages(json!({"tools": [weather()]})).unwrap();
    assert!(auto.tools.active() && auto.grammar.is_none());
    assert_eq!(auto.tools.call_parse(), CallParse::Anywhere);
    let forced =
        messages(json!({"tools": [weather()], "tool_choice": {"type": "tool", "name": "get_weather"}})).unwrap();
    let g = forced.grammar.unwrap();
    assert!(g.contains("get_weather") && g.contains("%json"), "{g}");
    let mut strict = weather();
    strict["strict"] = json!(true);
    let strict = messages(json!({"tools": [strict]})).unwrap();
    assert_eq!(strict.tools.call_parse(), CallParse::AtStart);
    assert!(strict.grammar.unwrap().contains("TEXT"));
    let none = messages(json!({"tools": [weather()], "tool_choice": {"type": "none"}})).unwrap();
    assert!(!none.tools.active() && none.grammar.is_none());
    let any =
        messages(json!({"tools": [weather()], "tool_choice": {"type": "any", "disable_parallel_tool_use": true}}))
            .unwrap();
    assert!(!any.tools.parallel && any.grammar.is_some());
    let schema = messages(json!({"output_format": {"type": "json_schema", "schema": {"type": "object"}}})).unwrap();
    assert!(schema.grammar.unwrap().starts_with("start: %json"));
}

#[test]
fn anthropic_tool_mistakes_are_refused_by_field() {
    let err = |extra: Value| messages(extra).unwrap_err().message;
    assert_eq!(
        err(json!({"tools": [{"name": "bad name", "input_schema": {"type": "object"}}]})),
        "tools.0.name: String should match pattern '^[a-zA-Z0-9_-]{1,64}$'"
    );
    assert_eq!(err(json!({"tools": [weather(), weather()]})), "tools: tool names must be unique (\"get_weather\")");
    assert!(err(json!({"tools": [weather()], "tool_choice": {"type": "tool", "name": "other"}})).contains("not among"));
    assert!(err(json!({"tool_choice": {"type": "any"}})).contains("no tools were offered"));
    assert!(err(json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]})).contains("server tools"));
    let bad = json!({"name": "x", "input_schema": {"type": "object", "properties": {"a": {"type": "wizard"}}}});
    let e = messages(json!({"tools": [bad], "tool_choice": {"type": "any"}})).unwrap_err();
    assert!(e.message.contains("cannot be enforced") && e.message.contains("wizard"), "{}", e.message);
}

#[test]
fn anthropic_tool_turns_flatten_into_the_conversation() {
    let r = messages(json!({"tools": [weather()], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}]}, {"type": "text", "text": "Thanks"}]},
    ]}))
    .unwrap();
    assert_eq!(r.messages[1].content, format!("Checking.\n{CALL}"));
    assert_eq!(r.messages[2].content, "<tool_response>\n18C\n</tool_response>Thanks");
    let orphan = messages(json!({"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x", "is_error": true}]},
    ]}))
    .unwrap_err();
    assert!(orphan.message.contains("toolu_9"), "{}", orphan.message);
    let misplaced = messages(
        json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]}]}),
    )
    .unwrap_err();
    assert!(misplaced.message.contains("only appear in assistant messages"), "{}", misplaced.message);
}

#[test]
fn anthropic_answers_carry_tool_use_blocks_whole_and_streamed() {
    let body =
        json!({"model": "m", "max_tokens": 50, "tools": [weather()], "messages": [{"role": "user", "content": "hi"}]});
    let (_, mut whole) = crate::anthropic::Messages::parse(&body).unwrap();
    let m = whole.final_body(&format!("Let me look.\n{CALL}"), &finish(StopReason::EndTurn));
    assert_eq!(m["stop_reason"], "tool_use");
    assert_eq!(m["content"][0], json!({"type": "text", "text": "Let me look."}));
    assert_eq!(m["content"][1]["type"], "tool_use");
    assert_eq!(m["content"][1]["input"], json!({"city": "Paris"}));
    assert!(m["content"][1]["id"].as_str().unwrap().starts_with("toolu_"));

    let (_, mut streamed) = crate::anthropic::Messages::parse(&body).unwrap();
    let head = streamed.stream_head();
    assert!(!head.contains("content_block_start"), "blocks open as they come: {head}");
    let mut events = String::new();
    for piece in CALL.as_bytes().chunks(7) {
        events += &streamed.render_event(&crate::gateway::GenEvent::Delta(String::from_utf8_lossy(piece).into()));
    }
    events += &streamed.render_event(&crate::gateway::GenEvent::Finish(finish(StopReason::EndTurn)));
    let datas: Vec<Value> =
        events.lines().filter_map(|l| l.strip_prefix("data: ")).map(|d| serde_json::from_str(d).unwrap()).collect();
    assert_eq!(datas[0]["content_block"]["type"], "tool_use");
    assert_eq!(datas[0]["content_block"]["name"], "get_weather");
    let json: String = datas
        .iter()
        .filter(|d| d["delta"]["type"] == "input_json_delta")
        .map(|d| d["delta"]["partial_json"].as_str().unwrap())
        .collect();
    assert_eq!(serde_json::from_str::<Value>(&json).unwrap(), json!({"city": "Paris"}));
    let types: Vec<&str> = datas.iter().map(|d| d["type"].as_str().unwrap()).collect();
    assert_eq!(&types[types.len() - 3..], ["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(datas[datas.len() - 2]["delta"]["stop_reason"], "tool_use");
}

#[test]
fn openai_tools_formats_and_tool_messages() {
    let tool = json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}});
    let r = chat(json!({"tools": [tool], "tool_choice": "required", "parallel_tool_calls": false})).unwrap();
    assert_eq!(r.tools.choice, Choice::Any);
    assert!(!r.tools.parallel && r.grammar.is_some());
    let named =
        chat(json!({"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}));
    assert_eq!(named.unwrap().tools.choice, Choice::Named("get_weather".into()));
    assert!(chat(json!({"response_format": {"type": "json_object"}})).unwrap().grammar.is_some());
    let e = chat(
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wizard"}}}}),
    )
    .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("response_format"));
    assert!(chat(json!({"functions": []})).unwrap_err().message.contains("deprecated"));
    let turns = chat(json!({"tools": [tool], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    ]}))
    .unwrap();
    assert_eq!(turns.messages[1].content, CALL);
    assert_eq!(turns.messages[2].content, "<tool_response>\n18C\n</tool_response>");
    assert_eq!(turns.messages[2].role, "user");
}

#[test]
fn openai_answers_carry_tool_calls_whole_and_streamed() {
    let body = json!({"model": "m", "tools": [{"type": "function", "function": {"name": "get_weather"}}], "messages": [{"role": "user", "content": "hi"}]});
    let (_, mut whole) = crate::openai::ChatCompletions::parse(&body).unwrap();
    let c = whole.final_body(CALL, &finish(StopReason::EndTurn));
    assert_eq!(c["choices"][0]["finish_reason"], "tool_calls");
    let m = &c["choices"][0]["message"];
    assert_eq!(m["content"], Value::Null);
    assert_eq!(m["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(m["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Paris\"}");

    let (_, mut streamed) = crate::openai::ChatCompletions::parse(&body).unwrap();
    let mut out = String::new();
    for piece in CALL.as_bytes().chunks(5) {
        out += &streamed.render_event(&crate::gateway::GenEvent::Delta(String::from_utf8_lossy(piece).into()));
    }
    out += &streamed.render_event(&crate::gateway::GenEvent::Finish(finish(StopReason::EndTurn)));
    let chunks: Vec<Value> = out
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let calls: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
    assert_eq!(calls[0][0]["function"]["name"], "get_weather");
    assert!(calls.iter().all(|c| c[0]["index"] == 0));
    let args: String = calls.iter().map(|c| c[0]["function"]["arguments"].as_str().unwrap_or_default()).collect();
    assert_eq!(args, "{\"city\": \"Paris\"}");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
}

#[test]
fn a_grammar_too_large_for_the_wire_is_refused_before_it_compiles() {
    let props: serde_json::Map<String, Value> =
        (0..12_000).map(|i| (format!("field_{i:05}"), json!({"type": "integer"}))).collect();
    let big = json!({"name": "big", "input_schema": {"type": "object", "properties": props}});
    let e = messages(json!({"tools": [big], "tool_choice": {"type": "any"}})).unwrap_err();
    assert!(e.message.contains("too large to enforce"), "{}", e.message);
}

#[test]
fn thinking_signatures_are_stable_and_differ_by_text() {
    use super::anthropic::signature;
    assert_eq!(signature("a"), signature("a"));
    assert_ne!(signature("a"), signature("b"));
    assert!(signature("").starts_with("zl1"));
}
