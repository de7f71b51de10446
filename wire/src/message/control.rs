//! Control-plane messages: handshake, worker registration, load reports and KV-cache events.
//!
//! Owned, checked Rust values and their conversion to and from verified FlatBuffers tables. Nothing here does IO.

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use super::check::{self, invalid};
use super::{MessageError, fb};

/// A node's id: a lowercase DNS label (1 to 63 bytes of `a-z`, `0-9`, `-`, not starting or ending with `-`), so it
/// can appear in certificate names (`{id}.{role}.zl.internal`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodeId(String);

impl TryFrom<String> for NodeId {
    type Error = MessageError;
    fn try_from(id: String) -> Result<Self, MessageError> {
        NodeId::new(id)
    }
}

impl From<NodeId> for String {
    fn from(id: NodeId) -> String {
        id.0
    }
}

impl NodeId {
    /// Check and wrap a node id.
    pub fn new(id: impl Into<String>) -> Result<NodeId, MessageError> {
        let id = id.into();
        Self::check("node_id", &id)?;
        Ok(NodeId(id))
    }

    fn check(field: &'static str, id: &str) -> Result<(), MessageError> {
        let label_ok = !id.is_empty()
            && id.len() <= check::MAX_NODE_ID_LEN
            && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !id.starts_with('-')
            && !id.ends_with('-');
        if label_ok {
            Ok(())
        } else {
            Err(invalid(field, format!("{id:?} is not a lowercase DNS label of 1 to 63 bytes")))
        }
    }

    pub(crate) fn read(field: &'static str, id: &str) -> Result<NodeId, MessageError> {
        Self::check(field, id)?;
        Ok(NodeId(id.to_owned()))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which tier a peer belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The HTTP frontend.
    Frontend,
    /// An orchestrator (routing state, Raft member).
    Orchestrator,
    /// A worker running models.
    Worker,
    /// Operator tooling.
    Admin,
    /// A shared bootstrap credential. Its node id names the role it may enroll (`worker` or `frontend`); it may
    /// only ask an orchestrator for a certificate for a node id never enrolled before, and is never one of
    /// [`Role::ALL`], so no server admits it unless it lists it.
    Bootstrap,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 4] = [Role::Frontend, Role::Orchestrator, Role::Worker, Role::Admin];

    /// Lowercase name, as used in certificate names and logs.
    pub fn name(self) -> &'static str {
        match self {
            Role::Frontend => "frontend",
            Role::Orchestrator => "orchestrator",
            Role::Worker => "worker",
            Role::Admin => "admin",
            Role::Bootstrap => "bootstrap",
        }
    }

    /// Parse a lowercase name.
    pub fn from_name(name: &str) -> Option<Role> {
        Role::ALL.into_iter().chain([Role::Bootstrap]).find(|r| r.name() == name)
    }

    pub(crate) fn to_wire(self) -> fb::Role {
        match self {
            Role::Frontend => fb::Role::Frontend,
            Role::Orchestrator => fb::Role::Orchestrator,
            Role::Worker => fb::Role::Worker,
            Role::Admin => fb::Role::Admin,
            Role::Bootstrap => fb::Role::Bootstrap,
        }
    }

    pub(crate) fn from_wire(field: &'static str, role: fb::Role) -> Result<Role, MessageError> {
        match role {
            fb::Role::Frontend => Ok(Role::Frontend),
            fb::Role::Orchestrator => Ok(Role::Orchestrator),
            fb::Role::Worker => Ok(Role::Worker),
            fb::Role::Admin => Ok(Role::Admin),
            fb::Role::Bootstrap => Ok(Role::Bootstrap),
            other => Err(invalid(field, format!("unknown role {}", other.0))),
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A compute pool, and a worker's device class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ComputePool {
    /// Accelerator-resident models.
    Gpu,
    /// Part accelerator, part host memory.
    Hybrid,
    /// Host CPU only.
    Cpu,
}

impl ComputePool {
    /// Lowercase name, as in the `x-zl-compute-path` header.
    pub fn name(self) -> &'static str {
        match self {
            ComputePool::Gpu => "gpu",
            ComputePool::Hybrid => "hybrid",
            ComputePool::Cpu => "cpu",
        }
    }

    pub(crate) fn to_wire(self) -> fb::ComputePool {
        match self {
            ComputePool::Gpu => fb::ComputePool::Gpu,
            ComputePool::Hybrid => fb::ComputePool::Hybrid,
            ComputePool::Cpu => fb::ComputePool::Cpu,
        }
    }

    pub(crate) fn from_wire(field: &'static str, pool: fb::ComputePool) -> Result<ComputePool, MessageError> {
        match pool {
            fb::ComputePool::Gpu => Ok(ComputePool::Gpu),
            fb::ComputePool::Hybrid => Ok(ComputePool::Hybrid),
            fb::ComputePool::Cpu => Ok(ComputePool::Cpu),
            other => Err(invalid(field, format!("unknown compute pool {}", other.0))),
        }
    }
}

/// First frame on a connection, in each direction.
#[derive(Clone, Debug, PartialEq)]
pub struct Handshake {
    /// Sender's protocol major version.
    pub protocol_major: u16,
    /// Sender's protocol minor version.
    pub protocol_minor: u16,
    /// Sender's tier.
    pub role: Role,
    /// Sender's node id.
    pub node_id: NodeId,
    /// Sender's build, for logs.
    pub software_version: String,
}

impl Handshake {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::text("Handshake.software_version", &self.software_version, 0, check::MAX_ID_LEN)
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::Handshake<'b>> {
        let node_id = fbb.create_string(self.node_id.as_str());
        let software_version = fbb.create_string(&self.software_version);
        fb::Handshake::create(
            fbb,
            &fb::HandshakeArgs {
                protocol_major: self.protocol_major,
                protocol_minor: self.protocol_minor,
                role: self.role.to_wire(),
                node_id: Some(node_id),
                software_version: Some(software_version),
            },
        )
    }

    pub(crate) fn read(t: fb::Handshake<'_>) -> Result<Self, MessageError> {
        let msg = Handshake {
            protocol_major: t.protocol_major(),
            protocol_minor: t.protocol_minor(),
            role: Role::from_wire("Handshake.role", t.role())?,
            node_id: NodeId::read("Handshake.node_id", t.node_id())?,
            software_version: t.software_version().unwrap_or_default().to_owned(),
        };
        msg.check()?;
        Ok(msg)
    }
}

/// One model a worker serves.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInfo {
    /// Model id as clients name it.
    pub id: String,
    /// SHA-256 of the weights.
    pub weights_sha256: [u8; 32],
    /// Context window in tokens.
    pub context_length: u32,
    /// Architecture family, e.g. "llama".
    pub family: String,
    /// Memory its weights take on the worker, bytes (0: not reported).
    pub weights_bytes: u64,
    /// An embedding model: the width of its vectors (0: a generative model).
    pub embedding_dims: u32,
}

impl ModelInfo {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::id("ModelInfo.id", &self.id)?;
        check::text("ModelInfo.family", &self.family, 0, check::MAX_ID_LEN)?;
        if self.context_length == 0 {
            return Err(invalid("ModelInfo.context_length", "must be at least 1"));
        }
        if self.embedding_dims > super::MAX_EMBED_DIMS {
            return Err(invalid("ModelInfo.embedding_dims", format!("above {}", super::MAX_EMBED_DIMS)));
        }
        Ok(())
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::ModelInfo<'b>> {
        let id = fbb.create_string(&self.id);
        let sha = fbb.create_vector(&self.weights_sha256);
        let family = fbb.create_string(&self.family);
        fb::ModelInfo::create(
            fbb,
            &fb::ModelInfoArgs {
                id: Some(id),
                weights_sha256: Some(sha),
                context_length: self.context_length,
                family: Some(family),
                weights_bytes: self.weights_bytes,
                embedding_dims: self.embedding_dims,
            },
        )
    }

    pub(crate) fn read(t: fb::ModelInfo<'_>) -> Result<Self, MessageError> {
        let msg = ModelInfo {
            id: t.id().to_owned(),
            weights_sha256: check::sha256("ModelInfo.weights_sha256", t.weights_sha256().bytes())?,
            context_length: t.context_length(),
            family: t.family().unwrap_or_default().to_owned(),
            weights_bytes: t.weights_bytes(),
            embedding_dims: t.embedding_dims(),
        };
        msg.check()?;
        Ok(msg)
    }
}

/// A worker announces itself and its models.
#[derive(Clone, Debug, PartialEq)]
pub struct RegisterWorker {
    /// Stable worker id.
    pub worker_id: NodeId,
    /// host:port of the worker's QUIC endpoint.
    pub endpoint: String,
    /// The pool the worker serves.
    pub device_class: ComputePool,
    /// Models served (1 to `MAX_MODELS`).
    pub models: Vec<ModelInfo>,
    /// Tokens per KV block.
    pub kv_block_size: u32,
    /// KV blocks in the pool.
    pub kv_blocks_total: u32,
    /// Concurrent sequences before queueing.
    pub max_running_sequences: u32,
    /// How the KV cache stores keys and values: "f16", "q8" or "q4" (empty from workers before 1.7; "q4" since
    /// 1.10).
    pub kv_dtype: String,
    /// Bytes one token's keys and values take (0 from workers before 1.7).
    pub kv_bytes_per_token: u32,
}

impl RegisterWorker {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::endpoint("RegisterWorker.endpoint", &self.endpoint)?;
        if self.models.is_empty() {
            return Err(invalid("RegisterWorker.models", "a worker must serve at least one model"));
        }
        check::count("RegisterWorker.models", self.models.len(), check::MAX_MODELS)?;
        for m in &self.models {
            m.check()?;
        }
        if self.kv_block_size == 0 {
            return Err(invalid("RegisterWorker.kv_block_size", "must be at least 1"));
        }
        if self.max_running_sequences == 0 {
            return Err(invalid("RegisterWorker.max_running_sequences", "must be at least 1"));
        }
        if !matches!(self.kv_dtype.as_str(), "" | "f16" | "q8" | "q4") {
            return Err(invalid("RegisterWorker.kv_dtype", "must be f16, q8 or q4"));
        }
        Ok(())
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::RegisterWorker<'b>> {
        let worker_id = fbb.create_string(self.worker_id.as_str());
        let endpoint = fbb.create_string(&self.endpoint);
        let models: Vec<_> = self.models.iter().map(|m| m.write(fbb)).collect();
        let models = fbb.create_vector(&models);
        let kv_dtype = (!self.kv_dtype.is_empty()).then(|| fbb.create_string(&self.kv_dtype));
        fb::RegisterWorker::create(
            fbb,
            &fb::RegisterWorkerArgs {
                worker_id: Some(worker_id),
                endpoint: Some(endpoint),
                device_class: self.device_class.to_wire(),
                models: Some(models),
                kv_block_size: self.kv_block_size,
                kv_blocks_total: self.kv_blocks_total,
                max_running_sequences: self.max_running_sequences,
                kv_dtype,
                kv_bytes_per_token: self.kv_bytes_per_token,
            },
        )
    }

    pub(crate) fn read(t: fb::RegisterWorker<'_>) -> Result<Self, MessageError> {
        check::count("RegisterWorker.models", t.models().len(), check::MAX_MODELS)?;
        let msg = RegisterWorker {
            worker_id: NodeId::read("RegisterWorker.worker_id", t.worker_id())?,
            endpoint: t.endpoint().to_owned(),
            device_class: ComputePool::from_wire("RegisterWorker.device_class", t.device_class())?,
            models: t.models().iter().map(ModelInfo::read).collect::<Result<_, _>>()?,
            kv_block_size: t.kv_block_size(),
            kv_blocks_total: t.kv_blocks_total(),
            max_running_sequences: t.max_running_sequences(),
            kv_dtype: t.kv_dtype().unwrap_or_default().to_owned(),
            kv_bytes_per_token: t.kv_bytes_per_token(),
        };
        msg.check()?;
        Ok(msg)
    }
}

/// A worker leaves the cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct DeregisterWorker {
    /// The leaving worker.
    pub worker_id: NodeId,
    /// Free text for logs.
    pub reason: String,
}

impl DeregisterWorker {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::text("DeregisterWorker.reason", &self.reason, 0, check::MAX_REASON_LEN)
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::DeregisterWorker<'b>> {
        let worker_id = fbb.create_string(self.worker_id.as_str());
        let reason = fbb.create_string(&self.reason);
        fb::DeregisterWorker::create(
            fbb,
            &fb::DeregisterWorkerArgs { worker_id: Some(worker_id), reason: Some(reason) },
        )
    }

    pub(crate) fn read(t: fb::DeregisterWorker<'_>) -> Result<Self, MessageError> {
        let msg = DeregisterWorker {
            worker_id: NodeId::read("DeregisterWorker.worker_id", t.worker_id())?,
            reason: t.reason().unwrap_or_default().to_owned(),
        };
        msg.check()?;
        Ok(msg)
    }
}

/// Positive answer to a control call.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Ack {
    /// Raft index at which the change was committed, 0 when not replicated.
    pub applied_index: u64,
    /// On the answer to a load report: the worker is to hand its running requests over (`zl admin drain
    /// --migrate`).
    pub hand_over: bool,
}

impl Ack {
    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::Ack<'b>> {
        fb::Ack::create(fbb, &fb::AckArgs { applied_index: self.applied_index, hand_over: self.hand_over })
    }

    pub(crate) fn read(t: fb::Ack<'_>) -> Result<Self, MessageError> {
        Ok(Ack { applied_index: t.applied_index(), hand_over: t.hand_over() })
    }
}

/// A worker's load; also its heartbeat.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadReport {
    /// Reporting worker.
    pub worker_id: NodeId,
    /// Monotonic per worker process.
    pub sequence: u64,
    /// Requests waiting to run.
    pub queue_depth: u32,
    /// Sequences in the running batch.
    pub running_sequences: u32,
    /// KV blocks in use or cached.
    pub kv_blocks_used: u32,
    /// KV blocks free.
    pub kv_blocks_free: u32,
    /// Unused slots in allocated blocks / allocated slots, in [0, 1].
    pub fragmentation_ratio: f32,
    /// Output tokens per second.
    pub tokens_per_second: f32,
    /// GPU memory in bytes (0 on a CPU).
    pub vram_total_bytes: u64,
    /// GPU memory free in bytes (0 on a CPU).
    pub vram_free_bytes: u64,
    /// KV blocks of prompt tokens admitted but not computed yet (0 from workers before protocol 1.6).
    pub queued_prefill_blocks: u32,
    /// LoRA adapters resident now, by registered name (protocol 1.8).
    pub adapters: Vec<String>,
}

impl LoadReport {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::range("LoadReport.fragmentation_ratio", self.fragmentation_ratio, 0.0, 1.0)?;
        check::range("LoadReport.tokens_per_second", self.tokens_per_second, 0.0, f32::MAX)?;
        if self.vram_free_bytes > self.vram_total_bytes {
            return Err(invalid("LoadReport.vram_free_bytes", "more free than in all"));
        }
        check::count("LoadReport.adapters", self.adapters.len(), check::MAX_ADAPTERS)?;
        self.adapters.iter().try_for_each(|a| check::id("LoadReport.adapters", a))
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::LoadReport<'b>> {
        let worker_id = fbb.create_string(self.worker_id.as_str());
        let adapters: Vec<_> = self.adapters.iter().map(|a| fbb.create_string(a)).collect();
        let adapters = (!adapters.is_empty()).then(|| fbb.create_vector(&adapters));
        fb::LoadReport::create(
            fbb,
            &fb::LoadReportArgs {
                worker_id: Some(worker_id),
                sequence: self.sequence,
                queue_depth: self.queue_depth,
                running_sequences: self.running_sequences,
                kv_blocks_used: self.kv_blocks_used,
                kv_blocks_free: self.kv_blocks_free,
                fragmentation_ratio: self.fragmentation_ratio,
                tokens_per_second: self.tokens_per_second,
                vram_total_bytes: self.vram_total_bytes,
                vram_free_bytes: self.vram_free_bytes,
                queued_prefill_blocks: self.queued_prefill_blocks,
                adapters,
            },
        )
    }

    pub(crate) fn read(t: fb::LoadReport<'_>) -> Result<Self, MessageError> {
        let msg = LoadReport {
            worker_id: NodeId::read("LoadReport.worker_id", t.worker_id())?,
            sequence: t.sequence(),
            queue_depth: t.queue_depth(),
            running_sequences: t.running_sequences(),
            kv_blocks_used: t.kv_blocks_used(),
            kv_blocks_free: t.kv_blocks_free(),
            fragmentation_ratio: t.fragmentation_ratio(),
            tokens_per_second: t.tokens_per_second(),
            vram_total_bytes: t.vram_total_bytes(),
            vram_free_bytes: t.vram_free_bytes(),
            queued_prefill_blocks: t.queued_prefill_blocks(),
            adapters: {
                let list = t.adapters().unwrap_or_default();
                check::count("LoadReport.adapters", list.len(), check::MAX_ADAPTERS)?;
                list.iter().map(str::to_owned).collect()
            },
        };
        msg.check()?;
        Ok(msg)
    }
}

/// Changes to a worker's cached prefix blocks.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCacheEvents {
    /// Reporting worker.
    pub worker_id: NodeId,
    /// Monotonic per worker process.
    pub sequence: u64,
    /// Model the blocks belong to.
    pub model: String,
    /// Block hashes now cached.
    pub stored: Vec<u64>,
    /// Block hashes evicted.
    pub evicted: Vec<u64>,
    /// Forget every cached block before applying `stored`.
    pub cleared: bool,
    /// Block hashes no longer in the worker's KV cache but kept in its host-memory tier.
    pub host: Vec<u64>,
    /// Block hashes kept only on its disk tier now.
    pub disk: Vec<u64>,
}

impl KvCacheEvents {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::id("KvCacheEvents.model", &self.model)
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::KvCacheEvents<'b>> {
        let worker_id = fbb.create_string(self.worker_id.as_str());
        let model = fbb.create_string(&self.model);
        let stored = fbb.create_vector(&self.stored);
        let evicted = fbb.create_vector(&self.evicted);
        let host = fbb.create_vector(&self.host);
        let disk = fbb.create_vector(&self.disk);
        fb::KvCacheEvents::create(
            fbb,
            &fb::KvCacheEventsArgs {
                worker_id: Some(worker_id),
                sequence: self.sequence,
                model: Some(model),
                stored: Some(stored),
                evicted: Some(evicted),
                cleared: self.cleared,
                host: Some(host),
                disk: Some(disk),
            },
        )
    }

    pub(crate) fn read(t: fb::KvCacheEvents<'_>) -> Result<Self, MessageError> {
        let msg = KvCacheEvents {
            worker_id: NodeId::read("KvCacheEvents.worker_id", t.worker_id())?,
            sequence: t.sequence(),
            model: t.model().to_owned(),
            stored: t.stored().map(|v| v.iter().collect()).unwrap_or_default(),
            evicted: t.evicted().map(|v| v.iter().collect()).unwrap_or_default(),
            cleared: t.cleared(),
            host: t.host().map(|v| v.iter().collect()).unwrap_or_default(),
            disk: t.disk().map(|v| v.iter().collect()).unwrap_or_default(),
        };
        msg.check()?;
        Ok(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_dns_labels() {
        for ok in ["w0", "worker-1", "a", &"x".repeat(63)] {
            assert!(NodeId::new(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-w", "w-", "Worker", "w_1", "w.1", "ü", &"x".repeat(64)] {
            assert!(NodeId::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn role_names_round_trip() {
        for role in Role::ALL {
            assert_eq!(Role::from_name(role.name()), Some(role));
        }
        assert_eq!(Role::from_name("router"), None);
    }
}
