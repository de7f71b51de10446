//! What a generation request leaves behind: its request metrics (status and duration, once) and its audit record,
//! both written when its [`Recorder`] is dropped (for a stream: when its body ends or the client leaves).

use std::sync::Arc;
use std::time::Instant;

use zl_common::billing::BillingWeights;

use super::App;
use crate::audit::{AuditLog, Draft};
use crate::error::ApiError;
use crate::gateway::{GenEvent, Tally};

fn record(api: &'static str, model: &str, status: u16, started: Instant) {
    let status = status.to_string();
    metrics::counter!("zl_frontend_requests_total", "api" => api, "model" => model.to_owned(), "status" => status.clone())
        .increment(1);
    metrics::histogram!("zl_frontend_request_duration_seconds", "api" => api, "model" => model.to_owned(), "status" => status)
        .record(started.elapsed().as_secs_f64());
}

/// Records a request's status and duration, and appends its audit record, when dropped (for streams: when the
/// body ends or the client leaves).
pub(super) struct Recorder {
    api: &'static str,
    pub(super) model: String,
    pub(super) status: u16,
    started: Instant,
    pub(super) audit: Option<Audit>,
    /// Where the generation leaves what it delivered if it ends without a finish.
    pub(super) tally: Option<Tally>,
    /// Counts the request in the request metrics (another choice of a request is counted with its first).
    metrics: bool,
}

/// A request's audit record in the making, and the log it goes to.
pub(super) struct Audit {
    log: Arc<AuditLog>,
    pub(super) draft: Draft,
    weights: BillingWeights,
}

impl Recorder {
    pub(super) fn new(app: &App, api: &'static str, started: Instant, audit: Option<Draft>) -> Self {
        let audit = match (&app.audit, audit) {
            (Some(log), Some(draft)) => {
                Some(Audit { log: log.clone(), draft, weights: app.gateway.cluster().billing_weights() })
            }
            _ => None,
        };
        Recorder { api, model: "-".into(), status: 200, started, audit, tally: None, metrics: true }
    }

    /// The recorder of another choice of this request (OpenAI's `n`, several prompts): its own audit record,
    /// under `request_id`; the request metrics count the request once, with its first choice.
    pub(super) fn choice(&self, request_id: &str) -> Self {
        let audit = self.audit.as_ref().map(|a| Audit {
            log: a.log.clone(),
            draft: a.draft.choice(request_id),
            weights: a.weights,
        });
        Recorder {
            api: self.api,
            model: self.model.clone(),
            status: 200,
            started: self.started,
            audit,
            tally: None,
            metrics: false,
        }
    }

    pub(super) fn event(&mut self, ev: &GenEvent) {
        if let Some(a) = self.audit.as_mut() {
            a.draft.event(ev);
        }
    }

    pub(super) fn failed(&mut self, e: &ApiError) {
        self.status = e.kind.status().as_u16();
        if let Some(a) = self.audit.as_mut() {
            a.draft.failed(e);
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if self.metrics {
            record(self.api, &self.model, self.status, self.started);
        }
        if let Some(mut a) = self.audit.take() {
            // The generation (dropped before its recorder) left what it delivered if it ended without a finish.
            if let Some(delivered) = self.tally.take().and_then(|t| t.take()) {
                a.draft.delivered(&delivered);
            }
            a.draft.finish(&a.log, self.status, &a.weights);
        }
    }
}
