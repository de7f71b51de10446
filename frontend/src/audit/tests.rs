use zl_common::audit::{AuditRecord, ChainHead};

use super::*;

fn config(dir: &std::path::Path, segment_bytes: u64, on_failure: OnFailure) -> AuditConfig {
    AuditConfig { dir: dir.to_owned(), segment_bytes, keep_segments: 0, fsync: Fsync::Always, on_failure }
}

fn record(n: u32) -> AuditRecord {
    AuditRecord { request_id: format!("req_{n}"), status: 200, input_tokens: n, ..AuditRecord::default() }
}

fn verify(dir: &std::path::Path, head: Option<ChainHead>) -> Result<zl_common::audit::Summary, String> {
    zl_node::audit::verify_dir(dir, head, false, |_| {}).map_err(|e| e.to_string())
}

#[test]
fn records_chain_across_segments_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::open(config(dir.path(), 600, OnFailure::Continue), "fe-1", "eu").unwrap();
    for n in 1..=6 {
        log.append(record(n));
    }
    let head = log.head();
    assert_eq!(head.seq, 6);
    drop(log);
    let segments = zl_node::audit::segments(dir.path()).unwrap();
    assert!(segments.len() >= 3, "small segments rotate: {segments:?}");
    // A restarted frontend continues the same chain.
    let log = AuditLog::open(config(dir.path(), 600, OnFailure::Continue), "fe-1", "eu").unwrap();
    assert_eq!(log.head(), head);
    log.append(record(7));
    let s = verify(dir.path(), Some(head)).unwrap();
    assert_eq!((s.records, s.head.seq, s.frontend.as_str()), (7, 7, "fe-1"));
    let mut regions = Vec::new();
    zl_node::audit::verify_dir(dir.path(), None, false, |r| regions.push(r.region.clone())).unwrap();
    assert!(regions.iter().all(|r| r == "eu"));
}

#[test]
fn a_torn_last_record_is_cut_off_on_restart() {
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::open(config(dir.path(), 1 << 20, OnFailure::Continue), "fe-1", "eu").unwrap();
    log.append(record(1));
    log.append(record(2));
    drop(log);
    let (_, path) = zl_node::audit::segments(dir.path()).unwrap().pop().unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(b"abc123 {\"seq\":3");
    std::fs::write(&path, bytes).unwrap();
    assert!(verify(dir.path(), None).unwrap_err().contains("incomplete"));
    let log = AuditLog::open(config(dir.path(), 1 << 20, OnFailure::Continue), "fe-1", "eu").unwrap();
    assert_eq!(log.head().seq, 2);
    log.append(record(3));
    assert_eq!(verify(dir.path(), None).unwrap().records, 3);
}

#[test]
fn a_failed_write_closes_admission_until_one_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let chain = dir.path().join("chain");
    let log = AuditLog::open(config(&chain, 200, OnFailure::FailClosed), "fe-1", "eu").unwrap();
    log.append(record(1));
    assert!(log.admit().is_ok());
    // The directory disappears: the next rotation cannot create its segment.
    std::fs::remove_dir_all(&chain).unwrap();
    log.append(record(2));
    log.append(record(3));
    let err = log.admit().unwrap_err();
    assert!(err.message.contains("audit log"), "{}", err.message);
    assert_eq!(log.head().seq, 1, "nothing counted that was not written");
    std::fs::create_dir_all(&chain).unwrap();
    log.append(record(2));
    assert!(log.admit().is_ok());
    // With `continue`, serving goes on.
    let other = AuditLog::open(config(&dir.path().join("b"), 200, OnFailure::Continue), "fe-2", "eu").unwrap();
    other.append(record(1));
    std::fs::remove_dir_all(dir.path().join("b")).unwrap();
    other.append(record(2));
    other.append(record(3));
    assert!(other.admit().is_ok());
}

#[test]
fn a_chain_behind_its_committed_head_refuses_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::open(config(dir.path(), 1 << 20, OnFailure::Continue), "fe-1", "eu").unwrap();
    // Starting: nothing is admitted until the orchestrators confirm the chain.
    log.hold_until_confirmed();
    assert!(log.admit().is_err());
    log.check_committed(None);
    assert!(log.admit().is_ok());
    for n in 1..=3 {
        log.append(record(n));
    }
    let head = log.head();
    let hash = zl_common::keys::parse_hex32(&head.hash).unwrap();
    // The orchestrators hold the same head, or an older one of this chain: fine.
    log.check_committed(Some((3, hash)));
    assert!(log.admit().is_ok());
    log.check_committed(Some((2, [0; 32])));
    assert!(log.admit().is_ok(), "an older committed head is checked by zl audit verify, not here");
    // They hold a newer record (the directory was lost or rolled back), or this record with another hash.
    for committed in [(5, hash), (3, [9; 32])] {
        log.check_committed(Some(committed));
        let e = log.admit().unwrap_err();
        assert_eq!(e.kind.status().as_u16(), 529);
        assert!(e.message.contains("audit-reset fe-1"), "{}", e.message);
        log.append(record(9));
        assert_eq!(log.head(), head, "nothing is written while diverged, even with on_failure continue");
    }
    // An operator reset (no committed head any more): the chain goes on.
    log.check_committed(None);
    assert!(log.admit().is_ok());
    log.append(record(4));
    assert_eq!(log.head().seq, 4);
}
