//! The operator admin API (`schemas/admin.proto`) on an orchestrator: reads come from the local state and load
//! view; writes become routing-state commands through [`Orchestrator::commit`]. Every call must present an admin
//! certificate from the cluster CA.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tonic::{Request, Response, Status};
use zl_admin::pb;
use zl_admin::require_admin;
use zl_common::billing::BillingWeights;
use zl_common::keys::SecretHasher;
use zl_wire::message::{ComputePool, NodeId};

use super::ledger;
use crate::orchestrator::{Orchestrator, unix_ms};
use crate::raft::{CommitError, command_status};
use crate::state::{AdapterSpec, ApiKey, Command, PoolThresholds, Quota};

/// The admin service of one orchestrator.
#[derive(Debug, Clone)]
pub struct AdminService {
    node: Arc<Orchestrator>,
    /// How key secrets are stored (keyed with the pepper when there is one).
    hasher: SecretHasher,
}

impl AdminService {
    /// Administer this node.
    pub fn new(node: Arc<Orchestrator>) -> Self {
        AdminService { node, hasher: SecretHasher::default() }
    }

    /// Store key secrets keyed with this hasher's pepper (`--key-pepper-file`).
    pub fn with_hasher(mut self, hasher: SecretHasher) -> Self {
        self.hasher = hasher;
        self
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> pb::admin_server::AdminServer<AdminService> {
        pb::admin_server::AdminServer::new(self)
    }

    /// Commit an operator's write, recorded with who made it (the routing state's admin log).
    async fn write(&self, by: &str, cmd: Command) -> Result<Response<pb::WriteResponse>, Status> {
        let applied_index = self.node.commit(&as_admin(by, cmd)).await.map_err(status)?;
        Ok(Response::new(pb::WriteResponse { applied_index }))
    }

    /// Record an operator's read of secrets before answering it: refused when it cannot be recorded.
    async fn record_read(&self, by: &str, what: String) -> Result<(), Status> {
        tracing::warn!(admin = by, what, "admin read of secrets");
        let cmd = Command::AdminRead { by: by.to_owned(), at_ms: unix_ms(), what };
        self.node.commit(&cmd).await.map_err(status)?;
        Ok(())
    }
}

/// The admin certificate's node id, once the caller is checked to be an admin.
#[allow(clippy::result_large_err)]
fn admin_id<T>(req: &Request<T>) -> Result<String, Status> {
    require_admin(req)?;
    Ok(zl_admin::admin_id(req))
}

/// `cmd` as the operator `by`'s write, stamped with this orchestrator's clock.
fn as_admin(by: &str, cmd: Command) -> Command {
    tracing::info!(admin = by, command = cmd.kind(), subject = %cmd.subject(), "admin write");
    Command::Admin { by: by.to_owned(), at_ms: unix_ms(), command: Box::new(cmd) }
}

/// A key secret an operator chose (or `CreateKey` generated): 16 to 256 printable characters.
#[allow(clippy::result_large_err)]
fn check_secret(secret: &str) -> Result<(), Status> {
    if secret.len() < 16 || secret.len() > 256 || secret.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(Status::invalid_argument("a key secret must be 16 to 256 printable characters"));
    }
    Ok(())
}

fn status(e: CommitError) -> Status {
    match e {
        CommitError::Command(e) => command_status(&e),
        CommitError::Remote(s) => s,
        e @ (CommitError::Unavailable(_) | CommitError::NotAccepted(_)) => Status::unavailable(e.to_string()),
    }
}

fn node_id(id: &str) -> Result<NodeId, Status> {
    NodeId::new(id.to_owned()).map_err(|e| Status::invalid_argument(e.to_string()))
}

fn optional(s: String) -> Option<String> {
    if s.is_empty() { None } else { Some(s) }
}

/// A pool by name; empty is none.
pub fn parse_pool(name: &str) -> Result<Option<ComputePool>, String> {
    match name {
        "" => Ok(None),
        "gpu" => Ok(Some(ComputePool::Gpu)),
        "hybrid" => Ok(Some(ComputePool::Hybrid)),
        "cpu" => Ok(Some(ComputePool::Cpu)),
        other => Err(format!("unknown pool {other:?}: use gpu, hybrid or cpu")),
    }
}

/// A fresh API key secret: `zl-` and 32 random bytes in hex.
pub fn generate_secret() -> Result<String, Status> {
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| Status::internal("no randomness available"))?;
    Ok(format!("zl-{}", crate::state::hex(&bytes)))
}

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    async fn list_workers(
        &self,
        req: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        require_admin(&req)?;
        self.node.read_barrier().await.map_err(status)?;
        let now = Instant::now();
        let workers = self
            .node
            .worker_views(now)
            .into_iter()
            .map(|v| pb::Worker {
                id: v.entry.spec.id.to_string(),
                endpoint: v.entry.spec.endpoint.clone(),
                device_class: v.entry.spec.device_class.name().into(),
                models: v
                    .entry
                    .spec
                    .models
                    .iter()
                    .map(|m| pb::WorkerModel {
                        id: m.id.clone(),
                        weights_sha256: m.weights_sha256.clone(),
                        context_length: m.context_length,
                        family: m.family.clone(),
                        weights_bytes: m.weights_bytes,
                    })
                    .collect(),
                draining: v.entry.draining,
                healthy: v.healthy,
                load: v.load.map(|(l, age)| pb::WorkerLoad {
                    queue_depth: l.queue_depth,
                    running_sequences: l.running_sequences,
                    kv_blocks_used: l.kv_blocks_used,
                    kv_blocks_free: l.kv_blocks_free,
                    fragmentation_ratio: l.fragmentation_ratio,
                    tokens_per_second: l.tokens_per_second,
                    report_age_ms: age.as_millis() as u64,
                    vram_total_bytes: l.vram_total_bytes,
                    vram_free_bytes: l.vram_free_bytes,
                    adapters: l.adapters,
                }),
                max_running_sequences: v.entry.spec.max_running_sequences,
                kv_blocks_total: v.entry.spec.kv_blocks_total,
                kv_dtype: v.entry.spec.kv_dtype.clone(),
                kv_bytes_per_token: v.entry.spec.kv_bytes_per_token,
            })
            .collect();
        Ok(Response::new(pb::ListWorkersResponse { workers }))
    }

    async fn set_drain(&self, req: Request<pb::SetDrainRequest>) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        let r = req.into_inner();
        self.write(&by, Command::SetDrain { id: node_id(&r.worker_id)?, draining: r.draining, migrate: r.migrate })
            .await
    }

    async fn add_adapter(&self, req: Request<pb::AdapterInfo>) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        let r = req.into_inner();
        let spec = AdapterSpec {
            name: r.name,
            base: r.base,
            path: r.path,
            sha256: r.sha256.to_ascii_lowercase(),
            project: r.project,
            shared: r.shared,
        };
        self.write(&by, Command::AddAdapter(spec)).await
    }

    async fn remove_adapter(
        &self,
        req: Request<pb::RemoveAdapterRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        let r = req.into_inner();
        self.write(&by, Command::RemoveAdapter { name: r.name }).await
    }

    async fn list_adapters(
        &self,
        req: Request<pb::ListAdaptersRequest>,
    ) -> Result<Response<pb::ListAdaptersResponse>, Status> {
        require_admin(&req)?;
        self.node.read_barrier().await.map_err(status)?;
        let specs: Vec<AdapterSpec> = self.node.with_state(|s| s.adapters().all().cloned().collect());
        // Where each is loaded, as the healthy workers' last reports say.
        let mut resident: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for v in self.node.worker_views(Instant::now()).into_iter().filter(|v| v.healthy) {
            for name in v.load.iter().flat_map(|(l, _)| &l.adapters) {
                resident.entry(name.clone()).or_default().push(v.entry.spec.id.to_string());
            }
        }
        let adapters = specs
            .into_iter()
            .map(|a| pb::AdapterInfo {
                resident_on: resident.get(&a.name).cloned().unwrap_or_default(),
                name: a.name,
                base: a.base,
                path: a.path,
                sha256: a.sha256,
                project: a.project,
                shared: a.shared,
            })
            .collect();
        Ok(Response::new(pb::ListAdaptersResponse { adapters }))
    }

    async fn set_alias(&self, req: Request<pb::SetAliasRequest>) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        let r = req.into_inner();
        self.write(&by, Command::SetAlias { alias: r.alias, target: optional(r.target) }).await
    }

    async fn pin_version(&self, req: Request<pb::PinVersionRequest>) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        let r = req.into_inner();
        self.write(&by, Command::PinVersion { model: r.model, weights_sha256: optional(r.weights_sha256) }).await
    }

    async fn set_canary(&self, req: Request<pb::SetCanaryRequest>) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        let r = req.into_inner();
        let weights: BTreeMap<String, u32> = r.weights.into_iter().collect();
        self.write(&by, Command::SetCanary { model: r.model, weights }).await
    }

    async fn set_fallback(&self, req: Request<pb::SetFallbackRequest>) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        let r = req.into_inner();
        self.write(&by, Command::SetFallback { model: r.model, chain: r.chain }).await
    }

    async fn pin_pool(&self, req: Request<pb::PinPoolRequest>) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        let r = req.into_inner();
        let pool = parse_pool(&r.pool).map_err(Status::invalid_argument)?;
        self.write(&by, Command::PinPool { model: r.model, pool }).await
    }

    async fn set_project(&self, req: Request<pb::SetProjectRequest>) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        let r = req.into_inner();
        if r.if_missing {
            self.node.read_barrier().await.map_err(status)?;
            let (exists, applied_index) =
                self.node.with_state(|s| (s.projects().contains_key(&r.name), s.applied_index()));
            if exists {
                return Ok(Response::new(pb::WriteResponse { applied_index }));
            }
        }
        let q = r.quota.unwrap_or_default();
        let quota = Quota {
            requests_per_minute: q.requests_per_minute,
            tokens_per_minute: q.tokens_per_minute,
            max_concurrent: q.max_concurrent,
            input_tokens_per_minute: q.input_tokens_per_minute,
            output_tokens_per_minute: q.output_tokens_per_minute,
        };
        self.write(&by, Command::SetProject { name: r.name, quota }).await
    }

    async fn create_key(&self, req: Request<pb::CreateKeyRequest>) -> Result<Response<pb::CreateKeyResponse>, Status> {
        let by = admin_id(&req)?;
        let r = req.into_inner();
        let secret = if r.secret.is_empty() { generate_secret()? } else { r.secret };
        check_secret(&secret)?;
        let key = ApiKey {
            key_id: r.key_id,
            secret_sha256: self.hasher.hash(&secret),
            project: r.project,
            regions: r.regions,
        };
        tracing::info!(key_id = %key.key_id, project = %key.project, "admin write: create_key");
        let applied_index = self.node.commit(&as_admin(&by, Command::CreateKey(key))).await.map_err(status)?;
        Ok(Response::new(pb::CreateKeyResponse { applied_index, secret }))
    }

    async fn ensure_key(&self, req: Request<pb::CreateKeyRequest>) -> Result<Response<pb::EnsureKeyResponse>, Status> {
        let by = admin_id(&req)?;
        let r = req.into_inner();
        check_secret(&r.secret)?;
        let key = ApiKey {
            key_id: r.key_id,
            secret_sha256: self.hasher.hash(&r.secret),
            project: r.project,
            regions: r.regions,
        };
        let before = self.node.with_state(|s| s.keys().get(&key.key_id).cloned());
        let outcome = match &before {
            None => "created",
            Some(k) if !self.hasher.matches(&k.secret_sha256, &r.secret) => "rotated",
            // The same secret, stored unkeyed before a pepper was given: stored keyed from now on.
            Some(k) if k.secret_sha256 != key.secret_sha256 => "rehashed",
            Some(k) if k.regions != key.regions => "updated",
            Some(_) => "unchanged",
        };
        tracing::info!(key_id = %key.key_id, project = %key.project, outcome, "admin write: ensure_key");
        let applied_index = self.node.commit(&as_admin(&by, Command::EnsureKey(key))).await.map_err(status)?;
        Ok(Response::new(pb::EnsureKeyResponse { applied_index, outcome: outcome.to_owned() }))
    }

    async fn revoke_key(&self, req: Request<pb::RevokeKeyRequest>) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        self.write(&by, Command::RevokeKey { key_id: req.into_inner().key_id }).await
    }

    async fn list_keys(&self, req: Request<pb::ListKeysRequest>) -> Result<Response<pb::ListKeysResponse>, Status> {
        require_admin(&req)?;
        self.node.read_barrier().await.map_err(status)?;
        let keys = self.node.with_state(|s| {
            s.keys()
                .values()
                .map(|k| pb::KeyInfo {
                    key_id: k.key_id.clone(),
                    project: k.project.clone(),
                    regions: k.regions.clone(),
                })
                .collect()
        });
        Ok(Response::new(pb::ListKeysResponse { keys }))
    }

    async fn set_key_regions(
        &self,
        req: Request<pb::SetKeyRegionsRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        let r = req.into_inner();
        self.write(&by, Command::SetKeyRegions { key_id: r.key_id, regions: r.regions }).await
    }

    async fn set_billing_weights(
        &self,
        req: Request<pb::SetBillingWeightsRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        let r = req.into_inner();
        self.write(
            &by,
            Command::SetBillingWeights(BillingWeights { input: r.input, output: r.output, context: r.context }),
        )
        .await
    }

    async fn set_pool_thresholds(
        &self,
        req: Request<pb::SetPoolThresholdsRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        let r = req.into_inner();
        self.write(&by, Command::SetPoolThresholds(PoolThresholds { gpu: r.gpu, hybrid: r.hybrid })).await
    }

    async fn list_members(
        &self,
        req: Request<pb::ListMembersRequest>,
    ) -> Result<Response<pb::ListMembersResponse>, Status> {
        require_admin(&req)?;
        let group = self.node.group();
        let (status, addresses) = (group.status(), group.addresses());
        let members = (status.voters.iter().map(|&id| (id, false)))
            .chain(status.learners.iter().map(|&id| (id, true)))
            .map(|(id, learner)| pb::Member {
                raft_id: id,
                address: addresses.get(&id).map(ToString::to_string).unwrap_or_default(),
                leader: status.leader == Some(id),
                learner,
            })
            .collect();
        Ok(Response::new(pb::ListMembersResponse {
            members,
            term: status.term,
            leader_id: status.leader.unwrap_or(0),
            commit_index: status.commit,
            applied_index: status.applied,
        }))
    }

    async fn change_member(
        &self,
        req: Request<pb::ChangeMemberRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        require_admin(&req)?;
        let r = req.into_inner();
        let group = self.node.group();
        let now = group.status();
        if now.leader != Some(now.id) {
            let leader = now.leader.and_then(|l| group.addresses().get(&l).map(|a| format!("{l}@{a}")));
            return Err(Status::failed_precondition(format!(
                "membership changes go to the leader ({})",
                leader.unwrap_or_else(|| "none elected yet".into())
            )));
        }
        if r.remove && r.raft_id == now.id {
            // The leader leaving: hand leadership to another voter first; the caller asks the new leader.
            let Some(to) = group.transfer_leadership(None).await.map_err(status)? else {
                return Err(Status::failed_precondition("the group's only voter cannot leave it"));
            };
            return Err(Status::failed_precondition(format!(
                "this node leads: leadership handed to {to}; send the removal to the new leader"
            )));
        }
        let address = if r.remove {
            None
        } else {
            Some(
                crate::raft::peers::peer_address(&r.address)
                    .map_err(|e| Status::invalid_argument(format!("address {:?}: {e}", r.address)))?,
            )
        };
        tracing::info!(raft_id = r.raft_id, remove = r.remove, address = %r.address, "admin write: membership");
        let applied_index = group.change_membership(r.raft_id, address).await.map_err(status)?;
        Ok(Response::new(pb::WriteResponse { applied_index }))
    }

    async fn get_state(&self, req: Request<pb::GetStateRequest>) -> Result<Response<pb::GetStateResponse>, Status> {
        let by = admin_id(&req)?;
        // The state holds content-logging data keys: who read it is recorded first.
        self.record_read(&by, "state".to_owned()).await?;
        let (applied_index, bytes) = self.node.with_state(|s| (s.applied_index(), s.snapshot()));
        let state_json = String::from_utf8(bytes).map_err(|_| Status::internal("state is not UTF-8"))?;
        Ok(Response::new(pb::GetStateResponse { applied_index, state_json }))
    }

    async fn set_budget(&self, req: Request<pb::SetBudgetRequest>) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        self.write(&by, ledger::set_budget(req.into_inner())?).await
    }

    async fn set_priority(&self, req: Request<pb::SetPriorityRequest>) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        self.write(&by, ledger::set_priority(req.into_inner())?).await
    }

    async fn set_cache_group(
        &self,
        req: Request<pb::SetCacheGroupRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        let r = req.into_inner();
        self.write(&by, Command::SetCacheGroup { project: r.project, group: (!r.group.is_empty()).then_some(r.group) })
            .await
    }

    async fn set_content_logging(
        &self,
        req: Request<pb::SetContentLoggingRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        let r = req.into_inner();
        self.node.read_barrier().await.map_err(status)?;
        let existing = self.node.with_state(|s| s.ledger().data_keys.contains_key(&r.project));
        match ledger::set_content_logging(r, existing)? {
            Some(cmd) => self.write(&by, cmd).await,
            None => Ok(Response::new(pb::WriteResponse { applied_index: self.node.with_state(|s| s.applied_index()) })),
        }
    }

    async fn get_usage(&self, req: Request<pb::GetUsageRequest>) -> Result<Response<pb::GetUsageResponse>, Status> {
        require_admin(&req)?;
        self.node.read_barrier().await.map_err(status)?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let r = req.into_inner();
        Ok(Response::new(self.node.with_state(|s| ledger::usage(s.ledger(), &r, now))))
    }

    async fn list_audit_heads(
        &self,
        req: Request<pb::ListAuditHeadsRequest>,
    ) -> Result<Response<pb::ListAuditHeadsResponse>, Status> {
        require_admin(&req)?;
        self.node.read_barrier().await.map_err(status)?;
        Ok(Response::new(self.node.with_state(|s| ledger::audit_heads(s.ledger()))))
    }

    async fn reset_audit_head(
        &self,
        req: Request<pb::ResetAuditHeadRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        let frontend = req.into_inner().frontend;
        let at_ms = unix_ms();
        tracing::warn!(frontend, "audit head reset by an operator: a new chain may start");
        self.write(&by, Command::ResetAuditHead { frontend, at_ms }).await
    }

    async fn forget_node(&self, req: Request<pb::ForgetNodeRequest>) -> Result<Response<pb::WriteResponse>, Status> {
        let by = admin_id(&req)?;
        let pb::ForgetNodeRequest { role, node_id } = req.into_inner();
        tracing::warn!(role, node_id, by, "node forgotten by an operator: its id may enroll again");
        self.write(&by, Command::ForgetNode { role, node_id }).await
    }

    async fn get_data_keys(
        &self,
        req: Request<pb::GetDataKeysRequest>,
    ) -> Result<Response<pb::GetDataKeysResponse>, Status> {
        let by = admin_id(&req)?;
        let project = req.into_inner().project;
        self.record_read(&by, format!("data_keys:{project}")).await?;
        Ok(Response::new(self.node.with_state(|s| ledger::data_keys(s.ledger(), &project))))
    }
}
