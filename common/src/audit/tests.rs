use super::*;

fn record(seq: u64, prev: &str) -> AuditRecord {
    AuditRecord {
        seq,
        prev: prev.to_owned(),
        request_id: format!("req_{seq}"),
        frontend: "fe-1".into(),
        status: 200,
        ..AuditRecord::default()
    }
}

/// A chain of `n` records as lines.
fn chain(n: u64) -> Vec<(String, String)> {
    let mut prev = GENESIS.to_owned();
    (1..=n)
        .map(|seq| {
            let (line, hash) = encode_line(&record(seq, &prev));
            prev = hash.clone();
            (line, hash)
        })
        .collect()
}

fn verify(lines: &[String], head: Option<ChainHead>) -> Result<Summary, Broken> {
    let mut v = Verifier::new(head, false);
    for (i, l) in lines.iter().enumerate() {
        v.push("seg", i + 1, l.as_bytes())?;
    }
    v.finish()
}

#[test]
fn an_intact_chain_verifies_up_to_its_committed_head() {
    let c = chain(5);
    let lines: Vec<String> = c.iter().map(|(l, _)| l.clone()).collect();
    let s = verify(&lines, Some(ChainHead { seq: 4, hash: c[3].1.clone() })).unwrap();
    assert_eq!((s.records, s.first_seq, s.head.seq), (5, 1, 5));
    assert_eq!(s.frontend, "fe-1");
}

#[test]
fn a_changed_byte_a_removed_record_and_truncation_are_each_named() {
    let c = chain(5);
    let lines: Vec<String> = c.iter().map(|(l, _)| l.clone()).collect();
    let mut edited = lines.clone();
    edited[2] = edited[2].replacen("\"status\":200", "\"status\":201", 1);
    let e = verify(&edited, None).unwrap_err();
    assert_eq!((e.line, e.seq), (3, 3));
    assert!(e.problem.contains("hash mismatch"), "{e}");

    let mut removed = lines.clone();
    removed.remove(1);
    let e = verify(&removed, None).unwrap_err();
    assert_eq!(e.seq, 2);
    assert!(e.problem.contains("missing"), "{e}");

    let head = ChainHead { seq: 5, hash: c[4].1.clone() };
    let e = verify(&lines[..3], Some(head.clone())).unwrap_err();
    assert!(e.problem.contains("truncated"), "{e}");
    // A torn last line is caught even without a head.
    let mut torn = lines.clone();
    torn[4].pop();
    assert!(verify(&torn, None).unwrap_err().problem.contains("incomplete"));
    // A rewritten history with a different head hash is caught at the committed record.
    let mut forged = chain(5);
    forged[3].1 = "0".repeat(64);
    assert!(
        verify(&lines, Some(ChainHead { seq: 4, hash: forged[3].1.clone() }))
            .unwrap_err()
            .problem
            .contains("committed")
    );
}

#[test]
fn a_pruned_chain_needs_consent() {
    let c = chain(4);
    let tail: Vec<String> = c[2..].iter().map(|(l, _)| l.clone()).collect();
    assert!(verify(&tail, None).unwrap_err().problem.contains("older records are missing"));
    let mut v = Verifier::new(Some(ChainHead { seq: 1, hash: c[0].1.clone() }), true);
    for (i, l) in tail.iter().enumerate() {
        v.push("seg", i + 1, l.as_bytes()).unwrap();
    }
    assert_eq!(v.finish().unwrap().first_seq, 3);
}

#[test]
fn payloads_open_only_with_their_key_and_request() {
    let p = Payload { input: "hello".into(), output: "world".into() };
    let k = [7u8; 32];
    let sealed = seal(&p, "dk_1", &k, [1; 12], "req_1").unwrap();
    assert!(!sealed.ciphertext.contains(&hex_of("hello")));
    assert_eq!(open(&sealed, &k, "req_1").unwrap(), p);
    assert_eq!(open(&sealed, &[8u8; 32], "req_1"), Err(SealError::Open));
    assert_eq!(open(&sealed, &k, "req_2"), Err(SealError::Open), "bound to its record");
    assert_eq!(seal(&p, "dk_1", &[0; 5], [1; 12], "r"), Err(SealError::BadKey));
}

fn hex_of(s: &str) -> String {
    crate::keys::hex(s.as_bytes())
}
