#![allow(clippy::unwrap_used)]

use super::*;

/// Split `text` pushed in pieces of `step` bytes (at char boundaries); pieces merged where adjacent of a kind.
fn split(parse: CallParse, text: &str, step: usize) -> Vec<Piece> {
    let mut s = Splitter::new(parse, vec!["get_weather".into(), "now".into()]);
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let mut j = (i + step).min(text.len());
        while !text.is_char_boundary(j) {
            j += 1;
        }
        out.extend(s.push(&text[i..j]));
        i = j;
    }
    out.extend(s.finish());
    merge(out)
}

fn merge(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    for p in pieces {
        match (out.last_mut(), p) {
            (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
            (Some(Piece::CallArgs(a)), Piece::CallArgs(b)) => a.push_str(&b),
            (_, p) => out.push(p),
        }
    }
    out
}

fn text(s: &str) -> Piece {
    Piece::Text(s.into())
}

fn call(name: &str, args: &str, valid: bool) -> [Piece; 3] {
    [Piece::CallStart { name: name.into() }, Piece::CallArgs(args.into()), Piece::CallEnd { valid }]
}

#[test]
fn calls_are_split_out_at_any_chunking() {
    let answer = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": {\"a\": 1}}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    let mut expected = vec![text("Let me check.")];
    expected.extend(call("get_weather", "{\"city\": \"Paris\", \"n\": {\"a\": 1}}", true));
    expected.extend(call("now", "{}", true));
    for step in [1, 2, 3, 5, 7, 16, 1000] {
        assert_eq!(split(CallParse::Anywhere, answer, step), expected, "step {step}");
    }
}

#[test]
fn arguments_stream_before_the_call_closes() {
    let mut s = Splitter::new(CallParse::Anywhere, vec!["now".into()]);
    let mut out = s.push("<tool_call>\n{\"name\": \"now\", \"arguments\": {\"a\": [1, 2");
    assert_eq!(out.remove(0), Piece::CallStart { name: "now".into() });
    assert_eq!(merge(out), vec![Piece::CallArgs("{\"a\": [1, 2".into())]);
    // A closing brace may be the wrapper's: held back until more comes.
    assert_eq!(s.push("]}"), vec![Piece::CallArgs("]".into())]);
    assert_eq!(s.push("}"), vec![Piece::CallArgs("}".into())]);
    assert_eq!(s.push("\n</tool_"), vec![]);
    assert_eq!(s.push("call>"), vec![Piece::CallEnd { valid: true }]);
    assert_eq!(s.finish(), vec![]);
}

#[test]
fn other_shapes_unknown_tools_and_unfinished_calls() {
    // Arguments first: read whole.
    let odd = "<tool_call>{\"arguments\": {\"x\": 1}, \"name\": \"now\"}</tool_call>";
    assert_eq!(split(CallParse::Anywhere, odd, 3), call("now", "{\"x\":1}", true).to_vec());
    // An unknown tool stays text.
    let unknown = "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>";
    assert_eq!(split(CallParse::Anywhere, unknown, 4), vec![text(unknown)]);
    // Cut off inside the arguments: the call ends, not valid.
    let cut = "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"a\": ";
    assert_eq!(split(CallParse::Anywhere, cut, 5), call("now", "{\"a\": ", false).to_vec());
    // Cut off before the name: text.
    assert_eq!(split(CallParse::Anywhere, "Hi <tool_call>\n{\"na", 3), vec![text("Hi <tool_call>\n{\"na")]);
    // A lone `<` that opens no call is text.
    assert_eq!(split(CallParse::Anywhere, "a < b and <tool", 2), vec![text("a < b and <tool")]);
}

#[test]
fn at_start_only_an_opening_call_counts_and_off_is_verbatim() {
    let c = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    assert_eq!(split(CallParse::AtStart, c, 4), call("now", "{}", true).to_vec());
    let later = format!("Sure: {c}");
    assert_eq!(split(CallParse::AtStart, &later, 4), vec![text(&later)]);
    assert_eq!(split(CallParse::Anywhere, &later, 4)[0], text("Sure:"));
    assert_eq!(split(CallParse::Off, "  spaced  \n", 3), vec![text("  spaced  \n")]);
    assert_eq!(split(CallParse::Off, &later, 3), vec![text(&later)]);
}
