//! The reference engine's perplexity: llama.cpp's `llama-perplexity` run on the same file, text and chunk size
//! (it scores the second half of each chunk, as [`super::perplexity`] does), its figure read from its log; and the
//! KL divergence of our logits from the ones it saved, on its own tokens, beside what llama.cpp's two attention
//! paths (flash attention on and off) diverge by from each other. Never a dependency of the product: the binary is
//! whatever the caller points at (`scripts/llama-cpp` builds one from the source the PyPI sdist
//! `llama-cpp-python` vendors).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::logits_file::{Divergence, LogitsFileError, log_softmax, read_header, read_row, saved_log_prob};
use super::perplexity::score_chunks;
use crate::model::llama::{KvDtype, Llama};

/// Where to find `llama-perplexity`: `ZL_LLAMA_PERPLEXITY`, else `.tools/llama.cpp/bin/llama-perplexity` under the
/// working directory when it exists, else `llama-perplexity` on the `PATH`.
pub fn llama_perplexity_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("ZL_LLAMA_PERPLEXITY") {
        return PathBuf::from(p);
    }
    let local = Path::new(".tools/llama.cpp/bin/llama-perplexity");
    if local.exists() { local.to_path_buf() } else { PathBuf::from("llama-perplexity") }
}

/// llama.cpp's `llama-perplexity` on one file and text, chunks of `context` tokens, `threads` threads.
#[derive(Clone, Copy, Debug)]
pub struct LlamaCpp<'a> {
    /// The binary.
    pub binary: &'a Path,
    /// The GGUF file.
    pub model: &'a Path,
    /// The text.
    pub text: &'a Path,
    /// Tokens per chunk.
    pub context: usize,
    /// Threads.
    pub threads: usize,
}

impl LlamaCpp<'_> {
    /// Run with `extra` arguments; its log when it succeeded and printed `wanted`.
    fn run(&self, extra: &[&std::ffi::OsStr], wanted: &str) -> Result<String, String> {
        let (c, t) = (self.context.to_string(), self.threads.to_string());
        let out = Command::new(self.binary)
            .arg("-m")
            .arg(self.model)
            .arg("-f")
            .arg(self.text)
            .args(["-c", &c, "-b", &c, "-t", &t])
            .args(extra)
            .output()
            .map_err(|e| {
                format!(
                    "running {}: {e} (set ZL_LLAMA_PERPLEXITY to llama.cpp's llama-perplexity)",
                    self.binary.display()
                )
            })?;
        let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if out.status.success() && log.contains(wanted) {
            return Ok(log);
        }
        let tail: Vec<&str> = log.lines().rev().take(8).collect();
        Err(format!(
            "{} exited with {} without {wanted:?}; its last lines:\n{}",
            self.binary.display(),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ))
    }

    /// Its perplexity (flash attention on, llama.cpp's default on a CPU), saving its log-probabilities to `save`
    /// when given.
    pub fn perplexity(&self, save: Option<&Path>) -> Result<f64, String> {
        let mut extra: Vec<&std::ffi::OsStr> = vec!["-fa".as_ref(), "on".as_ref()];
        if let Some(path) = save {
            extra.extend([std::ffi::OsStr::new("--kl-divergence-base"), path.as_os_str()]);
        }
        let log = self.run(&extra, "Final estimate: PPL =")?;
        final_estimate(&log).ok_or_else(|| "no final estimate in llama.cpp's log".into())
    }

    /// How far its other attention path (flash attention off) diverges from the log-probabilities saved in
    /// `saved`: (mean KL divergence, share of positions with the same top token), as llama.cpp prints them. The
    /// tolerance llama.cpp's own kernels agree to.
    pub fn divergence_without_flash_attention(&self, saved: &Path) -> Result<(f64, f64), String> {
        let extra: Vec<&std::ffi::OsStr> = vec![
            "-fa".as_ref(),
            "off".as_ref(),
            "--kl-divergence".as_ref(),
            "--kl-divergence-base".as_ref(),
            saved.as_os_str(),
        ];
        let log = self.run(&extra, "Mean    KLD:")?;
        let figure = |label: &str| -> Option<f64> {
            let line = log.lines().find(|l| l.contains(label))?;
            line.split(label).nth(1)?.split_whitespace().next()?.parse().ok()
        };
        match (figure("Mean    KLD:"), figure("Same top p:")) {
            (Some(kld), Some(top)) => Ok((kld, top / 100.0)),
            _ => Err("no KLD or same-top figure in llama.cpp's log".into()),
        }
    }
}

/// The KL divergence of `model`'s logits from llama.cpp's saved in `saved`, on llama.cpp's own tokens and chunks
/// (each chunk's first token replaced by `bos`, as llama.cpp does when the model has one).
pub fn divergence(model: &Llama, saved: &Path, bos: Option<u32>) -> Result<Divergence, LogitsFileError> {
    let size = std::fs::metadata(saved)?.len();
    let mut file = std::io::BufReader::new(std::fs::File::open(saved)?);
    let header = read_header(&mut file, size)?;
    if header.vocab != model.config().vocab {
        return Err(LogitsFileError::Format(format!(
            "llama.cpp's vocabulary has {} tokens, the model's {}",
            header.vocab,
            model.config().vocab
        )));
    }
    let mut divergence = Divergence::default();
    let (rows, len) = (header.rows_per_chunk(), header.row_len());
    for chunk in header.tokens.chunks_exact(header.context) {
        let mut saved_rows = vec![0u16; rows * len];
        for row in saved_rows.chunks_exact_mut(len) {
            read_row(&mut file, row)?;
        }
        let mut i = 0;
        score_chunks(model, std::iter::once(chunk), bos, KvDtype::F16, |_, logits, next| {
            divergence.add(&saved_rows[i * len..(i + 1) * len], logits, next);
            i += 1;
        });
    }
    Ok(divergence)
}

/// The 8-bit activations rule's comparison (docs/worker.md, "8-bit activations"), on llama.cpp's own tokens and
/// chunks: the KL divergence of `native`'s next-token distribution from `float`'s (the float reference path), and
/// of llama.cpp's (saved in `saved`) from `float`'s, in that order.
pub fn divergences_from_float(
    float: &Llama,
    native: &Llama,
    saved: &Path,
    bos: Option<u32>,
) -> Result<(Divergence, Divergence), LogitsFileError> {
    let size = std::fs::metadata(saved)?.len();
    let mut file = std::io::BufReader::new(std::fs::File::open(saved)?);
    let header = read_header(&mut file, size)?;
    let vocab = float.config().vocab;
    if header.vocab != vocab {
        return Err(LogitsFileError::Format(format!(
            "llama.cpp's vocabulary has {} tokens, the model's {vocab}",
            header.vocab
        )));
    }
    let (mut ours, mut theirs) = (Divergence::default(), Divergence::default());
    let (rows, len) = (header.rows_per_chunk(), header.row_len());
    for chunk in header.tokens.chunks_exact(header.context) {
        let mut saved_rows = vec![0u16; rows * len];
        for row in saved_rows.chunks_exact_mut(len) {
            read_row(&mut file, row)?;
        }
        let mut reference = Vec::with_capacity(rows);
        score_chunks(float, std::iter::once(chunk), bos, KvDtype::F16, |_, logits, _| {
            reference.push(log_softmax(logits));
        });
        let mut i = 0;
        score_chunks(native, std::iter::once(chunk), bos, KvDtype::F16, |_, logits, next| {
            let saved = &saved_rows[i * len..(i + 1) * len];
            let llama_cpp: Vec<f32> = saved[4..4 + vocab].iter().map(|&q| saved_log_prob(saved, q)).collect();
            ours.add_log_probs(&reference[i], logits, next);
            theirs.add_log_probs(&reference[i], &llama_cpp, next);
            i += 1;
        });
    }
    Ok((ours, theirs))
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
        let (binary, m, t) = (Path::new("/nonexistent/llama-perplexity"), Path::new("m"), Path::new("t"));
        let err = LlamaCpp { binary, model: m, text: t, context: 512, threads: 2 }.perplexity(None).unwrap_err();
        assert!(err.contains("ZL_LLAMA_PERPLEXITY"), "{err}");
    }
}
