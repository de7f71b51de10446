//! What the frontend caches of the cluster: API keys (hashes only), project quotas, the served models and billing
//! weights, pulled from an orchestrator about once a second (only when the routing state changed); and model cards
//! (tokenizer, chat template, context window), fetched once per model from a worker that serves it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use zl_common::billing::BillingWeights;
use zl_common::keys::hex;
use zl_common::sync::{lock, read, write};
use zl_node::consul::DiscoveryStatus;
use zl_node::consul::status::StatusView;
use zl_wire::message::{AdapterInfo, FrontendGrant, ModelInfo, ProjectQuota, RouteRequest, StateSync};

use crate::error::{ApiError, ErrorKind};
use crate::health::{Inputs, Level, Thresholds, assess};
use crate::upstream::Upstream;
use zl_client::card::CardError;

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyInfo {
    /// Public key id.
    pub key_id: String,
    /// Project it bills to.
    pub project: String,
    /// Data residency: the regions that may serve it; empty for any.
    pub regions: Vec<String>,
}

impl KeyInfo {
    /// The caller of a cluster that does not require API keys (`--require-auth false`): billed to the `default`
    /// project.
    pub fn anonymous() -> Self {
        KeyInfo { key_id: "anonymous".into(), project: "default".into(), regions: vec![] }
    }
}

/// Everything a frontend needs to tokenise and check a model's prompts (zl-client's, shared with `zl bench`).
pub use zl_client::card::Card;

#[derive(Debug, Default)]
struct Synced {
    index: u64,
    keys: HashMap<String, KeyInfo>,
    projects: HashMap<String, ProjectQuota>,
    models: BTreeMap<String, ModelInfo>,
    /// Registered LoRA adapters, by name.
    adapters: BTreeMap<String, AdapterInfo>,
    serving_workers: u32,
    weights: BillingWeights,
    last_ok: Option<Instant>,
    ever_ok: bool,
}

/// The cached cluster state.
#[derive(Debug, Default)]
pub struct Cluster {
    synced: RwLock<Synced>,
    cards: Mutex<HashMap<String, Arc<Card>>>,
    /// Held while a card is fetched and built: requests that arrive meanwhile wait for that card instead of
    /// fetching and building their own (a tokenizer takes a second of CPU to build).
    loading: tokio::sync::Mutex<()>,
    /// The discovery backend's reachability (`--discovery consul`).
    discovery: Option<Arc<DiscoveryStatus>>,
    /// The orchestrators' last answer to this frontend's report (health signals), and when it came.
    signals: RwLock<Option<(FrontendGrant, Instant)>>,
    /// Where the degradation levels change.
    thresholds: RwLock<Thresholds>,
    /// How key secrets are checked (keyed with `--key-pepper-file`'s pepper when given).
    hasher: zl_common::keys::SecretHasher,
    /// A synced key hashed with a pepper this frontend lacks was reported (once).
    pepper_warned: std::sync::atomic::AtomicBool,
}

/// How stale the synced state may be before `/readyz` and `x-zl-health` say so.
pub const STALE_AFTER: Duration = Duration::from_secs(5);

impl Cluster {
    /// A cluster view that also reports on a discovery backend (`--discovery consul`).
    pub fn with_discovery(status: Arc<DiscoveryStatus>) -> Self {
        Cluster { discovery: Some(status), ..Cluster::default() }
    }

    /// Check key secrets with `hasher` (the orchestrators' pepper).
    pub fn with_hasher(self, hasher: zl_common::keys::SecretHasher) -> Self {
        Cluster { hasher, ..self }
    }

    /// The discovery backend's reachability, when there is one.
    pub fn discovery(&self) -> Option<StatusView> {
        self.discovery.as_ref().map(|d| d.view())
    }

    /// Apply a sync reply.
    pub fn apply(&self, sync: StateSync, now: Instant) {
        let mut s = write(&self.synced);
        s.last_ok = Some(now);
        s.ever_ok = true;
        s.serving_workers = sync.serving_workers;
        // An orchestrator behind the state this frontend holds (one catching up) never takes keys or models back.
        if sync.unchanged || sync.applied_index < s.index {
            return;
        }
        s.index = sync.applied_index;
        let foreign = sync
            .keys
            .iter()
            .filter_map(|k| zl_common::keys::pepper_of(&k.secret_sha256))
            .find(|id| Some(*id) != self.hasher.pepper_id());
        if let Some(id) = foreign
            && !self.pepper_warned.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::error!(
                pepper = id,
                ours = ?self.hasher.pepper_id(),
                "keys are stored keyed with a pepper this frontend does not have: they will not verify (give the \
                 orchestrators' --key-pepper-file)"
            );
        }
        metrics::gauge!("zl_frontend_keys_unverifiable").set(if foreign.is_some() { 1.0 } else { 0.0 });
        s.keys = sync
            .keys
            .into_iter()
            .map(|k| (k.secret_sha256, KeyInfo { key_id: k.key_id, project: k.project, regions: k.regions }))
            .collect();
        s.projects = sync.projects.into_iter().map(|p| (p.project.clone(), p)).collect();
        s.models = sync.models.into_iter().map(|m| (m.id.clone(), m)).collect();
        s.adapters = sync.adapters.into_iter().map(|a| (a.name.clone(), a)).collect();
        s.weights = sync
            .billing_weights
            .map(|[input, output, context]| BillingWeights { input, output, context })
            .unwrap_or_default();
        // A model whose weights changed (or that is gone) needs a new card.
        let models = &s.models;
        lock(&self.cards)
            .retain(|_, card| models.get(&card.model).is_some_and(|m| hex(&m.weights_sha256) == card.weights));
    }

    /// The applied index of the cached state (0 before the first sync).
    pub fn index(&self) -> u64 {
        read(&self.synced).index
    }

    /// The key with this secret.
    pub fn verify(&self, secret: &str) -> Option<KeyInfo> {
        self.hasher.verify(&read(&self.synced).keys, secret).cloned()
    }

    /// The key with id `key_id` (a hop from a peer region names the key its frontend authenticated).
    pub fn key_by_id(&self, key_id: &str) -> Option<KeyInfo> {
        read(&self.synced).keys.values().find(|k| k.key_id == key_id).cloned()
    }

    /// A project's quota (all zero, unlimited, if it has none).
    pub fn project(&self, name: &str) -> ProjectQuota {
        read(&self.synced).projects.get(name).cloned().unwrap_or_default()
    }

    /// The cache scope of a project's requests (docs/api.md, "Isolation"): `group:NAME` when an admin put the
    /// project in a cache group, else `project:NAME`. The response cache keys on it and the KV prefix chain is
    /// salted with it, so nothing cached for one scope is ever a hit for another.
    pub fn cache_scope(&self, project: &str) -> String {
        let synced = read(&self.synced);
        match synced.projects.get(project).map(|p| p.cache_group.as_str()).filter(|g| !g.is_empty()) {
            Some(group) => format!("group:{group}"),
            None => format!("project:{project}"),
        }
    }

    /// Whether the project exists in the routing state.
    pub fn project_known(&self, name: &str) -> bool {
        read(&self.synced).projects.contains_key(name)
    }

    /// The served models, by id.
    pub fn models(&self) -> Vec<ModelInfo> {
        read(&self.synced).models.values().cloned().collect()
    }

    /// The adapter a model id names (`NAME` or `BASE:NAME`), whichever project owns it: its base is what its
    /// prompts are tokenized with. Whether the caller's project may use it is the route's to say.
    pub fn adapter(&self, model: &str) -> Option<AdapterInfo> {
        let s = read(&self.synced);
        let a = match model.split_once(':') {
            Some((base, name)) => s.adapters.get(name).filter(|a| a.base == base)?,
            None => s.adapters.get(model)?,
        };
        Some(a.clone())
    }

    /// The adapters `project` may use, by name.
    pub fn adapters_for(&self, project: &str) -> Vec<String> {
        read(&self.synced).adapters.values().filter(|a| a.visible_to(project)).map(|a| a.name.clone()).collect()
    }

    /// Whether some worker serves `model` (`None`: not known yet, no sync has succeeded).
    pub fn serves(&self, model: &str) -> Option<bool> {
        let s = read(&self.synced);
        s.ever_ok.then(|| s.models.contains_key(model))
    }

    /// Billing weights.
    pub fn billing_weights(&self) -> BillingWeights {
        read(&self.synced).weights
    }

    /// Ready: an orchestrator answered recently. Workers do not count: a frontend whose region has no healthy
    /// worker stays in its Service and spills to a peer region (or answers 529 with the reason itself); the level
    /// ([`Cluster::level`], `x-zl-health`) says how well it can serve.
    pub fn ready(&self, now: Instant) -> Result<(), String> {
        let s = read(&self.synced);
        match s.last_ok {
            None => Err("no orchestrator has answered yet".into()),
            Some(t) if now.saturating_duration_since(t) > STALE_AFTER => {
                Err(format!("no orchestrator has answered for {:.0?}", now.saturating_duration_since(t)))
            }
            Some(_) => Ok(()),
        }
    }

    /// Healthy, non-draining workers as of the last sync.
    pub fn serving_workers(&self) -> u32 {
        read(&self.synced).serving_workers
    }

    /// Use these degradation thresholds.
    pub fn set_thresholds(&self, t: Thresholds) {
        *write(&self.thresholds) = t;
    }

    /// The orchestrators answered a report with these signals.
    pub fn set_signals(&self, grant: FrontendGrant, now: Instant) {
        *write(&self.signals) = Some((grant, now));
    }

    /// Whether the orchestrators answered a report recently (within the stale bound): the shared per-minute
    /// limits and budgets are then leased from them.
    pub fn signals_fresh(&self, now: Instant) -> bool {
        let stale = read(&self.thresholds).signals_stale;
        read(&self.signals).as_ref().is_some_and(|(_, at)| now.saturating_duration_since(*at) <= stale)
    }

    /// The degradation level now, and why (docs/operations.md, "Degradation levels").
    pub fn level(&self, now: Instant) -> (Level, String) {
        let state = self.ready(now).err();
        let inputs = {
            let s = read(&self.synced);
            Inputs {
                state,
                ever_synced: s.ever_ok,
                serving_workers: s.serving_workers,
                discovery_ok: self.discovery().is_none_or(|d| d.reachable),
                signals: read(&self.signals).clone(),
            }
        };
        assess(&read(&self.thresholds), &inputs, now)
    }

    /// `healthy`, `degraded` or `unavailable` (`x-zl-health`).
    pub fn health(&self, now: Instant) -> &'static str {
        self.level(now).0.as_str()
    }

    /// 404 for a model the cluster does not have, naming the ones it has (a typo is the usual cause). While it
    /// has none at all (starting, or every worker gone before any registered) nothing can be told apart from a
    /// typo, and capacity is what is missing: a retryable 529 with `retry-after`.
    pub fn not_found(&self, model: &str) -> ApiError {
        let served: Vec<String> = self.models().into_iter().map(|m| m.id).collect();
        if served.is_empty() {
            metrics::counter!("zl_frontend_no_capacity_total", "reason" => "no_models").increment(1);
            return ApiError::new(
                ErrorKind::Overloaded,
                format!(
                    "model: {model} cannot be served right now: no worker has registered a model yet; retry shortly"
                ),
            )
            .retry_after(1);
        }
        ApiError::new(
            ErrorKind::NotFound,
            format!("model: {model} is not served here; served models: {}", served.join(", ")),
        )
    }

    /// The card for `model` (as the client named it: an alias resolves through a route), fetched from a worker
    /// on first use.
    pub async fn card(&self, upstream: &dyn Upstream, model: &str, request_id: &str) -> Result<Arc<Card>, ApiError> {
        if let Some(card) = lock(&self.cards).get(model) {
            return Ok(card.clone());
        }
        if self.serves(model) == Some(false) {
            return Err(self.not_found(model));
        }
        let _loading = self.loading.lock().await;
        if let Some(card) = lock(&self.cards).get(model) {
            return Ok(card.clone());
        }
        // A route with no prompt tells which concrete model and which worker serve the name.
        let probe = RouteRequest {
            request_id: format!("{request_id}-card"),
            model: model.to_owned(),
            prompt_tokens: 0,
            max_tokens: 1,
            block_hashes: vec![],
            session_id: None,
            hint: Default::default(),
            input_semantic_weight: 0.0,
            excluded_workers: vec![],
            trace_id: String::new(),
            prefer_fallback: false,
            project: String::new(),
        };
        let decision = upstream.route(probe).await.map_err(|e| {
            let err = ApiError::from_call(&e, "routing");
            if err.kind == ErrorKind::NotFound { self.not_found(model) } else { err }
        })?;
        let card = Arc::new(fetch_card(upstream, decision.endpoint.clone(), decision.model.clone()).await?);
        lock(&self.cards).insert(model.to_owned(), card.clone());
        tracing::info!(model, concrete = %card.model, "model card loaded");
        Ok(card)
    }
}

/// The card of `model` from the worker at `endpoint`, with its tokenizer built (off the async threads: parsing a
/// tokenizer is a second of CPU, and they must keep serving other requests and keeping connections alive).
pub async fn fetch_card(upstream: &dyn Upstream, endpoint: String, model: String) -> Result<Card, ApiError> {
    zl_client::card::fetch_card(upstream, endpoint, model).await.map_err(|e| match e {
        CardError::Call(e) => ApiError::from_call(&e, "fetching the model card"),
        CardError::Unusable(why) => ApiError::internal(why),
    })
}

/// Keep `cluster` in step with the routing state: one sync call per `interval`, asking only for changes.
pub async fn sync_loop(cluster: Arc<Cluster>, upstream: Arc<dyn Upstream>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        match upstream.sync(cluster.index()).await {
            Ok(sync) => {
                metrics::gauge!("zl_frontend_state_index").set(sync.applied_index as f64);
                cluster.apply(sync, Instant::now());
            }
            Err(e) => {
                metrics::counter!("zl_frontend_sync_failures_total").increment(1);
                tracing::warn!(error = %e, "routing state sync failed");
            }
        }
    }
}
