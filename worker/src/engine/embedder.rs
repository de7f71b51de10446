//! The engine of an embedding model: one OS thread owns the model and embeds queued inputs in batches, first come
//! first served, up to [`BATCH_TOKENS`] tokens a pass (a longer input runs alone). Callers talk to it through the
//! same [`EngineHandle`] as a generative engine's (its figures reach the orchestrators the same way); a
//! generation asked of it is refused.
//!
//! A caller that goes away (its request dropped) is noticed before the next pass, and its inputs not yet computed
//! are dropped.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

use zl_common::sync::lock;

use super::actor::{Command, EngineHandle, Published};
use super::state::{EngineStats, RequestError};
use crate::model::embed::EmbeddingModel;

/// Tokens one pass embeds at most (inputs are never split: a longer one runs alone).
pub const BATCH_TOKENS: usize = 4096;

/// Inputs one pass embeds at most.
pub const BATCH_INPUTS: usize = 256;

type Reply = tokio::sync::oneshot::Sender<Result<Vec<Vec<f32>>, RequestError>>;

/// One request's inputs and the vectors computed so far.
struct Job {
    inputs: Vec<Vec<u32>>,
    vectors: Vec<Vec<f32>>,
    reply: Reply,
}

/// Start the engine thread of an embedding model, with a name for diagnostics.
pub fn spawn(model: EmbeddingModel, name: &str) -> std::io::Result<EngineHandle> {
    let (tx, rx) = mpsc::channel();
    let published = Arc::new(Mutex::new(Published::default()));
    let (pub2, label) = (published.clone(), name.to_owned());
    std::thread::Builder::new().name(format!("embed-{name}")).spawn(move || run(model, rx, pub2, &label))?;
    Ok(EngineHandle::from_parts(tx, published))
}

/// Check an embed request's inputs against the model: each 1 to `context` tokens, of the vocabulary.
fn admit(inputs: &[Vec<u32>], context: usize) -> Result<(), RequestError> {
    match inputs.iter().position(|i| i.is_empty() || i.len() > context) {
        Some(index) => Err(RequestError::InputLength { index, tokens: inputs[index].len(), context }),
        None => Ok(()),
    }
}

/// The next pass: `(job, input)` pairs from the front of the queue, in order, within the batch bounds (at least
/// one).
fn next_batch(queue: &VecDeque<Job>) -> Vec<(usize, usize)> {
    let mut batch = Vec::new();
    let mut tokens = 0;
    for (j, job) in queue.iter().enumerate() {
        for i in job.vectors.len()..job.inputs.len() {
            let len = job.inputs[i].len();
            if !batch.is_empty() && (tokens + len > BATCH_TOKENS || batch.len() == BATCH_INPUTS) {
                return batch;
            }
            tokens += len;
            batch.push((j, i));
        }
    }
    batch
}

fn run(mut model: EmbeddingModel, rx: mpsc::Receiver<Command>, published: Arc<Mutex<Published>>, name: &str) {
    let labels = [("model", name.to_owned())];
    let mut queue: VecDeque<Job> = VecDeque::new();
    let mut embedded_tokens = 0u64;
    loop {
        let first = if queue.is_empty() {
            match rx.recv() {
                Ok(cmd) => Some(cmd),
                Err(_) => return,
            }
        } else {
            None
        };
        for cmd in first.into_iter().chain(rx.try_iter()) {
            match cmd {
                Command::Embed { inputs, reply } => match admit(&inputs, model.context_length) {
                    Ok(()) => queue.push_back(Job { vectors: Vec::with_capacity(inputs.len()), inputs, reply }),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                },
                Command::Generate { accepted, .. } => {
                    let _ = accepted.send(Err(RequestError::NotGenerative));
                }
                Command::Cancel(_) | Command::Resync => {}
            }
        }
        // Callers that went away: their remaining inputs are not computed.
        let before = queue.len();
        queue.retain(|job| !job.reply.is_closed());
        if queue.len() < before {
            metrics::counter!("zl_worker_cancelled_total", &labels).increment((before - queue.len()) as u64);
        }
        let batch = next_batch(&queue);
        let waiting: usize = queue.iter().map(|j| j.inputs.len() - j.vectors.len()).sum::<usize>() - batch.len();
        publish(&published, waiting, batch.len(), embedded_tokens);
        if batch.is_empty() {
            continue;
        }
        let refs: Vec<&[u32]> = batch.iter().map(|&(j, i)| &queue[j].inputs[i][..]).collect();
        let tokens: usize = refs.iter().map(|r| r.len()).sum();
        let started = Instant::now();
        let vectors = model.embed(&refs);
        metrics::histogram!("zl_worker_embed_pass_seconds", &labels).record(started.elapsed().as_secs_f64());
        metrics::counter!("zl_worker_embedded_inputs_total", &labels).increment(batch.len() as u64);
        metrics::counter!("zl_worker_embedded_tokens_total", &labels).increment(tokens as u64);
        embedded_tokens += tokens as u64;
        for (&(j, _), v) in batch.iter().zip(vectors) {
            queue[j].vectors.push(v);
        }
        // Finished jobs are at the front (inputs are taken in queue order).
        while queue.front().is_some_and(|j| j.vectors.len() == j.inputs.len()) {
            let Some(job) = queue.pop_front() else { break };
            let _ = job.reply.send(Ok(job.vectors));
        }
        let waiting: usize = queue.iter().map(|j| j.inputs.len() - j.vectors.len()).sum();
        publish(&published, waiting, 0, embedded_tokens);
    }
}

/// Publish the engine's figures: inputs waiting and in the pass now, tokens embedded so far.
fn publish(published: &Mutex<Published>, waiting: usize, running: usize, tokens: u64) {
    let mut p = lock(published);
    p.stats = EngineStats { waiting, running, prefill_tokens: tokens, ..EngineStats::default() };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(lens: &[usize]) -> Job {
        let (reply, _) = tokio::sync::oneshot::channel();
        Job { inputs: lens.iter().map(|&n| vec![1; n]).collect(), vectors: Vec::new(), reply }
    }

    #[test]
    fn passes_take_inputs_in_order_within_the_token_bound_and_a_long_one_alone() {
        let queue: VecDeque<Job> = [job(&[1000, 1000]), job(&[2000, 500])].into_iter().collect();
        assert_eq!(next_batch(&queue), [(0, 0), (0, 1), (1, 0)]);
        let long: VecDeque<Job> = [job(&[9000, 10])].into_iter().collect();
        assert_eq!(next_batch(&long), [(0, 0)]);
        let many: VecDeque<Job> = [job(&[1; 300])].into_iter().collect();
        assert_eq!(next_batch(&many).len(), BATCH_INPUTS);
        assert!(next_batch(&VecDeque::new()).is_empty());
    }

    #[test]
    fn empty_and_overlong_inputs_are_refused_by_index() {
        assert!(admit(&[vec![1; 4], vec![1; 8]], 8).is_ok());
        let e = admit(&[vec![1; 4], vec![1; 9]], 8).unwrap_err();
        assert_eq!(e.to_string(), "input 1 has 9 tokens; the model embeds 1 to 8 tokens per input");
        assert!(matches!(admit(&[vec![]], 8), Err(RequestError::InputLength { index: 0, tokens: 0, .. })));
    }
}
