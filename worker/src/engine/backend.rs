//! Where a step's forward pass runs: the CPU kernels over a host KV store, or (the `cuda` feature) a GPU holding
//! the weights and the KV cache. The scheduler, block pool, sampling and grammar masks are the same either way.

use crate::device::Device;
use crate::kv::pool::BlockId;
use crate::kv::window::KvLayout;
use crate::model::LoadedModel;
use crate::model::llama::{BatchItem, KvStore};

/// A device that cannot run the model.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A CUDA device in a build without the `cuda` feature.
    #[error("{0} needs a zl-worker built with CUDA support (cargo build --release -p zl-worker --features cuda)")]
    NotBuilt(Device),
    /// A KV cache type the device's kernels do not have.
    #[error("--kv-dtype {name} is CPU-only in this build: use --kv-dtype f16 on {1}", name = .0.name())]
    KvDtype(crate::kv::dtype::KvDtype, Device),
    /// The GPU could not take the model.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Gpu(#[from] crate::gpu::GpuError),
}

/// The forward pass's device and KV storage.
#[derive(Debug)]
pub enum Backend {
    /// CPU kernels; keys and values in host memory.
    Cpu(KvStore),
    /// A GPU.
    #[cfg(feature = "cuda")]
    Cuda(Box<crate::gpu::GpuModel>),
}

impl Backend {
    /// Storage for `layout`'s blocks of `block_size` tokens on `device` (the model's weights go there too).
    pub fn new(
        model: &LoadedModel,
        device: Device,
        layout: &KvLayout,
        block_size: usize,
    ) -> Result<Backend, DeviceError> {
        match device {
            Device::Cpu => Ok(Backend::Cpu(KvStore::with_layout(model.llama.config(), layout, block_size))),
            #[cfg(feature = "cuda")]
            Device::Cuda(_) if layout.dtype != crate::kv::dtype::KvDtype::F16 => {
                Err(DeviceError::KvDtype(layout.dtype, device))
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(n) => {
                Ok(Backend::Cuda(Box::new(crate::gpu::GpuModel::new(&model.llama, n, layout, block_size)?)))
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => Err(DeviceError::NotBuilt(device)),
        }
    }

    /// One step's logits (see [`crate::model::llama::Llama::forward`]).
    pub fn forward(&mut self, model: &LoadedModel, items: &[BatchItem<'_>]) -> Vec<f32> {
        match self {
            Backend::Cpu(kv) => model.llama.forward(items, kv),
            #[cfg(feature = "cuda")]
            Backend::Cuda(gpu) => gpu.forward(&model.llama, items).unwrap_or_else(|e| fail(gpu, &e)),
        }
    }

    /// Bytes one block's keys and values take across every layer, as the lower tiers keep them; `None` when the
    /// layers' blocks differ (sliding-window layers kept apart), which the tiers do not keep.
    pub fn block_bytes(&self) -> Option<usize> {
        match self {
            Backend::Cpu(kv) => kv.block_bytes(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(gpu) => gpu.block_bytes(),
        }
    }

    /// Block `block`'s keys and values, for a lower tier.
    pub fn export(&self, block: BlockId) -> Vec<u8> {
        match self {
            Backend::Cpu(kv) => kv.export(block),
            #[cfg(feature = "cuda")]
            Backend::Cuda(gpu) => gpu.export_block(block).unwrap_or_else(|e| fail(gpu, &e)),
        }
    }

    /// Write a lower tier's copy of a block into block `block`.
    pub fn import(&mut self, block: BlockId, payload: &[u8]) {
        match self {
            Backend::Cpu(kv) => kv.import(block, payload),
            #[cfg(feature = "cuda")]
            Backend::Cuda(gpu) => {
                if let Err(e) = gpu.import_block(block, payload) {
                    fail(gpu, &e)
                }
            }
        }
    }

    /// GPU memory, when on a GPU: (free, total) bytes.
    pub fn device_memory(&self) -> Option<(u64, u64)> {
        match self {
            Backend::Cpu(_) => None,
            #[cfg(feature = "cuda")]
            Backend::Cuda(gpu) => gpu.memory().ok().map(|m| (m.free, m.total)),
        }
    }
}

/// A device that fails mid-step (lost, out of memory) leaves the batch's KV state unknown: the worker exits so that
/// its supervisor restarts it, and frontends retry its requests elsewhere.
#[cfg(feature = "cuda")]
fn fail(gpu: &crate::gpu::GpuModel, e: &crate::gpu::GpuError) -> ! {
    tracing::error!(error = %e, device = gpu.name(), "the GPU failed; exiting");
    eprintln!("zl-worker: the GPU failed: {e}");
    std::process::exit(70);
}
