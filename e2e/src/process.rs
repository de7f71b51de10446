//! The real binaries as processes: where they are, starting them (`zl`, `zl up`) and ending them, signals.

use std::path::PathBuf;
use std::process::{Command, Output};

/// Path of a workspace binary: `$ZL_BIN_DIR/NAME`, else NAME in the profile directory this test was built in
/// (`target/release/` for `cargo nextest run --release`, as `scripts/test` runs, which shares `scripts/up`'s build).
///
/// Panics with instructions when the binary has not been built, since a test that silently skips proves nothing.
pub fn bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("ZL_BIN_DIR").map(PathBuf::from).unwrap_or_else(profile_dir);
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the binaries first (`cargo build --release --bins`, which scripts/test runs, or \
         `cargo build --bins` for a debug test run)",
        path.display()
    );
    path
}

/// `target/<profile>`: a test executable lives in its `deps/` directory.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable has a path");
    exe.parent().and_then(std::path::Path::parent).map(std::path::Path::to_path_buf).expect("target/<profile>/deps/")
}

/// Run `zl` with `args` and capture its output.
pub fn zl(args: &[&str]) -> Output {
    Command::new(bin("zl")).args(args).output().expect("zl could not be started")
}

/// A child process that is killed (and reaped) when dropped, so a failing test never leaves it running.
#[derive(Debug)]
pub struct Proc(pub std::process::Child);

impl Proc {
    /// Start `bin(name)` with `args`, stdin closed.
    pub fn spawn(name: &str, args: &[&str]) -> Proc {
        let child = Command::new(bin(name))
            .args(args)
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{name} could not be started: {e}"));
        Proc(child)
    }

    /// Panic if the process has exited.
    pub fn assert_running(&mut self, what: &str) {
        if let Ok(Some(status)) = self.0.try_wait() {
            panic!("{what} exited early: {status}");
        }
    }

    /// Send SIGTERM (a graceful stop) and wait up to `timeout` for the exit; returns whether it exited cleanly.
    pub fn terminate(&mut self, timeout: std::time::Duration) -> bool {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.0.try_wait() {
                return status.success();
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Send SIGKILL or SIGTERM (`signal` as `kill` spells it) to a process.
pub fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill").args([signal, &pid.to_string()]).status();
}

/// Whether a process with this pid exists (and is not a zombie of ours).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// Run `e2e/sdk/SCRIPT` (the official SDKs against a frontend at `http`) with `ZL_BASE_URL`, `ZL_API_KEY`,
/// `ZL_MODEL` and `extra` set; asserts it succeeded and that its last line is `done`; returns what it printed.
pub fn sdk_script(
    script: &str,
    http: std::net::SocketAddr,
    key: &str,
    model: &str,
    extra: &[(&str, &str)],
    done: &str,
) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sdk").join(script);
    let out = std::process::Command::new(python())
        .arg(&path)
        .env("ZL_BASE_URL", format!("http://{http}"))
        .env("ZL_API_KEY", key)
        .env("ZL_MODEL", model)
        .envs(extra.iter().copied())
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.trim_end().ends_with(done),
        "{script} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The workspace's Python virtualenv interpreter, with the official SDKs (`scripts/test` installs them).
///
/// Panics with instructions when it is missing, since a test that silently skips proves nothing.
pub fn python() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(".venv").join("bin").join("python");
    assert!(path.is_file(), "{} is missing: run scripts/test, which installs the Python SDKs", path.display());
    path
}
