//! Route request and route decision: the frontend asks an orchestrator where to run a request.
//!
//! Owned, checked values and their FlatBuffers conversion; no routing logic lives here.

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use super::adapters::AdapterRef;
use super::check::{self, invalid};
use super::control::{ComputePool, NodeId};
use super::{MessageError, fb};

/// A client's pool preference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum RouteHint {
    /// No preference: the predicted cost decides.
    #[default]
    None,
    /// Fastest pool with capacity.
    LowLatency,
    /// Cheapest pool with capacity.
    LowCost,
}

impl RouteHint {
    fn to_wire(self) -> fb::RouteHint {
        match self {
            RouteHint::None => fb::RouteHint::None,
            RouteHint::LowLatency => fb::RouteHint::LowLatency,
            RouteHint::LowCost => fb::RouteHint::LowCost,
        }
    }

    fn from_wire(hint: fb::RouteHint) -> Result<RouteHint, MessageError> {
        match hint {
            fb::RouteHint::None => Ok(RouteHint::None),
            fb::RouteHint::LowLatency => Ok(RouteHint::LowLatency),
            fb::RouteHint::LowCost => Ok(RouteHint::LowCost),
            other => Err(invalid("RouteRequest.hint", format!("unknown hint {}", other.0))),
        }
    }
}

/// Where should this request run?
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouteRequest {
    /// Client-visible request id.
    pub request_id: String,
    /// Model id or alias as the client named it.
    pub model: String,
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// Output token limit.
    pub max_tokens: u32,
    /// The prompt's chained block hashes.
    pub block_hashes: Vec<u64>,
    /// Session key for affinity routing.
    pub session_id: Option<String>,
    /// Pool preference.
    pub hint: RouteHint,
    /// Information density of the input in [0, 1].
    pub input_semantic_weight: f32,
    /// Workers that already failed this request.
    pub excluded_workers: Vec<NodeId>,
    /// W3C traceparent of the caller's span; empty for none.
    pub trace_id: String,
    /// Try the model's fallback chain before the model itself (the frontend asks this while degraded).
    pub prefer_fallback: bool,
    /// The caller's project, for the adapters it may use (protocol 1.8); empty: only shared ones.
    pub project: String,
}

impl RouteRequest {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::id("RouteRequest.request_id", &self.request_id)?;
        check::id("RouteRequest.model", &self.model)?;
        if let Some(session) = &self.session_id {
            check::text("RouteRequest.session_id", session, 1, check::MAX_ID_LEN)?;
        }
        check::range("RouteRequest.input_semantic_weight", self.input_semantic_weight, 0.0, 1.0)?;
        check::text("RouteRequest.trace_id", &self.trace_id, 0, check::MAX_ID_LEN)?;
        check::text("RouteRequest.project", &self.project, 0, check::MAX_ID_LEN)?;
        check::count("RouteRequest.excluded_workers", self.excluded_workers.len(), check::MAX_EXCLUDED_WORKERS)
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::RouteRequest<'b>> {
        let request_id = fbb.create_string(&self.request_id);
        let model = fbb.create_string(&self.model);
        let block_hashes = fbb.create_vector(&self.block_hashes);
        let session_id = self.session_id.as_deref().map(|s| fbb.create_string(s));
        let excluded: Vec<_> = self.excluded_workers.iter().map(|w| fbb.create_string(w.as_str())).collect();
        let excluded = fbb.create_vector(&excluded);
        let trace_id = (!self.trace_id.is_empty()).then(|| fbb.create_string(&self.trace_id));
        let project = (!self.project.is_empty()).then(|| fbb.create_string(&self.project));
        fb::RouteRequest::create(
            fbb,
            &fb::RouteRequestArgs {
                request_id: Some(request_id),
                model: Some(model),
                prompt_tokens: self.prompt_tokens,
                max_tokens: self.max_tokens,
                block_hashes: Some(block_hashes),
                session_id,
                hint: self.hint.to_wire(),
                input_semantic_weight: self.input_semantic_weight,
                excluded_workers: Some(excluded),
                trace_id,
                prefer_fallback: self.prefer_fallback,
                project,
            },
        )
    }

    pub(crate) fn read(t: fb::RouteRequest<'_>) -> Result<Self, MessageError> {
        let excluded = t.excluded_workers().unwrap_or_default();
        check::count("RouteRequest.excluded_workers", excluded.len(), check::MAX_EXCLUDED_WORKERS)?;
        let msg = RouteRequest {
            request_id: t.request_id().to_owned(),
            model: t.model().to_owned(),
            prompt_tokens: t.prompt_tokens(),
            max_tokens: t.max_tokens(),
            block_hashes: t.block_hashes().map(|v| v.iter().collect()).unwrap_or_default(),
            session_id: t.session_id().filter(|s| !s.is_empty()).map(str::to_owned),
            hint: RouteHint::from_wire(t.hint())?,
            input_semantic_weight: t.input_semantic_weight(),
            excluded_workers: excluded
                .iter()
                .map(|w| NodeId::read("RouteRequest.excluded_workers", w))
                .collect::<Result<_, _>>()?,
            trace_id: t.trace_id().unwrap_or_default().to_owned(),
            prefer_fallback: t.prefer_fallback(),
            project: t.project().unwrap_or_default().to_owned(),
        };
        msg.check()?;
        Ok(msg)
    }
}

/// Where to run a request and what it is predicted to cost.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteDecision {
    /// Client-visible request id.
    pub request_id: String,
    /// Chosen worker.
    pub worker_id: NodeId,
    /// host:port of its QUIC endpoint.
    pub endpoint: String,
    /// Concrete model id after alias, pin and canary resolution.
    pub model: String,
    /// SHA-256 of the chosen model version's weights.
    pub weights_sha256: [u8; 32],
    /// Chosen pool.
    pub compute_pool: ComputePool,
    /// Predicted billing unit in [0, 1].
    pub predicted_billing_unit: f32,
    /// Why this worker.
    pub reason: String,
    /// Time spent deciding, in nanoseconds.
    pub decision_nanos: u64,
    /// Node id of the orchestrator that decided; empty when unknown.
    pub orchestrator_id: String,
    /// The LoRA adapter the request runs with when its model id names one (`model` is then its base).
    pub adapter: Option<AdapterRef>,
}

impl RouteDecision {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::id("RouteDecision.request_id", &self.request_id)?;
        check::endpoint("RouteDecision.endpoint", &self.endpoint)?;
        check::id("RouteDecision.model", &self.model)?;
        check::range("RouteDecision.predicted_billing_unit", self.predicted_billing_unit, 0.0, 1.0)?;
        check::text("RouteDecision.reason", &self.reason, 0, check::MAX_REASON_LEN)?;
        check::text("RouteDecision.orchestrator_id", &self.orchestrator_id, 0, check::MAX_NODE_ID_LEN)?;
        match &self.adapter {
            Some(a) => a.check("RouteDecision.adapter"),
            None => Ok(()),
        }
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::RouteDecision<'b>> {
        let request_id = fbb.create_string(&self.request_id);
        let worker_id = fbb.create_string(self.worker_id.as_str());
        let endpoint = fbb.create_string(&self.endpoint);
        let model = fbb.create_string(&self.model);
        let sha = fbb.create_vector(&self.weights_sha256);
        let reason = fbb.create_string(&self.reason);
        let orchestrator_id = (!self.orchestrator_id.is_empty()).then(|| fbb.create_string(&self.orchestrator_id));
        let adapter = self.adapter.as_ref().map(|a| a.write(fbb));
        fb::RouteDecision::create(
            fbb,
            &fb::RouteDecisionArgs {
                request_id: Some(request_id),
                worker_id: Some(worker_id),
                endpoint: Some(endpoint),
                model: Some(model),
                weights_sha256: Some(sha),
                compute_pool: self.compute_pool.to_wire(),
                predicted_billing_unit: self.predicted_billing_unit,
                reason: Some(reason),
                decision_nanos: self.decision_nanos,
                orchestrator_id,
                adapter,
            },
        )
    }

    pub(crate) fn read(t: fb::RouteDecision<'_>) -> Result<Self, MessageError> {
        let msg = RouteDecision {
            request_id: t.request_id().to_owned(),
            worker_id: NodeId::read("RouteDecision.worker_id", t.worker_id())?,
            endpoint: t.endpoint().to_owned(),
            model: t.model().to_owned(),
            weights_sha256: check::sha256("RouteDecision.weights_sha256", t.weights_sha256().bytes())?,
            compute_pool: ComputePool::from_wire("RouteDecision.compute_pool", t.compute_pool())?,
            predicted_billing_unit: t.predicted_billing_unit(),
            reason: t.reason().unwrap_or_default().to_owned(),
            decision_nanos: t.decision_nanos(),
            orchestrator_id: t.orchestrator_id().unwrap_or_default().to_owned(),
            adapter: AdapterRef::read("RouteDecision.adapter", t.adapter())?,
        };
        msg.check()?;
        Ok(msg)
    }
}
