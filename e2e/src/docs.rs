//! The project's documents as tests read them: fenced code blocks to run as written.

use std::path::PathBuf;

/// The fenced code blocks of language `lang` in `doc` (a path relative to the workspace root, e.g. `README.md`).
pub fn code_blocks(doc: &str, lang: &str) -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(doc);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // `open`: inside a fence, with the block being collected when its language is `lang`.
    let (mut blocks, mut open): (Vec<String>, Option<Option<String>>) = (Vec::new(), None);
    for line in text.lines() {
        match (open.take(), line.trim_start().strip_prefix("```")) {
            (None, Some(tag)) => open = Some((tag.trim() == lang).then(String::new)),
            (None, None) => {}
            (Some(block), Some(_)) => blocks.extend(block),
            (Some(mut block), None) => {
                if let Some(b) = &mut block {
                    b.push_str(line);
                    b.push('\n');
                }
                open = Some(block);
            }
        }
    }
    blocks
}

#[cfg(test)]
mod tests {
    #[test]
    fn code_blocks_are_found_by_language() {
        let python = super::code_blocks("README.md", "python");
        assert!(!python.is_empty() && python.iter().all(|b| b.contains("import ") && !b.contains("```")));
        let shell = super::code_blocks("README.md", "sh");
        assert!(shell.iter().any(|b| b.contains("scripts/up")) && shell.iter().all(|b| !b.contains("import ")));
    }
}
