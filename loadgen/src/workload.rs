//! What a benchmark asks: seeded, reproducible sessions of one or more turns. Sans-IO: a [`Workload`] maps a session
//! number to its [`Session`] the same way on any machine, so a run can be repeated exactly and two endpoints can be
//! given the very same requests.
//!
//! Lengths are counted in words from a list of very common English words, each of which is a single token in the
//! usual BPE vocabularies (GPT-2's, Llama's, SmolLM's); the server's own token counts (its `usage`) are what the
//! figures use.

use anyhow::{Context, Result, bail};
use zl_common::rng::SplitMix;

/// Words that are one token each (with their leading space) in common BPE vocabularies.
const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "time",
    "people",
    "year",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "name",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
    "good",
    "new",
    "first",
    "last",
    "long",
    "great",
    "little",
    "own",
    "other",
    "old",
    "big",
    "high",
    "different",
    "small",
    "large",
    "next",
    "early",
    "young",
    "important",
    "few",
    "public",
    "bad",
    "same",
    "able",
    "make",
    "know",
    "take",
    "see",
    "come",
    "think",
    "look",
    "want",
    "give",
    "use",
    "find",
    "tell",
    "ask",
    "seem",
    "feel",
    "try",
    "leave",
    "call",
    "river",
    "light",
    "music",
    "market",
    "table",
    "paper",
    "garden",
];

/// Openings for generated questions, so each reads as something to answer.
const ASKS: &[&str] = &[
    "Explain in detail",
    "Write a short story about",
    "Summarize what you know about",
    "Describe",
    "List some facts about",
    "Tell me about",
];

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Turn {
    /// `user` or `assistant`.
    pub role: String,
    /// Its text.
    pub content: String,
}

/// A conversation to hold with the endpoint: its user turns are sent one after another, each with the whole
/// history (the endpoint's real answers included), so the prompt grows turn by turn.
#[derive(Clone, Debug, PartialEq)]
pub struct Session {
    /// Session number.
    pub id: u64,
    /// A system prompt (the shared document of a shared-prefix group).
    pub system: Option<String>,
    /// Messages given before the first request (a JSONL request's own history).
    pub history: Vec<Turn>,
    /// The user turns, in order; each is one request.
    pub user_turns: Vec<String>,
    /// `max_tokens` of each request.
    pub max_tokens: u32,
    /// The shared-prefix group, where there is one.
    pub group: Option<u32>,
    /// When it arrives, in seconds from the start (a trace's line).
    pub arrival_s: Option<f64>,
    /// The model its requests name, when not the run's (a shared-prefix group's own: a tenant's LoRA adapter).
    pub model: Option<String>,
}

/// A length distribution: a normal around `mean` with `std_dev`, clamped to `[1, 8 * mean + 1]`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Length {
    /// Mean.
    pub mean: u32,
    /// Standard deviation (0: always the mean).
    pub std_dev: u32,
}

impl Length {
    /// Parse `MEAN` or `MEAN:STDDEV`.
    pub fn parse(s: &str) -> Result<Length> {
        let (mean, std_dev) = s.split_once(':').unwrap_or((s, "0"));
        let mean: u32 = mean.trim().parse().with_context(|| format!("{s:?}: expected MEAN or MEAN:STDDEV"))?;
        let std_dev: u32 = std_dev.trim().parse().with_context(|| format!("{s:?}: expected MEAN or MEAN:STDDEV"))?;
        if mean == 0 {
            bail!("{s:?}: the mean length must be at least 1");
        }
        Ok(Length { mean, std_dev })
    }

    /// One draw.
    pub fn sample(&self, rng: &mut SplitMix) -> u32 {
        if self.std_dev == 0 {
            return self.mean;
        }
        let x = rng.normal(f64::from(self.mean), f64::from(self.std_dev)).round();
        x.clamp(1.0, 8.0 * f64::from(self.mean) + 1.0) as u32
    }
}

/// The kinds of workload.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// Independent single-turn requests.
    Synthetic,
    /// `groups` long system prompts of `prefix` words, each shared by many single-turn requests (documents or
    /// tenants' system prompts): what prefix-aware routing is for.
    SharedPrefix {
        /// Number of groups.
        groups: u32,
        /// Length of each group's shared prefix.
        prefix: Length,
        /// Zipf exponent of the groups' popularity (0: all alike; 1: the first twice as busy as the second).
        zipf: f64,
        /// Each group's requests name model `models` followed by the group's number (tenants each with their own
        /// fine-tune, a LoRA adapter over the served base); none: the run's model.
        models: Option<String>,
    },
    /// Conversations of `turns` user turns whose history grows.
    MultiTurn {
        /// User turns per conversation.
        turns: u32,
    },
    /// Requests from a JSONL file, cycled through in order (a trace's with its arrival times).
    File(Vec<Session>),
}

/// A seeded workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// Its kind.
    pub kind: Kind,
    /// Words in each user turn (generated kinds).
    pub input: Length,
    /// `max_tokens` of each request (generated kinds; a JSONL line may set its own).
    pub output: Length,
    /// The seed.
    pub seed: u64,
}

/// `n` words, one token each, drawn from `rng`.
pub(crate) fn words(rng: &mut SplitMix, n: u32) -> String {
    let mut out = String::with_capacity(n as usize * 6);
    for i in 0..n {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
    }
    out
}

/// Ranks `0..n` drawn with probability proportional to `1 / (rank + 1)^s`.
#[derive(Clone, Debug)]
pub(crate) struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub(crate) fn new(n: u32, s: f64) -> Zipf {
        let mut total = 0.0;
        let mut cdf: Vec<f64> = (0..n.max(1))
            .map(|k| {
                total += (f64::from(k) + 1.0).powf(-s);
                total
            })
            .collect();
        cdf.iter_mut().for_each(|c| *c /= total);
        Zipf { cdf }
    }

    pub(crate) fn sample(&self, rng: &mut SplitMix) -> u32 {
        let u = rng.uniform();
        self.cdf.partition_point(|&c| c <= u).min(self.cdf.len() - 1) as u32
    }
}

fn question(rng: &mut SplitMix, n: u32) -> String {
    let ask = ASKS[rng.below(ASKS.len() as u64) as usize];
    format!("{ask} {}.", words(rng, n.saturating_sub(ask.split(' ').count() as u32).max(1)))
}

impl Workload {
    /// Session number `id`: the same for the same seed, whatever was drawn before.
    pub fn session(&self, id: u64) -> Session {
        let mut rng = SplitMix::for_item(self.seed, id);
        let max_tokens = self.output.sample(&mut rng);
        let mut session = Session {
            id,
            system: None,
            history: vec![],
            user_turns: vec![],
            max_tokens,
            group: None,
            arrival_s: None,
            model: None,
        };
        match &self.kind {
            Kind::Synthetic => {
                let n = self.input.sample(&mut rng);
                session.user_turns.push(question(&mut rng, n));
            }
            Kind::SharedPrefix { groups, prefix, zipf, models } => {
                let group = if *zipf == 0.0 {
                    rng.below(u64::from(*groups)) as u32
                } else {
                    Zipf::new(*groups, *zipf).sample(&mut rng)
                };
                // The document depends on the seed and the group only: every session of a group shares it.
                let mut doc_rng = SplitMix::for_item(self.seed ^ 0x5348_4152_4544, u64::from(group));
                let len = prefix.sample(&mut doc_rng);
                session.system = Some(format!(
                    "You answer questions about document {group}. Document {group}: {}",
                    words(&mut doc_rng, len)
                ));
                session.group = Some(group);
                session.model = models.as_ref().map(|m| format!("{m}{group}"));
                let n = self.input.sample(&mut rng);
                session.user_turns.push(question(&mut rng, n));
            }
            Kind::MultiTurn { turns } => {
                for _ in 0..*turns {
                    let n = self.input.sample(&mut rng);
                    session.user_turns.push(question(&mut rng, n));
                }
            }
            Kind::File(sessions) => {
                let s = &sessions[(id % sessions.len() as u64) as usize];
                session = Session { id, arrival_s: self.arrival(id), ..s.clone() };
                if s.max_tokens == 0 {
                    session.max_tokens = max_tokens;
                }
            }
        }
        session
    }

    /// When session `id` arrives, for a trace (a file whose lines have arrival times): its line's time, each pass
    /// through the file after the first starting one mean gap after the last line.
    pub fn arrival(&self, id: u64) -> Option<f64> {
        let Kind::File(sessions) = &self.kind else { return None };
        let n = sessions.len() as u64;
        let last = sessions.last()?.arrival_s?;
        let at = sessions[(id % n) as usize].arrival_s?;
        Some((id / n) as f64 * (last + last / n as f64) + at)
    }

    /// Requests per session.
    pub fn turns(&self) -> u32 {
        match &self.kind {
            Kind::MultiTurn { turns } => *turns,
            _ => 1,
        }
    }

    /// A one-line description, for reports.
    pub fn describe(&self) -> String {
        let io = format!(
            "input {}±{} words, max_tokens {}±{}",
            self.input.mean, self.input.std_dev, self.output.mean, self.output.std_dev
        );
        match &self.kind {
            Kind::Synthetic => format!("synthetic: {io}, seed {}", self.seed),
            Kind::SharedPrefix { groups, prefix, zipf, models } => format!(
                "shared-prefix: {groups} groups{} with {}±{}-word prefixes{}, {io}, seed {}",
                if *zipf == 0.0 { String::new() } else { format!(" (Zipf {zipf})") },
                prefix.mean,
                prefix.std_dev,
                models.as_ref().map_or(String::new(), |m| format!(", each group on model {m}N")),
                self.seed
            ),
            Kind::MultiTurn { turns } => {
                format!("multi-turn: {turns} turns per conversation, {io}, seed {}", self.seed)
            }
            Kind::File(s) if s.iter().all(|s| s.arrival_s.is_some()) => {
                format!("trace: {} requests, arrivals replayed", s.len())
            }
            Kind::File(s) => format!("file: {} requests, cycled", s.len()),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn wl(kind: Kind) -> Workload {
        Workload { kind, input: Length { mean: 20, std_dev: 5 }, output: Length { mean: 32, std_dev: 0 }, seed: 7 }
    }

    #[test]
    fn sessions_are_reproducible_and_independent_of_order() {
        let w = wl(Kind::Synthetic);
        let a: Vec<_> = (0..20).map(|i| w.session(i)).collect();
        let b: Vec<_> = (0..20).rev().map(|i| w.session(i)).collect();
        assert_eq!(a, b.into_iter().rev().collect::<Vec<_>>());
        assert_ne!(a[0].user_turns, a[1].user_turns);
        assert!(a.iter().all(|s| s.max_tokens == 32 && s.user_turns.len() == 1));
        let other = Workload { seed: 8, ..w };
        assert_ne!(other.session(0), a[0]);
    }

    #[test]
    fn shared_prefix_groups_share_their_document() {
        let w = wl(Kind::SharedPrefix { groups: 3, prefix: Length { mean: 200, std_dev: 0 }, zipf: 0.0, models: None });
        let sessions: Vec<_> = (0..60).map(|i| w.session(i)).collect();
        assert!(sessions.iter().all(|s| s.model.is_none()));
        // With a model per group: the same sessions, each naming its group's model.
        let per_group = Workload {
            kind: Kind::SharedPrefix {
                groups: 3,
                prefix: Length { mean: 200, std_dev: 0 },
                zipf: 0.0,
                models: Some("tenant-".into()),
            },
            ..w.clone()
        };
        for s in &sessions {
            let t = per_group.session(s.id);
            assert_eq!(t.model, Some(format!("tenant-{}", s.group.unwrap())));
            assert_eq!(Session { model: None, ..t }, *s);
        }
        for g in 0..3 {
            let docs: Vec<_> = sessions.iter().filter(|s| s.group == Some(g)).map(|s| s.system.clone()).collect();
            assert!(docs.len() > 5, "group {g} drawn {} times", docs.len());
            assert!(docs.iter().all(|d| d == &docs[0]));
            // "You answer questions about document G. Document G:" and 200 words.
            assert_eq!(docs[0].as_ref().unwrap().split(' ').count(), 8 + 200);
        }
        assert_ne!(
            sessions.iter().find(|s| s.group == Some(0)).unwrap().system,
            sessions.iter().find(|s| s.group == Some(1)).unwrap().system
        );
    }

    #[test]
    fn lengths_follow_the_distribution() {
        let l = Length::parse("100:20").unwrap();
        let mut rng = SplitMix::new(1);
        let draws: Vec<u32> = (0..10_000).map(|_| l.sample(&mut rng)).collect();
        let mean = draws.iter().map(|&x| f64::from(x)).sum::<f64>() / 10_000.0;
        assert!((mean - 100.0).abs() < 1.0, "{mean}");
        assert!(draws.iter().all(|&x| (1..=801).contains(&x)));
        assert_eq!(Length::parse("5").unwrap(), Length { mean: 5, std_dev: 0 });
        assert!(Length::parse("0").is_err() && Length::parse("x:1").is_err());
        let q = question(&mut rng, 12);
        assert_eq!(q.split(' ').count(), 12, "{q}");
    }

    #[test]
    fn multi_turn_sessions() {
        let w = wl(Kind::MultiTurn { turns: 4 });
        assert_eq!(w.session(3).user_turns.len(), 4);
        assert_eq!(w.turns(), 4);
    }

    #[test]
    fn zipf_popularity() {
        let z = Zipf::new(4, 1.0);
        let mut rng = SplitMix::new(3);
        let mut n = [0u32; 4];
        (0..25_000).for_each(|_| n[z.sample(&mut rng) as usize] += 1);
        // 1 : 1/2 : 1/3 : 1/4 of 25/12.
        let expect = [12_000.0, 6_000.0, 4_000.0, 3_000.0];
        for (got, want) in n.iter().zip(expect) {
            assert!((f64::from(*got) / want - 1.0).abs() < 0.05, "{n:?}");
        }
        let w = wl(Kind::SharedPrefix { groups: 4, prefix: Length { mean: 5, std_dev: 0 }, zipf: 1.0, models: None });
        let zeros = (0..2000).filter(|&i| w.session(i).group == Some(0)).count();
        assert!((860..1060).contains(&zeros), "{zeros}");
    }
}
