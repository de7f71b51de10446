//! Requests with several choices: OpenAI's `n`, and several prompts in one completions request. Each choice is a
//! generation of its own, all started together and routed like any request, so each is admitted, budgeted,
//! audited (the first under the request's id, choice `i` under `<id>-<i>`) and billed as its own; the request
//! metrics count the HTTP request once. Choice `i` of prompt `p` has index `p * n + i`. A complete answer is one
//! body with every choice in index order; a stream interleaves the choices' chunks as they come, each with its
//! `index`, and ends once every choice has finished, with one usage chunk totalled over them and `[DONE]`. A
//! failure of any choice fails the request (the others are cancelled).
//!
//! With a `seed`, the first answer of each prompt is the one `n` = 1 gives and the others are seeded with values
//! derived from it (reproducible, and different from each other); without one, each draws its own.

use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::response::Response;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;

use super::App;
use super::recorder::Recorder;
use super::respond::{Received, complete, json_response, sse_response};
use crate::cache::FinishInfo;
use crate::dialect::Dialect;
use crate::error::{ApiError, Failure};
use crate::gateway::{GenEvent, Generation, Meta, Prepared};

/// The seed of answer `i` of a prompt whose request gave `seed`: the seed itself for the first, a distinct value
/// derived from it for the others; `None` stays `None` (each choice then draws its own).
pub(crate) fn choice_seed(seed: Option<u64>, i: u32) -> Option<u64> {
    seed.map(|s| match i {
        0 => s,
        i => zl_common::rng::splitmix64(s ^ zl_common::rng::splitmix64(u64::from(i))),
    })
}

/// The usage of several choices, in index order with `n` answers a prompt: output counted for each, the prompt
/// once per prompt (with its first answer), the billing units summed; the stop reason is the first choice's.
fn total(finishes: &[FinishInfo], n: u32) -> FinishInfo {
    let mut t = finishes[0].clone();
    t.migrated_to.clear();
    (t.input_tokens, t.output_tokens, t.cached_input_tokens, t.billing_unit) = (0, 0, 0, 0.0);
    (t.draft_tokens, t.accepted_draft_tokens) = (0, 0);
    for (i, f) in finishes.iter().enumerate() {
        if (i as u32).is_multiple_of(n.max(1)) {
            t.input_tokens += f.input_tokens;
            t.cached_input_tokens += f.cached_input_tokens;
        }
        t.output_tokens += f.output_tokens;
        t.billing_unit += f.billing_unit;
        t.draft_tokens += f.draft_tokens;
        t.accepted_draft_tokens += f.accepted_draft_tokens;
        t.migrated_to.extend(f.migrated_to.iter().cloned());
    }
    t
}

/// An event of choice `.0`; `None` once its generation has ended.
type ChoiceEvent = (usize, Option<Result<GenEvent, ApiError>>);

/// One started choice.
struct Choice<D> {
    writer: D,
    recorder: Recorder,
    generation: Generation,
}

/// Serve a request with several choices: `prompts`, each prepared, with a writer for each of its answers.
pub(super) async fn serve<D: Dialect>(
    app: &App,
    r: &Received,
    rid: &str,
    slot: &mut Option<Recorder>,
    prompts: Vec<(Prepared, Vec<D>)>,
) -> Result<Response, Failure> {
    let n = prompts.first().map_or(1, |(_, w)| w.len() as u32);
    let Some(first) = slot.as_mut() else { return Err(ApiError::internal("request recorded twice").into()) };
    let stream = prompts.first().is_some_and(|(p, _)| p.stream);
    first.model = prompts.first().map(|(p, _)| p.model.clone()).unwrap_or_default();
    if let Some(a) = first.audit.as_mut() {
        a.draft.requested(&first.model);
    }
    // Every choice, in index order, started together under its request id; its writer, recorder and (for the
    // audit log's content) prompt kept aside.
    let content = first.audit.as_ref().is_some_and(|a| a.draft.wants_content());
    let (mut starts, mut pending) = (Vec::new(), Vec::new());
    for (prepared, writers) in prompts {
        for (i, writer) in writers.into_iter().enumerate() {
            let index = pending.len();
            let mut p = prepared.clone();
            p.sampling.seed = choice_seed(prepared.sampling.seed, i as u32);
            let id = if index == 0 { rid.to_owned() } else { format!("{rid}-{index}") };
            let recorder = if index == 0 { None } else { Some(first.choice(&id)) };
            pending.push((content.then(|| prepared.prompt.clone()), writer, recorder));
            starts.push(async move { app.gateway.start(&r.key, p, &r.opts, &id).await });
        }
    }
    let started = futures_util::future::join_all(starts).await;
    let mut ok = Vec::with_capacity(pending.len());
    let mut failure: Option<Failure> = None;
    for ((prompt, writer, recorder), outcome) in pending.into_iter().zip(started) {
        match outcome {
            Ok((meta, generation)) => ok.push((prompt, writer, recorder, meta, generation)),
            Err(f) => {
                // Its own record says why (the first choice's is the request's, recorded by the caller).
                if let Some(mut recorder) = recorder {
                    recorder.failed(&f.error);
                }
                failure.get_or_insert(f);
            }
        }
    }
    if let Some(f) = failure {
        // The choices that did start are cancelled (their generations dropped), and their records say so.
        for (_, _, recorder, _, generation) in ok {
            drop(generation);
            if let Some(mut recorder) = recorder {
                recorder.failed(&f.error);
            }
        }
        return Err(f);
    }
    let mut choices = Vec::with_capacity(ok.len());
    let mut metas: Vec<Meta> = Vec::with_capacity(ok.len());
    for (prompt, mut writer, recorder, meta, generation) in ok {
        let Some(mut recorder) = recorder.or_else(|| slot.take()) else {
            return Err(ApiError::internal("request recorded twice").into());
        };
        if let Some(a) = recorder.audit.as_mut() {
            a.draft.started(&meta, prompt);
        }
        recorder.model.clone_from(&meta.model);
        recorder.tally = Some(generation.tally());
        writer.routed(&meta);
        choices.push(Choice { writer, recorder, generation });
        metas.push(meta);
    }
    // One id and time for the whole response: the first choice's.
    let (head, rest) = choices.split_at_mut(1);
    for (i, c) in rest.iter_mut().enumerate() {
        c.writer.as_choice(i as u32 + 1, Some(&head[0].writer));
    }
    head[0].writer.as_choice(0, None);
    let meta = metas.swap_remove(0);
    let health = app.gateway.cluster().health(Instant::now());
    if stream {
        return Ok(sse_response(&meta, health, body(choices, n)));
    }
    let mut generations = Vec::with_capacity(choices.len());
    let mut parts = Vec::with_capacity(choices.len());
    for c in choices {
        generations.push(c.generation);
        parts.push((c.writer, c.recorder));
    }
    let collected = futures_util::future::join_all(generations.into_iter().map(Generation::collect)).await;
    let mut bodies = Vec::with_capacity(parts.len());
    let mut finishes = Vec::with_capacity(parts.len());
    let mut failed = None;
    for ((writer, recorder), result) in parts.iter_mut().zip(collected) {
        match result {
            Ok(got) => {
                let (body, finish) = complete(writer, Some(recorder), got);
                bodies.push(body);
                finishes.push(finish);
            }
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    if let Some(e) = failed {
        for (_, recorder) in &mut parts {
            recorder.failed(&e);
        }
        return Err(Failure::known(e, meta.rate));
    }
    let total = total(&finishes, n);
    Ok(json_response(&meta, health, D::merge(bodies, &total), &total))
}

/// A stream of every choice's events, each rendered by its writer, ending with the trailer once all have
/// finished (or with the error of the first that fails).
fn body<D: Dialect>(choices: Vec<Choice<D>>, n: u32) -> Body {
    struct S<D> {
        events: futures_util::stream::SelectAll<BoxStream<'static, ChoiceEvent>>,
        writers: Vec<D>,
        recorders: Vec<Recorder>,
        finishes: Vec<Option<FinishInfo>>,
        head: Option<String>,
        done: bool,
    }
    let head: String = choices.iter().map(|c| c.writer.stream_head()).collect();
    let mut events = futures_util::stream::SelectAll::new();
    let (mut writers, mut recorders) = (Vec::new(), Vec::new());
    for (i, c) in choices.into_iter().enumerate() {
        // Each choice's events, then one `None` when its generation ends.
        let one = futures_util::stream::unfold(Some(c.generation), move |g| async move {
            let mut g = g?;
            match g.next().await {
                Some(ev) => Some(((i, Some(ev)), Some(g))),
                None => Some(((i, None), None)),
            }
        });
        events.push(one.boxed());
        writers.push(c.writer);
        recorders.push(c.recorder);
    }
    let finishes = vec![None; writers.len()];
    let state = S { events, writers, recorders, finishes, head: Some(head), done: false };
    let stream = futures_util::stream::unfold(state, move |mut s| async move {
        if let Some(head) = s.head.take().filter(|h| !h.is_empty()) {
            return Some((Ok::<_, std::convert::Infallible>(Bytes::from(head)), s));
        }
        if s.done {
            return None;
        }
        loop {
            let (i, event) = s.events.next().await?;
            let text = match event {
                Some(Ok(GenEvent::Delta(d))) if d.is_empty() => continue,
                Some(Ok(ev)) => {
                    s.recorders[i].event(&ev);
                    let mut text = s.writers[i].render_event(&ev);
                    if let GenEvent::Finish(f) = ev {
                        s.finishes[i] = Some(f);
                        if s.finishes.iter().all(Option::is_some) {
                            s.done = true;
                            let all: Vec<FinishInfo> = s.finishes.iter().flatten().cloned().collect();
                            text += &s.writers[0].trailer(&total(&all, n));
                        }
                    }
                    text
                }
                // A generation that ended after its finish is done; one that ended without it failed.
                None if s.finishes[i].is_some() => continue,
                Some(Err(e)) => s.fail(e),
                None => s.fail(ApiError::internal("the generation ended without a finish")),
            };
            if text.is_empty() {
                continue;
            }
            return Some((Ok(Bytes::from(text)), s));
        }
    });
    impl<D: Dialect> S<D> {
        /// The stream ends with `e`; every choice's record says so (the others are cancelled).
        fn fail(&mut self, e: ApiError) -> String {
            self.done = true;
            self.events.clear();
            for r in &mut self.recorders {
                r.failed(&e);
            }
            D::render_error(&e)
        }
    }
    Body::from_stream(stream)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use zl_wire::message::StopReason;

    #[test]
    fn the_first_answer_keeps_the_seed_and_the_others_differ() {
        assert_eq!(choice_seed(Some(7), 0), Some(7));
        let seeds: Vec<_> = (0..64).map(|i| choice_seed(Some(7), i).unwrap()).collect();
        let mut unique = seeds.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), seeds.len());
        assert_eq!(choice_seed(Some(7), 3), choice_seed(Some(7), 3));
        assert_eq!(choice_seed(None, 3), None);
    }

    #[test]
    fn usage_counts_each_prompt_once_and_every_answer() {
        let f = |input, output| FinishInfo {
            stop_reason: StopReason::EndTurn,
            stop_sequence: None,
            input_tokens: input,
            output_tokens: output,
            cached_input_tokens: input / 2,
            billing_unit: 1.0,
            draft_tokens: 0,
            accepted_draft_tokens: 0,
            migrated_to: vec![],
        };
        // Two prompts (10 and 20 tokens), two answers each.
        let t = total(&[f(10, 1), f(10, 2), f(20, 3), f(20, 4)], 2);
        assert_eq!((t.input_tokens, t.cached_input_tokens, t.output_tokens, t.billing_unit), (30, 15, 10, 4.0));
    }
}
