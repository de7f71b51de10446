//! What frontends cache: a model's card (from a worker) and the key, quota and model part of the routing state
//! (from an orchestrator). Owned, checked values and their FlatBuffers conversion.

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use super::adapters::AdapterInfo;
use super::check::{self, invalid};
use super::control::ModelInfo;
use super::{MessageError, fb};

/// Most keys, projects or models one `StateSync` may carry.
pub const MAX_SYNC_ITEMS: usize = 100_000;
/// Most stop-token ids in a model card.
pub const MAX_STOP_TOKEN_IDS: usize = 64;

/// Ask a worker for a model's card.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelCardRequest {
    /// Concrete model id.
    pub model: String,
}

impl ModelCardRequest {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::id("ModelCardRequest.model", &self.model)
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::ModelCardRequest<'b>> {
        let model = fbb.create_string(&self.model);
        fb::ModelCardRequest::create(fbb, &fb::ModelCardRequestArgs { model: Some(model) })
    }

    pub(crate) fn read(t: fb::ModelCardRequest<'_>) -> Result<Self, MessageError> {
        let msg = ModelCardRequest { model: t.model().to_owned() };
        msg.check()?;
        Ok(msg)
    }
}

/// What a frontend needs to tokenise prompts for a model exactly as the worker does.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelCard {
    /// Concrete model id.
    pub model: String,
    /// SHA-256 of the weights.
    pub weights_sha256: [u8; 32],
    /// Context window in tokens.
    pub context_length: u32,
    /// A Hugging Face `tokenizer.json` document.
    pub tokenizer_json: String,
    /// The Jinja chat template.
    pub chat_template: String,
    /// Beginning-of-sequence token string.
    pub bos_token: String,
    /// End-of-sequence token string.
    pub eos_token: String,
    /// Token ids that end a turn.
    pub stop_token_ids: Vec<u32>,
    /// Tokens per KV block.
    pub kv_block_size: u32,
    /// An embedding model: the width of its vectors (0: a generative model).
    pub embedding_dims: u32,
    /// How an embedding model pools a text's token states: "mean", "cls" or "last" (empty for a generative one).
    pub pooling: String,
}

impl ModelCard {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::id("ModelCard.model", &self.model)?;
        if self.context_length == 0 {
            return Err(invalid("ModelCard.context_length", "must be at least 1"));
        }
        if self.kv_block_size == 0 {
            return Err(invalid("ModelCard.kv_block_size", "must be at least 1"));
        }
        if self.tokenizer_json.is_empty() {
            return Err(invalid("ModelCard.tokenizer_json", "must not be empty"));
        }
        if self.chat_template.is_empty() {
            return Err(invalid("ModelCard.chat_template", "must not be empty"));
        }
        check::text("ModelCard.bos_token", &self.bos_token, 0, check::MAX_ID_LEN)?;
        check::text("ModelCard.eos_token", &self.eos_token, 0, check::MAX_ID_LEN)?;
        if self.embedding_dims > super::MAX_EMBED_DIMS {
            return Err(invalid("ModelCard.embedding_dims", format!("above {}", super::MAX_EMBED_DIMS)));
        }
        check::text("ModelCard.pooling", &self.pooling, 0, 16)?;
        check::count("ModelCard.stop_token_ids", self.stop_token_ids.len(), MAX_STOP_TOKEN_IDS)
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::ModelCard<'b>> {
        let model = fbb.create_string(&self.model);
        let sha = fbb.create_vector(&self.weights_sha256);
        let tokenizer_json = fbb.create_string(&self.tokenizer_json);
        let chat_template = fbb.create_string(&self.chat_template);
        let bos_token = fbb.create_string(&self.bos_token);
        let eos_token = fbb.create_string(&self.eos_token);
        let stop = fbb.create_vector(&self.stop_token_ids);
        let pooling = fbb.create_string(&self.pooling);
        fb::ModelCard::create(
            fbb,
            &fb::ModelCardArgs {
                model: Some(model),
                weights_sha256: Some(sha),
                context_length: self.context_length,
                tokenizer_json: Some(tokenizer_json),
                chat_template: Some(chat_template),
                bos_token: Some(bos_token),
                eos_token: Some(eos_token),
                stop_token_ids: Some(stop),
                kv_block_size: self.kv_block_size,
                embedding_dims: self.embedding_dims,
                pooling: Some(pooling),
            },
        )
    }

    pub(crate) fn read(t: fb::ModelCard<'_>) -> Result<Self, MessageError> {
        let stop = t.stop_token_ids().unwrap_or_default();
        check::count("ModelCard.stop_token_ids", stop.len(), MAX_STOP_TOKEN_IDS)?;
        let msg = ModelCard {
            model: t.model().to_owned(),
            weights_sha256: check::sha256("ModelCard.weights_sha256", t.weights_sha256().bytes())?,
            context_length: t.context_length(),
            tokenizer_json: t.tokenizer_json().to_owned(),
            chat_template: t.chat_template().to_owned(),
            bos_token: t.bos_token().unwrap_or_default().to_owned(),
            eos_token: t.eos_token().unwrap_or_default().to_owned(),
            stop_token_ids: stop.iter().collect(),
            kv_block_size: t.kv_block_size(),
            embedding_dims: t.embedding_dims(),
            pooling: t.pooling().unwrap_or_default().to_owned(),
        };
        msg.check()?;
        Ok(msg)
    }
}

/// Ask an orchestrator for the state frontends cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateSyncRequest {
    /// Applied index of the state the caller holds; 0 for none.
    pub known_index: u64,
}

impl StateSyncRequest {
    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::StateSyncRequest<'b>> {
        fb::StateSyncRequest::create(fbb, &fb::StateSyncRequestArgs { known_index: self.known_index })
    }

    pub(crate) fn read(t: fb::StateSyncRequest<'_>) -> Result<Self, MessageError> {
        Ok(StateSyncRequest { known_index: t.known_index() })
    }
}

/// An API key as frontends see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiKeyEntry {
    /// Public key id.
    pub key_id: String,
    /// SHA-256 of the secret, lowercase hex.
    pub secret_sha256: String,
    /// Project the key bills to.
    pub project: String,
    /// Regions whose frontends may serve it; empty for any.
    pub regions: Vec<String>,
}

impl ApiKeyEntry {
    fn check(&self) -> Result<(), MessageError> {
        check::id("ApiKeyEntry.key_id", &self.key_id)?;
        check::id("ApiKeyEntry.project", &self.project)?;
        if let Some(problem) = zl_common::region::regions_problem(&self.regions) {
            return Err(invalid("ApiKeyEntry.regions", problem));
        }
        if !zl_common::keys::is_secret_hash(&self.secret_sha256) {
            return Err(invalid(
                "ApiKeyEntry.secret_sha256",
                "must be 64 lowercase hex characters, or hmac-sha256:ID:HEX (a peppered hash)",
            ));
        }
        Ok(())
    }
}

/// A project's limits; 0 means unlimited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProjectQuota {
    /// Project name.
    pub project: String,
    /// Requests per minute.
    pub requests_per_minute: u32,
    /// Input plus output tokens per minute.
    pub tokens_per_minute: u32,
    /// Requests in flight.
    pub max_concurrent: u32,
    /// Input tokens per minute.
    pub input_tokens_per_minute: u32,
    /// Output tokens per minute.
    pub output_tokens_per_minute: u32,
    /// Priority class under degradation: 0 high, 1 normal, 2 low.
    pub priority: u8,
    /// The project's budget, if any.
    pub budget: Option<Budget>,
    /// Content logging's data key (id, 32 bytes), when on.
    pub content_key: Option<(String, Vec<u8>)>,
    /// The cache group an admin put the project in (shared response cache and KV prefixes); empty for none.
    pub cache_group: String,
}

impl Default for ProjectQuota {
    fn default() -> Self {
        ProjectQuota {
            project: String::new(),
            requests_per_minute: 0,
            tokens_per_minute: 0,
            max_concurrent: 0,
            input_tokens_per_minute: 0,
            output_tokens_per_minute: 0,
            priority: 1,
            budget: None,
            content_key: None,
            cache_group: String::new(),
        }
    }
}

/// What a budget counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetMetric {
    /// Billing units times 1000.
    MilliUnits,
    /// Input plus output tokens.
    Tokens,
}

/// The period a budget resets after (UTC calendar).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetPeriod {
    /// A day.
    Day,
    /// A month.
    Month,
}

/// A project's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// What it counts.
    pub metric: BudgetMetric,
    /// When it resets.
    pub period: BudgetPeriod,
    /// How much per period.
    pub limit: u64,
}

/// The part of the routing state frontends cache.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct StateSync {
    /// Applied index of this state.
    pub applied_index: u64,
    /// The caller's state is current; the lists are empty.
    pub unchanged: bool,
    /// API keys.
    pub keys: Vec<ApiKeyEntry>,
    /// Project quotas.
    pub projects: Vec<ProjectQuota>,
    /// Models served by some healthy, non-draining worker, and aliases.
    pub models: Vec<ModelInfo>,
    /// Workers able to serve.
    pub serving_workers: u32,
    /// Billing-unit weights (input, output, context); `None` for the defaults.
    pub billing_weights: Option<[f32; 3]>,
    /// Registered LoRA adapters (protocol 1.8).
    pub adapters: Vec<AdapterInfo>,
}

impl StateSync {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::count("StateSync.keys", self.keys.len(), MAX_SYNC_ITEMS)?;
        check::count("StateSync.projects", self.projects.len(), MAX_SYNC_ITEMS)?;
        check::count("StateSync.models", self.models.len(), MAX_SYNC_ITEMS)?;
        check::count("StateSync.adapters", self.adapters.len(), MAX_SYNC_ITEMS)?;
        self.adapters.iter().try_for_each(AdapterInfo::check)?;
        for key in &self.keys {
            key.check()?;
        }
        if let Some(w) = self.billing_weights {
            for w in w {
                check::range("StateSync.billing_weights", w, 0.0, 1.0)?;
            }
        }
        for p in &self.projects {
            check::id("ProjectQuota.project", &p.project)?;
            if p.priority > 2 {
                return Err(invalid("ProjectQuota.priority", "0, 1 or 2"));
            }
            if !p.cache_group.is_empty() {
                check::id("ProjectQuota.cache_group", &p.cache_group)?;
            }
            if let Some((id, k)) = &p.content_key {
                check::id("ProjectQuota.content_key_id", id)?;
                if k.len() != 32 {
                    return Err(invalid("ProjectQuota.content_key", "must be 32 bytes"));
                }
            }
        }
        self.models.iter().try_for_each(ModelInfo::check)
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::StateSync<'b>> {
        let keys: Vec<_> = self
            .keys
            .iter()
            .map(|k| {
                let key_id = fbb.create_string(&k.key_id);
                let secret = fbb.create_string(&k.secret_sha256);
                let project = fbb.create_string(&k.project);
                let regions = (!k.regions.is_empty()).then(|| {
                    let names: Vec<_> = k.regions.iter().map(|r| fbb.create_string(r)).collect();
                    fbb.create_vector(&names)
                });
                fb::ApiKeyEntry::create(
                    fbb,
                    &fb::ApiKeyEntryArgs {
                        key_id: Some(key_id),
                        secret_sha256: Some(secret),
                        project: Some(project),
                        regions,
                    },
                )
            })
            .collect();
        let keys = fbb.create_vector(&keys);
        let projects: Vec<_> = self
            .projects
            .iter()
            .map(|p| {
                let project = fbb.create_string(&p.project);
                let content_key_id = p.content_key.as_ref().map(|(id, _)| fbb.create_string(id));
                let content_key = p.content_key.as_ref().map(|(_, k)| fbb.create_vector(k));
                let cache_group = (!p.cache_group.is_empty()).then(|| fbb.create_string(&p.cache_group));
                let budget = p.budget.unwrap_or(Budget {
                    metric: BudgetMetric::MilliUnits,
                    period: BudgetPeriod::Day,
                    limit: 0,
                });
                fb::ProjectQuota::create(
                    fbb,
                    &fb::ProjectQuotaArgs {
                        project: Some(project),
                        requests_per_minute: p.requests_per_minute,
                        tokens_per_minute: p.tokens_per_minute,
                        max_concurrent: p.max_concurrent,
                        input_tokens_per_minute: p.input_tokens_per_minute,
                        output_tokens_per_minute: p.output_tokens_per_minute,
                        priority: p.priority,
                        budget_metric: match budget.metric {
                            BudgetMetric::MilliUnits => 0,
                            BudgetMetric::Tokens => 1,
                        },
                        budget_period: match budget.period {
                            BudgetPeriod::Day => 0,
                            BudgetPeriod::Month => 1,
                        },
                        budget_limit: budget.limit,
                        content_key_id,
                        content_key,
                        cache_group,
                    },
                )
            })
            .collect();
        let projects = fbb.create_vector(&projects);
        let models: Vec<_> = self.models.iter().map(|m| m.write(fbb)).collect();
        let models = fbb.create_vector(&models);
        let weights = self.billing_weights.map(|w| fbb.create_vector(&w));
        let adapters: Vec<_> = self.adapters.iter().map(|a| a.write(fbb)).collect();
        let adapters = (!adapters.is_empty()).then(|| fbb.create_vector(&adapters));
        fb::StateSync::create(
            fbb,
            &fb::StateSyncArgs {
                applied_index: self.applied_index,
                unchanged: self.unchanged,
                keys: Some(keys),
                projects: Some(projects),
                models: Some(models),
                serving_workers: self.serving_workers,
                billing_weights: weights,
                adapters,
            },
        )
    }

    pub(crate) fn read(t: fb::StateSync<'_>) -> Result<Self, MessageError> {
        let keys = t.keys().unwrap_or_default();
        let projects = t.projects().unwrap_or_default();
        let models = t.models().unwrap_or_default();
        check::count("StateSync.keys", keys.len(), MAX_SYNC_ITEMS)?;
        check::count("StateSync.projects", projects.len(), MAX_SYNC_ITEMS)?;
        check::count("StateSync.models", models.len(), MAX_SYNC_ITEMS)?;
        let adapters = t.adapters().unwrap_or_default();
        check::count("StateSync.adapters", adapters.len(), MAX_SYNC_ITEMS)?;
        let msg = StateSync {
            adapters: adapters.iter().map(AdapterInfo::read).collect::<Result<_, _>>()?,
            applied_index: t.applied_index(),
            unchanged: t.unchanged(),
            keys: keys
                .iter()
                .map(|k| {
                    let regions = k.regions().unwrap_or_default();
                    check::count("ApiKeyEntry.regions", regions.len(), zl_common::region::MAX_KEY_REGIONS)?;
                    Ok(ApiKeyEntry {
                        key_id: k.key_id().to_owned(),
                        secret_sha256: k.secret_sha256().to_owned(),
                        project: k.project().to_owned(),
                        regions: regions.iter().map(str::to_owned).collect(),
                    })
                })
                .collect::<Result<_, MessageError>>()?,
            projects: projects
                .iter()
                .map(|p| {
                    let budget = match (p.budget_limit(), p.budget_metric(), p.budget_period()) {
                        (0, _, _) => None,
                        (limit, m @ 0..=1, d @ 0..=1) => Some(Budget {
                            metric: if m == 0 { BudgetMetric::MilliUnits } else { BudgetMetric::Tokens },
                            period: if d == 0 { BudgetPeriod::Day } else { BudgetPeriod::Month },
                            limit,
                        }),
                        _ => return Err(invalid("ProjectQuota.budget_metric", "unknown metric or period")),
                    };
                    let content_key = match (p.content_key_id(), p.content_key()) {
                        (Some(id), Some(k)) if k.len() == 32 => Some((id.to_owned(), k.bytes().to_vec())),
                        (None, None) => None,
                        _ => return Err(invalid("ProjectQuota.content_key", "needs an id and 32 bytes")),
                    };
                    if p.priority() > 2 {
                        return Err(invalid("ProjectQuota.priority", "0, 1 or 2"));
                    }
                    Ok(ProjectQuota {
                        project: p.project().to_owned(),
                        requests_per_minute: p.requests_per_minute(),
                        tokens_per_minute: p.tokens_per_minute(),
                        max_concurrent: p.max_concurrent(),
                        input_tokens_per_minute: p.input_tokens_per_minute(),
                        output_tokens_per_minute: p.output_tokens_per_minute(),
                        priority: p.priority(),
                        budget,
                        content_key,
                        cache_group: p.cache_group().unwrap_or_default().to_owned(),
                    })
                })
                .collect::<Result<_, MessageError>>()?,
            models: models.iter().map(ModelInfo::read).collect::<Result<_, _>>()?,
            serving_workers: t.serving_workers(),
            billing_weights: match t.billing_weights() {
                None => None,
                Some(w) if w.is_empty() => None,
                Some(w) if w.len() == 3 => Some([w.get(0), w.get(1), w.get(2)]),
                Some(w) => return Err(invalid("StateSync.billing_weights", format!("{} values, need 3", w.len()))),
            },
        };
        msg.check()?;
        Ok(msg)
    }
}
