//! `zl-worker eval`: a model path's quality. `--perplexity FILE` scores a text on the model's own path (the CPU
//! kernels at the level this machine runs; every level computes the same bits) and, with `--float`, on the float
//! reference path beside it, with their ratio; `--reference llama.cpp` runs llama.cpp's `llama-perplexity` on the
//! same file, text and chunk size and prints its figure and the ratio. `--questions` asks the fixed question set greedily on both paths
//! and prints where their answers differ.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use zl_worker::eval::reference::{LlamaCpp, divergence, divergences_from_float, llama_perplexity_binary};
use zl_worker::eval::{answers, perplexity};
use zl_worker::fetch;
use zl_worker::model::kernels::{Activations, Isa};
use zl_worker::model::llama::KvDtype;
use zl_worker::model::{Precision, gguf, load_with};

/// `zl-worker eval` arguments.
#[derive(Args, Debug)]
pub(crate) struct EvalArgs {
    /// The text to score (UTF-8).
    #[arg(long, required_unless_present = "questions")]
    perplexity: Option<PathBuf>,
    /// Ask the fixed question set greedily on the native and the float reference path and compare the answers.
    #[arg(long)]
    questions: bool,
    /// A GGUF file or Hugging Face directory (default: the bundled model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Tokens per chunk; the second half of each is scored.
    #[arg(long, default_value_t = 512)]
    context: usize,
    /// Also measure the float reference path (every matrix dequantized to f32; slow).
    #[arg(long)]
    float: bool,
    /// Also score the text with a reference engine on the same file: `llama.cpp` (its `llama-perplexity`, from
    /// `ZL_LLAMA_PERPLEXITY`, `.tools/llama.cpp/bin/` or the PATH; `scripts/llama-cpp` builds it).
    #[arg(long, value_parser = ["llama.cpp"])]
    reference: Option<String>,
    /// How the scratch KV cache stores keys and values (`f16` or `q8`), as the worker's `--kv-dtype`.
    #[arg(long, value_enum, default_value_t = KvDtype::F16)]
    kv_dtype: KvDtype,
    /// Bits of the native path's activations: 8 (every matrix whose format has 8-bit kernels) or 16. With
    /// `--float` and `--reference llama.cpp`, the 8-bit activations rule's verdict (docs/worker.md) is printed.
    #[arg(long, default_value = "8")]
    activations: Activations,
    /// Longest answer to a question, in tokens.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
}

pub(crate) fn run(args: &EvalArgs) -> Result<()> {
    let path = match &args.model {
        Some(p) => p.clone(),
        None => fetch::ensure_default_model(&fetch::cache_dir(), &mut |m| eprintln!("zl-worker: {m}"))?,
    };
    if let Some(text) = &args.perplexity {
        score(args, &path, text)?;
    }
    if args.questions {
        questions(&path, args.max_tokens)?;
    }
    Ok(())
}

fn score(args: &EvalArgs, path: &Path, text_path: &Path) -> Result<()> {
    let text = std::fs::read_to_string(text_path).with_context(|| format!("reading {}", text_path.display()))?;
    let bos = if path.is_dir() { None } else { gguf::bos_token(path)? };
    let (kv, bits) = (args.kv_dtype.name(), args.activations.bits());
    let native_name = format!("native ({} kernels, {bits}-bit activations, {kv} KV)", Isa::current().name());
    let mut precisions = vec![(Precision::Native, native_name)];
    if args.float {
        precisions.push((Precision::Float, "float reference".to_owned()));
    }
    let mut values = Vec::new();
    for (precision, name) in precisions {
        let started = Instant::now();
        let model = load(path, precision, args.activations)?;
        let loaded = started.elapsed();
        let resident = zl_worker::model::resident_bytes()
            .map_or(String::new(), |b| format!("; process resident after load: {:.1} MiB", b as f64 / 1048576.0));
        println!("{name}: weights in memory: {}{resident}", model.llama.weights_summary());
        let tokens = model.tokenizer.encode(&text)?;
        let started = Instant::now();
        let Some(p) = perplexity(&model.llama, &tokens, args.context, bos, args.kv_dtype) else {
            bail!("the text has {} tokens, fewer than one chunk of {}", tokens.len(), args.context);
        };
        println!(
            "{name:<28} perplexity {:>8.4}  ({} chunks of {}, {} tokens scored, {:.1}s; loaded in {:.2}s)",
            p.value,
            p.chunks,
            args.context,
            p.scored,
            started.elapsed().as_secs_f64(),
            loaded.as_secs_f64()
        );
        values.push(p.value);
    }
    if let [native, float] = values[..] {
        println!("native / float: {:.4} ({:+.2}%)", native / float, (native / float - 1.0) * 100.0);
    }
    if args.reference.is_some() {
        if path.is_dir() {
            bail!("--reference llama.cpp needs a GGUF file (llama.cpp does not read Hugging Face directories)");
        }
        let binary = llama_perplexity_binary();
        let llama_cpp = LlamaCpp {
            binary: &binary,
            model: path,
            text: text_path,
            context: args.context,
            threads: rayon::current_num_threads(),
        };
        // llama.cpp's log-probabilities, saved for the KL divergence (one row of the vocabulary per scored token:
        // hundreds of MB for a whole corpus; removed afterwards).
        let saved = SavedLogits(std::env::temp_dir().join(format!("zl-eval-{}.logits", std::process::id())));
        let started = Instant::now();
        let reference = llama_cpp.perplexity(Some(&saved.0)).map_err(|e| anyhow!(e))?;
        println!("{:<28} perplexity {reference:>8.4}  ({:.1}s)", "llama.cpp", started.elapsed().as_secs_f64());
        let native = values[0];
        println!("native / llama.cpp: {:.4} ({:+.2}%)", native / reference, (native / reference - 1.0) * 100.0);
        let model = load(path, Precision::Native, args.activations)?;
        let d = divergence(&model.llama, &saved.0, bos)?;
        println!(
            "native against llama.cpp's logits (its tokens, {} positions): mean KLD {:.6}, same top token {:.2}%, \
             RMS of the next token's probability difference {:.3}%",
            d.rows,
            d.mean_kld(),
            d.same_top_share() * 100.0,
            d.rms_p_diff() * 100.0
        );
        let (kld, top) = llama_cpp.divergence_without_flash_attention(&saved.0).map_err(|e| anyhow!(e))?;
        println!(
            "llama.cpp against itself (flash attention off vs on): mean KLD {kld:.6}, same top token {:.2}%",
            top * 100.0
        );
        if let [native, float] = values[..] {
            let reference = load(path, Precision::Float, args.activations)?;
            let (ours, theirs) = divergences_from_float(&reference.llama, &model.llama, &saved.0, bos)?;
            let (ours, theirs, ppl) = (ours.mean_kld(), theirs.mean_kld(), native / float - 1.0);
            println!(
                "against the float reference (llama.cpp's tokens): native mean KLD {ours:.6}, llama.cpp's {theirs:.6}"
            );
            let holds = ours <= theirs && ppl.abs() <= 0.005;
            println!(
                "{bits}-bit activations rule (KLD from the float path at most llama.cpp's, perplexity within 0.5% \
                 of it): {} (KLD {ours:.6} vs {theirs:.6}, perplexity {:+.2}%)",
                if holds { "holds" } else { "fails" },
                ppl * 100.0
            );
        }
    }
    Ok(())
}

/// `path` loaded on `precision`'s path, its native matrices over `activations`.
fn load(path: &Path, precision: Precision, activations: Activations) -> Result<zl_worker::model::LoadedModel> {
    let mut model = load_with(path, precision).with_context(|| format!("loading {}", path.display()))?;
    if precision == Precision::Native {
        let share = model.llama.set_activations(activations, &[]);
        eprintln!("zl-worker: {}", activations.note(share));
    }
    Ok(model)
}

fn questions(path: &Path, max_tokens: usize) -> Result<()> {
    let load = |precision| load_with(path, precision).with_context(|| format!("loading {}", path.display()));
    let (native, float) = (load(Precision::Native)?, load(Precision::Float)?);
    let results =
        answers::compare((&native.llama, &native.tokenizer), &float.llama, max_tokens).map_err(|e| anyhow!(e))?;
    for system in answers::SYSTEM_PROMPTS {
        let set: Vec<_> = results.iter().filter(|c| c.system == system).collect();
        let agree = set.iter().filter(|c| c.agrees()).count();
        println!("system {system:?}: {agree}/{} answers agree with the float reference path", set.len());
        for c in set.iter().filter(|c| !c.agrees()) {
            println!("  {}\n    native: {:?}\n    float:  {:?}", c.question, c.answer, c.reference);
        }
    }
    Ok(())
}

/// A file removed when dropped (however the evaluation ends).
struct SavedLogits(std::path::PathBuf);

impl Drop for SavedLogits {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
