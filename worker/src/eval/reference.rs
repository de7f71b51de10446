//! The reference engine's perplexity: llama.cpp's `llama-perplexity` run on the same file, text and chunk size
//! (it scores the second half of each chunk, as [`super::perplexity`] does), its figure read from its log. Never a
//! dependency of the product: the binary is whatever the caller points at (`scripts/llama-cpp` builds one from
//! the source the PyPI sdist `llama-cpp-python` vendors).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where to find `llama-perplexity`: `ZL_LLAMA_PERPLEXITY`, else `.tools/llama.cpp/bin/llama-perplexity` under the
/// working directory when it exists, else `llama-perplexity` on the `PATH`.
pub fn llama_perplexity_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("ZL_LLAMA_PERPLEXITY") {
        return PathBuf::from(p);
    }
    let local = Path::new(".tools/llama.cpp/bin/llama-perplexity");
    if local.exists() { local.to_path_buf() } else { PathBuf::from("llama-perplexity") }
}

/// Run `binary` on `model` and `text` with chunks of `context` tokens on `threads` threads; its final estimate.
pub fn llama_cpp_perplexity(
    binary: &Path,
    model: &Path,
    text: &Path,
    context: usize,
    threads: usize,
) -> Result<f64, String> {
    let out = Command::new(binary)
        .arg("-m")
        .arg(model)
        .arg("-f")
        .arg(text)
        .args(["-c", &context.to_string(), "-b", &context.to_string(), "-t", &threads.to_string()])
        .output()
        .map_err(|e| {
            format!("running {}: {e} (set ZL_LLAMA_PERPLEXITY to llama.cpp's llama-perplexity)", binary.display())
        })?;
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    match final_estimate(&log) {
        Some(p) if out.status.success() => Ok(p),
        _ => {
            let tail: Vec<&str> = log.lines().rev().take(8).collect();
            Err(format!(
                "{} exited with {} and no final estimate; its last lines:\n{}",
                binary.display(),
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ))
        }
    }
}

/// The figure of llama.cpp's `Final estimate: PPL = 12.3456 +/- 0.12345` line.
pub fn final_estimate(log: &str) -> Option<f64> {
    let line = log.lines().rev().find(|l| l.contains("Final estimate: PPL ="))?;
    let after = line.split("PPL =").nth(1)?;
    after.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_final_estimate() {
        let log = "perplexity: calculating perplexity over 12 chunks\n[1]14.2,[2]15.1\n\
                   Final estimate: PPL = 15.0826 +/- 0.55127\n\nllama_perf_context_print: load time = 1.0 ms\n";
        assert_eq!(final_estimate(log), Some(15.0826));
        assert_eq!(final_estimate("no figure here"), None);
        assert_eq!(final_estimate("Final estimate: PPL = nan +/- nan").map(f64::is_nan), Some(true));
    }

    #[test]
    fn a_missing_binary_is_a_clear_error() {
        let err =
            llama_cpp_perplexity(Path::new("/nonexistent/llama-perplexity"), Path::new("m"), Path::new("t"), 512, 2)
                .unwrap_err();
        assert!(err.contains("ZL_LLAMA_PERPLEXITY"), "{err}");
    }
}
