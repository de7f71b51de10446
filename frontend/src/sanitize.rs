//! The optional prompt sanitiser: removes byte-order marks and invisible bidi and zero-width control characters
//! (the "Trojan Source" family, CVE-2021-42574) before tokenising. Off by default; when on, every character it
//! removes is counted in `zl_frontend_sanitized_chars_total`.

/// Whether `c` is removed.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{feff}' // byte-order mark / zero-width no-break space
            | '\u{200b}'..='\u{200f}' // zero-width space, (non-)joiner, LRM, RLM
            | '\u{202a}'..='\u{202e}' // bidi embeddings and overrides
            | '\u{2060}'..='\u{2064}' // word joiner, invisible operators
            | '\u{2066}'..='\u{2069}' // bidi isolates
            | '\u{061c}' // Arabic letter mark
    )
}

/// `text` without invisible control characters, and how many were removed.
pub fn sanitize(text: &str) -> (String, usize) {
    if !text.chars().any(invisible) {
        return (text.to_owned(), 0);
    }
    let mut removed = 0;
    let clean = text
        .chars()
        .filter(|&c| {
            let drop = invisible(c);
            removed += usize::from(drop);
            !drop
        })
        .collect();
    (clean, removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_boms_bidi_and_zero_width_only() {
        let (clean, n) = sanitize("\u{feff}if access\u{202e}\u{2066} == \u{200b}\"user\"\u{2069} é 中 👍");
        assert_eq!(clean, "if access == \"user\" é 中 👍");
        assert_eq!(n, 5);
        assert_eq!(sanitize("plain"), ("plain".to_owned(), 0));
    }
}
