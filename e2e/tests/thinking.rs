//! Thinking sections served by the whole local cluster: `zl up --model` with a Qwen3 whose chat template has Qwen3's
//! thinking switch (random weights, written by `scripts/arch_models.py`), asked through the official SDKs
//! (`e2e/sdk/thinking.py`): Anthropic `thinking` blocks and OpenAI `reasoning_content`, streamed and whole, the
//! budget closing the section, no raw markers in any answer.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Command;

use zl_e2e::zl_up;

const KEY: &str = "sk-zl-thinking-test-key-0123456789abcdef";

#[test]
fn thinking_sections_come_out_as_the_apis_blocks_through_the_sdks() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let bundled = Command::new(zl_e2e::bin("zl-worker")).arg("fetch-default-model").output().unwrap();
    assert!(bundled.status.success(), "{}", String::from_utf8_lossy(&bundled.stderr));
    let bundled = String::from_utf8(bundled.stdout).unwrap().trim().to_owned();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/arch_models.py");
    let out =
        Command::new(zl_e2e::python()).arg(script).arg(bundled).arg(&models).arg("qwen3-thinking").output().unwrap();
    assert!(out.status.success(), "arch_models.py: {}", String::from_utf8_lossy(&out.stderr));
    let model = format!("qwen3-thinking={}", models.join("qwen3-thinking.gguf").display());
    let (_up, http, _state) = zl_up(dir.path(), "data", KEY, &["--model", &model], &[]);
    zl_e2e::sdk_script("thinking.py", http, KEY, "qwen3-thinking", &[], "thinking: ok");
}
