#![allow(clippy::unwrap_used)]

use super::*;

/// Whether the byte engine accepts `text` whole under `grammar`.
fn accepts(grammar: &str, text: &str) -> bool {
    let mut c = Engine::bytes_only().unwrap().start(grammar).unwrap();
    for b in text.bytes() {
        let mask = c.mask().unwrap();
        if !mask.allows(u32::from(b)) {
            return false;
        }
        c.advance(u32::from(b)).unwrap();
    }
    c.is_complete()
}

#[test]
fn schemas_compile_and_bad_ones_are_named() {
    let g =
        json_schema(&json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})).unwrap();
    check(&g).unwrap();
    assert!(accepts(&g, r#"{"a": 5}"#));
    assert!(!accepts(&g, r#"{"a": "x"}"#));
    assert!(!accepts(&g, r#"{"a":5}"#), "the layout is fixed");
    let bad = json_schema(&json!({"type": "wizard"})).unwrap();
    let e = check(&bad).unwrap_err().to_string();
    assert!(e.contains("wizard"), "{e}");
    assert!(json_schema(&json!(3)).is_err());
}

#[test]
fn json_object_takes_any_object() {
    let g = json_object();
    check(&g).unwrap();
    assert!(accepts(&g, r#"{"x": [1, 2], "y": {"z": null}}"#));
    assert!(!accepts(&g, "[1]"));
}

#[test]
fn tool_calls_fix_the_envelope_and_check_the_arguments() {
    let tools = [
        ToolSpec {
            name: "get_weather".into(),
            schema: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        },
        ToolSpec { name: "now".into(), schema: json!({"type": "object", "properties": {}}) },
    ];
    let one = tool_calls(&tools, false, false).unwrap();
    check(&one).unwrap();
    let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    assert!(accepts(&one, call));
    assert!(accepts(&one, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
    assert!(!accepts(&one, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
    assert!(!accepts(&one, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
    assert!(!accepts(&one, &format!("{call}\n{call}")), "one call without parallel use");
    let many = tool_calls(&tools, true, false).unwrap();
    assert!(accepts(&many, &format!("{call}\n{call}")));
    assert!(!accepts(&many, &format!("{call}\n{call}\n{call}")), "at most one call per tool");
    assert!(tool_calls(&[ToolSpec { name: "a b".into(), schema: json!({}) }], false, false).is_err());
    assert!(tool_calls(&[], false, false).is_err());
}

#[test]
fn optional_calls_leave_text_free_but_calls_valid() {
    let call = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    let tools = [ToolSpec { name: "now".into(), schema: json!({"type": "object", "properties": {}}) }];
    let g = tool_calls(&tools, true, true).unwrap();
    check(&g).unwrap();
    assert!(accepts(&g, "hello there"));
    assert!(accepts(&g, "<b>bold</b>, and <tool"));
    assert!(accepts(&g, call));
    assert!(!accepts(&g, &format!("{call}\n{call}")), "one tool, one call");
    assert!(!accepts(&g, "<tool_call>\n{\"name\": \"now\", \"arguments\": 5}\n</tool_call>"));
    assert!(!accepts(&g, "<tool_call>\n{\"name\": \"x\"}\n</tool_call>"));
}

#[test]
fn a_cut_short_answer_can_always_be_closed() {
    let g = json_schema(&json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 2},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
            "kind": {"enum": ["alpha", "beta"]},
            "n": {"type": "integer", "minimum": 10}
        },
        "required": ["name", "tags", "kind", "n"]
    }))
    .unwrap();
    let mut c = Engine::bytes_only().unwrap().start(&g).unwrap();
    for b in br#"{"name": "Par"#.iter() {
        c.advance(u32::from(*b)).unwrap();
    }
    let close = c.closing(256).unwrap();
    let text: Vec<u8> = close.iter().map(|&t| t as u8).collect();
    let whole = format!("{{\"name\": \"Par{}", String::from_utf8(text).unwrap());
    let v: serde_json::Value = serde_json::from_str(&whole).unwrap();
    assert!(v["tags"].as_array().unwrap().len() >= 2 && v["n"].as_i64().unwrap() >= 10, "{whole}");
    assert!(["alpha", "beta"].contains(&v["kind"].as_str().unwrap()), "{whole}");
    for t in close {
        c.advance(t).unwrap();
    }
    assert!(c.is_complete());
}

/// What docs/api.md lists as unsupported is refused, by name; the rest compiles.
#[test]
fn unsupported_schema_keywords_are_named() {
    let refused = [
        ("not", json!({"type": "object", "properties": {"a": {"not": {"type": "string"}}}})),
        ("if", json!({"type": "object", "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}})),
        ("dependentRequired", json!({"type": "object", "dependentRequired": {"a": ["b"]}})),
        ("uniqueItems", json!({"type": "array", "uniqueItems": true})),
        ("propertyNames", json!({"type": "object", "propertyNames": {"maxLength": 3}})),
        ("contains", json!({"type": "array", "contains": {"type": "integer"}})),
        ("https://example.com/x.json", json!({"$ref": "https://example.com/x.json"})),
    ];
    for (name, schema) in refused {
        let e = json_schema(&schema).and_then(|g| check(&g)).unwrap_err().to_string();
        assert!(e.contains(name) && !e.starts_with("at "), "{name}: {e}");
    }
    let accepted = [
        json!({"type": "object", "patternProperties": {"^x": {"type": "integer"}}}),
        json!({"type": "integer", "multipleOf": 5}),
        json!({"type": "string", "format": "date-time"}),
        json!({"type": "object", "minProperties": 1}),
        json!({"oneOf": [{"type": "integer"}, {"type": "string"}]}),
        json!({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]}),
        json!({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}),
        json!({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]}),
        json!({"type": "string", "x-unknown": 1}),
    ];
    for schema in accepted {
        json_schema(&schema).and_then(|g| check(&g)).unwrap_or_else(|e| panic!("{schema}: {e}"));
    }
}
