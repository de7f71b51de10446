//! The tiers of one engine, shared between its thread (which moves blocks between the hot pool and host memory),
//! a disk writer thread (bounded queue: a full queue drops the write, never waits) and the requests' prefetches
//! (which read a prompt's blocks from disk into host memory while the request has not reached the engine yet).
//! Locks are held for index operations only, never across a file operation.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use zl_common::block_hash::{BlockHash, chain_hash};
use zl_common::sync::lock;

use super::disk::{DiskDir, DiskIndex, Opened};
use super::host::HostTier;
use super::{Namespace, Shared, Tier, TierBlock};

/// Blocks queued for the disk writer at most.
const WRITE_QUEUE: usize = 256;

/// How big the tiers are.
#[derive(Clone, Debug, Default)]
pub struct TierConfig {
    /// Host memory for evicted blocks, in bytes (0: no tiers).
    pub host_bytes: usize,
    /// The disk tier: its root directory and bound in bytes.
    pub disk: Option<(PathBuf, u64)>,
}

impl TierConfig {
    /// Whether any tier is on.
    pub fn enabled(&self) -> bool {
        self.host_bytes > 0
    }
}

struct Disk {
    dir: DiskDir,
    index: Mutex<DiskIndex>,
    /// Holds the directory's lock while the tier is open.
    _lock: std::fs::File,
}

/// An engine's tiers.
pub struct Tiers {
    ns: Namespace,
    block_size: usize,
    payload: usize,
    host: Mutex<HostTier>,
    disk: Option<Arc<Disk>>,
    writer: Option<SyncSender<Shared>>,
    /// The writer thread, joined when the tiers close (so the directory's lock is free when they are gone).
    thread: Option<std::thread::JoinHandle<()>>,
    /// Blocks queued for the writer or being written.
    pending: Arc<AtomicUsize>,
    /// Hashes that left a tier since the engine last asked (it reports those no tier or hot block holds).
    left: Arc<Mutex<Vec<BlockHash>>>,
    model: String,
}

impl std::fmt::Debug for Tiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tiers").field("namespace", &self.ns.hex()).finish_non_exhaustive()
    }
}

impl Tiers {
    /// Tiers as `config` says for blocks of `block_size` tokens and `payload` bytes of namespace `ns` (of model
    /// `model`, for the metrics): the disk tier's directory is created, or indexed again after a restart.
    pub fn open(
        ns: Namespace,
        block_size: usize,
        payload: usize,
        config: &TierConfig,
        model: &str,
    ) -> std::io::Result<(Arc<Tiers>, Option<Opened>)> {
        let left: Arc<Mutex<Vec<BlockHash>>> = Arc::default();
        let pending: Arc<AtomicUsize> = Arc::default();
        let (disk, writer, opened) = match &config.disk {
            Some((root, cap)) => {
                let dir = DiskDir::new(root, ns, block_size, payload);
                let (index, opened, lock) = dir.open(*cap)?;
                let disk = Arc::new(Disk { dir, index: Mutex::new(index), _lock: lock });
                let (tx, rx) = sync_channel::<Shared>(WRITE_QUEUE);
                let (d, left, labels) = (disk.clone(), left.clone(), labels(model, Tier::Disk));
                let queued = pending.clone();
                let thread = std::thread::Builder::new().name("kv-disk".into()).spawn(move || {
                    for block in rx {
                        write(&d, &block, &left, &labels);
                        queued.fetch_sub(1, Ordering::AcqRel);
                    }
                })?;
                (Some(disk), Some((tx, thread)), Some(opened))
            }
            None => (None, None, None),
        };
        let (writer, thread) = writer.map_or((None, None), |(tx, t)| (Some(tx), Some(t)));
        let tiers = Tiers {
            ns,
            block_size,
            payload,
            host: Mutex::new(HostTier::new(config.host_bytes)),
            disk,
            writer,
            thread,
            pending,
            left,
            model: model.to_owned(),
        };
        Ok((Arc::new(tiers), opened))
    }

    /// Their namespace.
    pub fn namespace(&self) -> Namespace {
        self.ns
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Payload bytes per block.
    pub fn payload(&self) -> usize {
        self.payload
    }

    /// Whether host memory holds `hash`.
    pub fn in_host(&self, hash: BlockHash) -> bool {
        lock(&self.host).contains(hash)
    }

    /// Whether the disk tier holds (or is writing) `hash`; false without one.
    pub fn on_disk(&self, hash: BlockHash) -> bool {
        self.disk.as_ref().is_some_and(|d| lock(&d.index).contains(hash))
    }

    /// Whether a disk tier is on (blocks are written through to it as they fill).
    pub fn has_disk(&self) -> bool {
        self.disk.is_some()
    }

    /// Block `hash` of `tokens` from host memory, for the hot pool to take back.
    pub fn take_back(&self, hash: BlockHash, tokens: &[u32]) -> Option<Shared> {
        lock(&self.host).get(hash, tokens)
    }

    /// Keep a block evicted from the hot pool in host memory (the least recently used there make room).
    pub fn keep(&self, block: TierBlock) {
        let size = block.bytes() as u64;
        let evicted = lock(&self.host).insert(Arc::new(block));
        metrics::counter!("zl_worker_kv_tier_bytes_in_total", &labels(&self.model, Tier::Host)).increment(size);
        if !evicted.is_empty() {
            lock(&self.left).extend(evicted);
        }
    }

    /// Queue a block for the disk tier (written through as it fills, so that a restart finds it); dropped when the
    /// writer is behind by a whole queue.
    pub fn persist(&self, block: TierBlock) {
        let Some(tx) = &self.writer else { return };
        self.pending.fetch_add(1, Ordering::AcqRel);
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = tx.try_send(Arc::new(block)) {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            metrics::counter!("zl_worker_kv_tier_dropped_total", &labels(&self.model, Tier::Disk)).increment(1);
        }
    }

    /// Wait (at most `limit`) for the disk writer to finish what is queued; whether it did.
    pub fn flush(&self, limit: std::time::Duration) -> bool {
        let started = Instant::now();
        while self.pending.load(Ordering::Acquire) > 0 {
            if started.elapsed() >= limit {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        true
    }

    /// Hashes that left a tier since the last call.
    pub fn drain_left(&self) -> Vec<BlockHash> {
        std::mem::take(&mut *lock(&self.left))
    }

    /// Every hash a tier holds.
    pub fn hashes(&self) -> Vec<BlockHash> {
        let mut all: Vec<BlockHash> = lock(&self.host).hashes().collect();
        if let Some(d) = &self.disk {
            all.extend(lock(&d.index).hashes());
        }
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Bring the blocks of `tokens` (in the cache scope `salt`) that continue on disk into host memory, in chain
    /// order, stopping where the chain is in neither tier (at most half of host memory's bound). Blocking (file
    /// reads): for a request that has not reached the engine yet. Returns the blocks read.
    pub fn prefetch(&self, tokens: &[u32], salt: Option<BlockHash>) -> usize {
        let Some(disk) = &self.disk else { return 0 };
        let bs = self.block_size;
        let shareable = tokens.len().saturating_sub(1) / bs;
        let budget = lock(&self.host).capacity() / 2;
        let labels = labels(&self.model, Tier::Disk);
        let (mut parent, mut read, mut bytes) = (salt, 0, 0);
        for chunk in tokens.chunks_exact(bs).take(shareable) {
            let hash = chain_hash(parent, chunk);
            parent = Some(hash);
            if lock(&self.host).contains(hash) {
                continue;
            }
            if !lock(&disk.index).touch(hash) || bytes >= budget {
                break;
            }
            let started = Instant::now();
            match disk.dir.read(hash) {
                Ok(Some(block)) if *block.tokens == *chunk => {
                    metrics::histogram!("zl_worker_kv_tier_load_seconds", &labels)
                        .record(started.elapsed().as_secs_f64());
                    metrics::counter!("zl_worker_kv_tier_bytes_out_total", &labels).increment(block.bytes() as u64);
                    bytes += block.bytes() as u64;
                    read += 1;
                    self.keep(block);
                }
                Ok(_) => break, // gone meanwhile, or a collision
                Err(e) => {
                    tracing::warn!(block = format!("{hash:016x}"), error = %e, "a disk tier block is bad: recomputed");
                    metrics::counter!("zl_worker_kv_tier_corrupt_total", &labels).increment(1);
                    lock(&disk.index).remove(hash);
                    disk.dir.delete(hash);
                    lock(&self.left).push(hash);
                    break;
                }
            }
        }
        metrics::counter!("zl_worker_kv_tier_hits_total", &labels).increment(read as u64);
        read
    }

    /// Publish the tiers' sizes.
    pub fn record(&self) {
        let host = lock(&self.host).bytes();
        metrics::gauge!("zl_worker_kv_tier_bytes", &labels(&self.model, Tier::Host)).set(host as f64);
        if let Some(d) = &self.disk {
            let bytes = lock(&d.index).bytes();
            metrics::gauge!("zl_worker_kv_tier_bytes", &labels(&self.model, Tier::Disk)).set(bytes as f64);
        }
    }

    /// (host blocks, disk blocks) held now.
    pub fn blocks(&self) -> (usize, usize) {
        (lock(&self.host).len(), self.disk.as_ref().map_or(0, |d| lock(&d.index).len()))
    }

    /// (host bytes, disk bytes) held now.
    pub fn bytes(&self) -> (u64, u64) {
        (lock(&self.host).bytes(), self.disk.as_ref().map_or(0, |d| lock(&d.index).bytes()))
    }

    /// Count `blocks` brought back from host memory into the hot pool in `seconds`.
    pub fn restored(&self, blocks: usize, seconds: f64) {
        let labels = labels(&self.model, Tier::Host);
        metrics::counter!("zl_worker_kv_tier_hits_total", &labels).increment(blocks as u64);
        metrics::counter!("zl_worker_kv_tier_bytes_out_total", &labels).increment((blocks * self.payload) as u64);
        metrics::histogram!("zl_worker_kv_tier_load_seconds", &labels).record(seconds);
    }
}

impl Drop for Tiers {
    fn drop(&mut self) {
        // The queue's end stops the writer once it has written what was queued.
        self.writer.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn labels(model: &str, tier: Tier) -> [(&'static str, String); 2] {
    [("model", model.to_owned()), ("tier", tier.name().to_owned())]
}

/// The disk writer's work for one block: room made (the least recently used files removed), the file written.
fn write(disk: &Disk, block: &TierBlock, left: &Mutex<Vec<BlockHash>>, labels: &[(&'static str, String); 2]) {
    let Some(evicted) = lock(&disk.index).admit(block.hash) else { return };
    for old in &evicted {
        disk.dir.delete(*old);
    }
    if !evicted.is_empty() {
        lock(left).extend(evicted);
    }
    match disk.dir.write(block) {
        Ok(()) => {
            metrics::counter!("zl_worker_kv_tier_bytes_in_total", labels).increment(disk.dir.file_bytes());
        }
        Err(e) => {
            tracing::warn!(error = %e, dir = %disk.dir.dir.display(), "a disk tier write failed");
            metrics::counter!("zl_worker_kv_tier_dropped_total", labels).increment(1);
            lock(&disk.index).remove(block.hash);
            disk.dir.delete(block.hash);
        }
    }
}
