//! Stored Responses API responses, replicated with the routing state: per project, bounded in count and bytes,
//! and all projects together in bytes, each kept until its expiry. The whole store travels in the state's Raft
//! snapshots (one message of at most 16 MiB), so sizes are counted as a snapshot writes them (the record as a JSON
//! string, escapes included) and the total bound keeps it well inside that. Pure: every decision (what expires,
//! what is evicted) reads the time and bounds the proposing orchestrator put in the command, so every replica
//! applies it alike.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One stored response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    /// When it was made, Unix seconds.
    pub created_at: u64,
    /// When it is forgotten, Unix ms.
    pub expires_ms: u64,
    /// Its record (JSON, as the frontend wrote it).
    pub body: String,
}

/// The store's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bounds {
    /// Responses a project keeps at most.
    pub count: u32,
    /// Bytes of records a project keeps at most.
    pub bytes: u64,
    /// Bytes of records every project together keeps at most.
    pub total: u64,
}

/// A record's size as a snapshot holds it: a JSON string, quotes and escapes included.
fn size(body: &str) -> u64 {
    serde_json::to_string(body).map_or(body.len(), |s| s.len()) as u64
}

/// One project's responses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Project {
    by_id: BTreeMap<String, Stored>,
    bytes: u64,
}

impl Project {
    fn remove(&mut self, id: &str) -> bool {
        match self.by_id.remove(id) {
            Some(s) => {
                self.bytes -= size(&s.body);
                true
            }
            None => false,
        }
    }
}

/// Every project's stored responses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Responses {
    projects: BTreeMap<String, Project>,
}

impl Responses {
    /// Store `stored` as `project`'s `id` at `now_ms`: first its expired responses go, then its oldest until the
    /// new one fits the project's bounds, then the oldest of any project until it fits the total. A record larger
    /// than a project's whole byte bound is refused.
    pub fn put(&mut self, project: &str, id: &str, stored: Stored, bounds: Bounds, now_ms: u64) -> Result<(), String> {
        let size = size(&stored.body);
        let room = bounds.bytes.min(bounds.total);
        if size > room || bounds.count == 0 {
            return Err(format!("a {size}-byte response does not fit the {room}-byte store of a project"));
        }
        let p = self.projects.entry(project.to_owned()).or_default();
        p.remove(id);
        let expired: Vec<String> =
            p.by_id.iter().filter(|(_, s)| s.expires_ms <= now_ms).map(|(id, _)| id.clone()).collect();
        for id in expired {
            p.remove(&id);
        }
        while p.by_id.len() >= bounds.count as usize || p.bytes + size > bounds.bytes {
            // The oldest (then the smallest id, so every replica picks the same one).
            let Some(oldest) =
                p.by_id.iter().min_by_key(|(id, s)| (s.created_at, (*id).clone())).map(|(id, _)| id.clone())
            else {
                break;
            };
            p.remove(&oldest);
        }
        p.bytes += size;
        p.by_id.insert(id.to_owned(), stored);
        while self.totals().1 > bounds.total {
            // The oldest of any project (ties by project, then id).
            let oldest = self
                .projects
                .iter()
                .flat_map(|(name, p)| p.by_id.iter().map(move |(id, s)| (s.created_at, name.clone(), id.clone())))
                .filter(|(_, name, other)| !(name == project && other == id))
                .min();
            let Some((_, name, other)) = oldest else { break };
            self.delete(&name, &other, now_ms);
        }
        Ok(())
    }

    /// `project`'s live response `id` at `now_ms`.
    pub fn get(&self, project: &str, id: &str, now_ms: u64) -> Option<&Stored> {
        self.projects.get(project)?.by_id.get(id).filter(|s| s.expires_ms > now_ms)
    }

    /// Forget `project`'s response `id`; whether it held a live one at `now_ms`.
    pub fn delete(&mut self, project: &str, id: &str, now_ms: u64) -> bool {
        let live = self.get(project, id, now_ms).is_some();
        if let Some(p) = self.projects.get_mut(project) {
            p.remove(id);
            if p.by_id.is_empty() {
                self.projects.remove(project);
            }
        }
        live
    }

    /// Responses and bytes held over every project (expired ones not yet evicted included).
    pub fn totals(&self) -> (usize, u64) {
        self.projects.values().fold((0, 0), |(n, b), p| (n + p.by_id.len(), b + p.bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(created_at: u64, expires_ms: u64, bytes: usize) -> Stored {
        // Two bytes of quotes around the text: `bytes` in all, as a snapshot holds it.
        Stored { created_at, expires_ms, body: "x".repeat(bytes - 2) }
    }

    const BOUNDS: Bounds = Bounds { count: 3, bytes: 102, total: 1_000 };

    #[test]
    fn projects_are_apart_and_expired_responses_are_gone() {
        let mut r = Responses::default();
        r.put("a", "resp_1", stored(1, 5_000, 10), BOUNDS, 1_000).unwrap();
        assert!(r.get("a", "resp_1", 2_000).is_some());
        assert!(r.get("b", "resp_1", 2_000).is_none(), "another project's id is not found");
        assert!(r.get("a", "resp_1", 5_000).is_none(), "expired");
        assert!(!r.delete("b", "resp_1", 2_000));
        assert!(r.delete("a", "resp_1", 2_000));
        assert!(r.get("a", "resp_1", 2_000).is_none());
        assert_eq!(r.totals(), (0, 0));
    }

    #[test]
    fn the_oldest_go_first_when_a_project_is_full_and_expired_ones_before_them() {
        let mut r = Responses::default();
        for (i, created) in [(1, 10), (2, 20), (3, 30)] {
            r.put("a", &format!("resp_{i}"), stored(created, 100_000, 10), BOUNDS, 1_000).unwrap();
        }
        r.put("a", "resp_4", stored(40, 100_000, 10), BOUNDS, 1_000).unwrap();
        assert!(r.get("a", "resp_1", 1_000).is_none(), "the oldest was evicted");
        assert!(r.get("a", "resp_2", 1_000).is_some() && r.get("a", "resp_4", 1_000).is_some());
        // By count, then by bytes: a 75-byte record evicts one (the count), a 20-byte one two (the bytes too).
        r.put("a", "resp_5", stored(50, 100_000, 75), BOUNDS, 1_000).unwrap();
        assert_eq!(r.totals(), (3, 95));
        r.put("a", "resp_6", stored(60, 100_000, 20), BOUNDS, 1_000).unwrap();
        assert_eq!(r.totals(), (2, 95));
        assert!(r.get("a", "resp_5", 1_000).is_some() && r.get("a", "resp_4", 1_000).is_none());
        // Expired ones go before live ones, however old.
        r.put("b", "resp_old", stored(1, 100_000, 10), BOUNDS, 1_000).unwrap();
        r.put("b", "resp_gone", stored(99, 2_000, 10), BOUNDS, 1_000).unwrap();
        r.put("b", "resp_x", stored(100, 100_000, 10), BOUNDS, 1_000).unwrap();
        r.put("b", "resp_y", stored(101, 100_000, 10), BOUNDS, 3_000).unwrap();
        assert!(r.get("b", "resp_old", 3_000).is_some());
        assert!(r.put("b", "resp_big", stored(1, 100_000, 103), BOUNDS, 3_000).is_err());
    }

    #[test]
    fn the_total_bound_evicts_the_oldest_of_any_project_and_sizes_count_escapes() {
        let mut r = Responses::default();
        let bounds = Bounds { count: 10, bytes: 50, total: 60 };
        r.put("a", "resp_1", stored(1, 100_000, 30), bounds, 0).unwrap();
        r.put("b", "resp_2", stored(2, 100_000, 20), bounds, 0).unwrap();
        r.put("b", "resp_3", stored(3, 100_000, 20), bounds, 0).unwrap();
        assert!(r.get("a", "resp_1", 0).is_none(), "another project's oldest made room");
        assert_eq!(r.totals(), (2, 40));
        // A quote is two bytes in a snapshot.
        let quoted = Stored { created_at: 4, expires_ms: 100_000, body: "\"".repeat(10) };
        r.put("c", "resp_4", quoted, bounds, 0).unwrap();
        assert_eq!(r.totals(), (2, 42), "22 bytes stored, the oldest (20) evicted");
    }
}
