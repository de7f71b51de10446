//! Files that hold secrets or evidence (the Raft log and its snapshots, which carry API-key hashes and content data
//! keys; audit segments): created readable by the owner alone, 0600 in 0700 directories, whatever the umask, and
//! tightened when an older build left them wider. Never loosened.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

/// Mode of a private directory.
pub const DIR_MODE: u32 = 0o700;
/// Mode of a private file.
pub const FILE_MODE: u32 = 0o600;

/// Create `dir` (and its missing parents) and make it owner-only.
pub fn create_dir(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    set_mode(dir, DIR_MODE)
}

/// Open `path` for appending, creating it owner-only.
pub fn append(path: &Path) -> io::Result<File> {
    options().append(true).open(path)
}

/// Create (or truncate) `path` for writing, owner-only.
pub fn create(path: &Path) -> io::Result<File> {
    let f = options().write(true).truncate(true).open(path)?;
    // An existing file keeps its mode on open: tighten it.
    set_mode(path, FILE_MODE)?;
    Ok(f)
}

/// Make every file directly in `dir` owner-only (what an older build wrote with the umask's mode).
pub fn tighten_files(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            set_mode(&entry.path(), FILE_MODE)?;
        }
    }
    Ok(())
}

fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.create(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, FILE_MODE);
    o
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let current = std::fs::metadata(path)?.permissions().mode() & 0o777;
    // Only ever take permissions away.
    let wanted = current & mode;
    if wanted != current { std::fs::set_permissions(path, std::fs::Permissions::from_mode(wanted)) } else { Ok(()) }
}

#[cfg(not(unix))]
fn set_mode(_path: &Path, _mode: u32) -> io::Result<()> {
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn private_files_are_owner_only_whatever_was_there() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        create_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        let f = dir.join("seg");
        drop(append(&f).unwrap());
        assert_eq!(mode(&f), 0o600);
        // Left wide by an older build: tightened, never widened.
        let old = dir.join("old");
        std::fs::write(&old, b"x").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        create_dir(&dir).unwrap();
        tighten_files(&dir).unwrap();
        assert_eq!((mode(&dir), mode(&old)), (0o700, 0o600));
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o400)).unwrap();
        let _ = create(&old);
        tighten_files(&dir).unwrap();
        assert_eq!(mode(&old), 0o400, "never loosened");
    }
}
