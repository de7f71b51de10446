//! The forward pass on an NVIDIA GPU (`--device cuda:N`; the `cuda` feature). Our own kernels
//! (`kernels.cu`, compiled to PTX by `build.rs`, launched through cudarc) rather than candle's CUDA tensors: every
//! reduction runs in a fixed order per row, so a request gives the same tokens alone and in a batch (cuBLAS picks
//! its reduction split by shape), and no candle-kernels build (minutes of nvcc) is needed. Weights are
//! dequantized to half precision on the device at load; the paged KV cache is half precision in device memory,
//! addressed by the same block tables and prefix hashes as on the CPU (the scheduler and block pool do not know
//! where the blocks live). Embedding rows are gathered on the host (a few KB per step).
#![allow(unsafe_code)] // cudarc's kernel launches are `unsafe`: each launch below passes the arguments of the kernel
// of that name in kernels.cu, in order and of the same types, and sizes its grid to the elements it checks.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use crate::kv::window::KvLayout;
use crate::model::kernels::Weight;
use crate::model::llama::{Activation, BatchItem, Llama, logit_rows, step_rows};

/// The kernels, compiled for `$CUDA_COMPUTE_CAP` by build.rs.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx"));

/// A GPU failure: no device, a driver too old for the PTX, out of memory, a failed launch.
#[derive(Debug, thiserror::Error)]
#[error("cuda: {0}")]
pub struct GpuError(String);

fn err(e: impl std::fmt::Display) -> GpuError {
    GpuError(e.to_string())
}

/// Threads per block of every launch.
const THREADS: u32 = 256;

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u32).div_ceil(THREADS).max(1), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

struct Kernels {
    rms_norm: CudaFunction,
    matmul: CudaFunction,
    rope_store: CudaFunction,
    attention: CudaFunction,
    add: CudaFunction,
    silu_mul: CudaFunction,
    gelu_mul: CudaFunction,
}

impl Kernels {
    fn load(module: &Arc<CudaModule>) -> Result<Kernels, GpuError> {
        let f = |name: &str| module.load_function(name).map_err(|e| GpuError(format!("kernel {name}: {e}")));
        Ok(Kernels {
            rms_norm: f("rms_norm")?,
            matmul: f("matmul")?,
            rope_store: f("rope_store")?,
            attention: f("attention")?,
            add: f("add")?,
            silu_mul: f("silu_mul")?,
            gelu_mul: f("gelu_mul")?,
        })
    }
}

/// A matrix on the device: half-precision bits, row-major.
struct Matrix {
    data: CudaSlice<u16>,
    rows: usize,
    cols: usize,
}

struct DeviceLayer {
    attn_norm: CudaSlice<f32>,
    wq: Matrix,
    wk: Matrix,
    wv: Matrix,
    bias: Option<[CudaSlice<f32>; 3]>,
    /// Per-head query and key norms (Qwen3, Gemma 3).
    qk_norm: Option<[CudaSlice<f32>; 2]>,
    /// Post-attention and post-MLP norms (Gemma 3).
    post_norms: Option<[CudaSlice<f32>; 2]>,
    wo: Matrix,
    ffn_norm: CudaSlice<f32>,
    w_gate: Matrix,
    w_up: Matrix,
    w_down: Matrix,
}

/// A model resident on one GPU, with its KV cache.
pub struct GpuModel {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    k: Kernels,
    layers: Vec<DeviceLayer>,
    norm: CudaSlice<f32>,
    output: Matrix,
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
    /// The local (sliding-window) layers' RoPE tables, when they have their own base (Gemma 3).
    local_rope: Option<[CudaSlice<f32>; 2]>,
    k_cache: Vec<CudaSlice<u16>>,
    v_cache: Vec<CudaSlice<u16>>,
    block_size: usize,
    /// Width of a row of keys (kv heads x head size).
    kv_dim: usize,
    /// The last memory figures and when they were read: the engine publishes its stats every step, and the
    /// figures only need the report interval's freshness.
    memory: std::cell::Cell<Option<(std::time::Instant, Memory)>>,
    hidden: usize,
    eps: f32,
    name: String,
}

impl std::fmt::Debug for GpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuModel").field("device", &self.name).finish_non_exhaustive()
    }
}

/// A device's memory, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// Free now.
    pub free: u64,
    /// In all.
    pub total: u64,
}

impl GpuModel {
    /// Put `llama`'s weights and a KV cache of `layout`'s blocks of `block_size` tokens on device `ordinal`.
    pub fn new(llama: &Llama, ordinal: usize, layout: &KvLayout, block_size: usize) -> Result<GpuModel, GpuError> {
        // cudarc panics on first use when the driver library is missing: ask first.
        // SAFETY: only tries to open libcuda (dlopen); no CUDA call is made.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(GpuError(
                "no NVIDIA driver here (libcuda.so was not found; is this a GPU machine, and is the driver on LD_LIBRARY_PATH?)".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| GpuError(format!("device {ordinal}: {e}")))?;
        let name = ctx.name().unwrap_or_else(|_| format!("cuda:{ordinal}"));
        let stream = ctx.default_stream();
        // A driver older than the nvcc that wrote the PTX refuses its ISA version: retry with the oldest version the
        // target allows (crate::ptx).
        let module = match ctx.load_module(Ptx::from_src(PTX)) {
            Ok(m) => m,
            Err(first) => match crate::ptx::for_older_driver(PTX) {
                Some(older) => ctx.load_module(Ptx::from_src(older)).map_err(|e| {
                    GpuError(format!(
                        "loading the kernels: {first}; with the PTX version lowered for an older driver: {e}"
                    ))
                })?,
                None => return Err(GpuError(format!("loading the kernels: {first}"))),
            },
        };
        let k = Kernels::load(&module)?;
        let floats = |v: &[f32]| stream.clone_htod(v).map_err(err);
        let matrix = |w: &Weight| -> Result<Matrix, GpuError> {
            let (rows, cols) = (w.rows(), w.cols());
            let mut host = vec![0u16; rows * cols];
            let mut row = vec![0f32; cols];
            for (r, out) in host.chunks_exact_mut(cols).enumerate() {
                w.row(r, &mut row);
                for (o, &v) in out.iter_mut().zip(&row) {
                    *o = half::f16::from_f32(v).to_bits();
                }
            }
            Ok(Matrix { data: stream.clone_htod(&host).map_err(err)?, rows, cols })
        };
        let mut layers = Vec::with_capacity(llama.layers.len());
        for l in &llama.layers {
            let Some((w_gate, w_up, w_down)) = l.ffn.dense() else {
                return Err(GpuError(
                    "a mixture-of-experts model: this build runs its experts on the CPU path only (--device cpu)"
                        .into(),
                ));
            };
            layers.push(DeviceLayer {
                attn_norm: floats(&l.attn_norm)?,
                wq: matrix(&l.wq)?,
                wk: matrix(&l.wk)?,
                wv: matrix(&l.wv)?,
                bias: match &l.qkv_bias {
                    Some((q, k, v)) => Some([floats(q)?, floats(k)?, floats(v)?]),
                    None => None,
                },
                qk_norm: match &l.qk_norm {
                    Some((q, k)) => Some([floats(q)?, floats(k)?]),
                    None => None,
                },
                post_norms: match &l.post_norms {
                    Some((a, f)) => Some([floats(a)?, floats(f)?]),
                    None => None,
                },
                wo: matrix(&l.wo)?,
                ffn_norm: floats(&l.ffn_norm)?,
                w_gate: matrix(w_gate)?,
                w_up: matrix(w_up)?,
                w_down: matrix(w_down)?,
            });
        }
        let cfg = llama.config();
        let per_layer = |li: usize| layout.blocks_of(cfg.is_local(li)) * block_size * cfg.kv_dim();
        let cache = || -> Result<Vec<CudaSlice<u16>>, GpuError> {
            (0..cfg.layers).map(|li| stream.alloc_zeros::<u16>(per_layer(li)).map_err(err)).collect()
        };
        Ok(GpuModel {
            norm: floats(&llama.norm)?,
            output: matrix(llama.output.as_ref().unwrap_or(&llama.embed))?,
            cos: floats(&llama.rope.full().0)?,
            sin: floats(&llama.rope.full().1)?,
            local_rope: match &llama.local_rope {
                Some(t) => {
                    let (c, s) = t.full();
                    Some([floats(&c)?, floats(&s)?])
                }
                None => None,
            },
            k_cache: cache()?,
            v_cache: cache()?,
            layers,
            k,
            stream,
            ctx,
            block_size,
            kv_dim: cfg.kv_dim(),
            memory: std::cell::Cell::new(None),
            hidden: cfg.hidden,
            eps: cfg.rms_eps,
            name,
        })
    }

    /// Bytes one block's keys and values take across every layer, when every layer has the same blocks (no
    /// sliding-window layers kept apart); the lower tiers keep blocks of this size.
    pub fn block_bytes(&self) -> Option<usize> {
        let len = self.k_cache.first()?.len();
        self.k_cache.iter().all(|c| c.len() == len).then(|| 2 * 2 * self.k_cache.len() * self.block_size * self.kv_dim)
    }

    /// Block `block`'s keys and values of every layer, copied to host memory in the CPU store's f16 export layout
    /// (each layer's keys, then its values; f16 bits, little-endian), so a block moves between the tiers alike.
    pub fn export_block(&self, block: u32) -> Result<Vec<u8>, GpuError> {
        let per = self.block_size * self.kv_dim;
        let range = block as usize * per..(block as usize + 1) * per;
        let mut out = Vec::with_capacity(self.block_bytes().unwrap_or(0));
        for (k, v) in self.k_cache.iter().zip(&self.v_cache) {
            for plane in [k, v] {
                let host = self.stream.clone_dtoh(&plane.slice(range.clone())).map_err(err)?;
                host.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
            }
        }
        self.stream.synchronize().map_err(err)?;
        Ok(out)
    }

    /// Write what [`GpuModel::export_block`] gave into block `block`.
    pub fn import_block(&mut self, block: u32, payload: &[u8]) -> Result<(), GpuError> {
        let per = self.block_size * self.kv_dim;
        let range = block as usize * per..(block as usize + 1) * per;
        let values: Vec<u16> = payload.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
        assert_eq!(values.len(), 2 * per * self.k_cache.len(), "a block payload of another shape");
        let mut planes = values.chunks_exact(per);
        for (k, v) in self.k_cache.iter_mut().zip(&mut self.v_cache) {
            for plane in [k, v] {
                let src = planes.next().expect("two planes a layer");
                self.stream.memcpy_htod(src, &mut plane.slice_mut(range.clone())).map_err(err)?;
            }
        }
        self.stream.synchronize().map_err(err)
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's memory, read again at most every 200 ms.
    pub fn memory(&self) -> Result<Memory, GpuError> {
        if let Some((at, m)) = self.memory.get()
            && at.elapsed() < std::time::Duration::from_millis(200)
        {
            return Ok(m);
        }
        let (free, total) = self.ctx.mem_get_info().map_err(err)?;
        let m = Memory { free: free as u64, total: total as u64 };
        self.memory.set(Some((std::time::Instant::now(), m)));
        Ok(m)
    }

    fn matmul(
        &self,
        x: &CudaSlice<f32>,
        w: &Matrix,
        bias: Option<&CudaSlice<f32>>,
        rows: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let (rows_i, k, n) = (rows as i32, w.cols as i32, w.rows as i32);
        let null = 0u64;
        let mut b = self.stream.launch_builder(&self.k.matmul);
        b.arg(x).arg(&w.data);
        match bias {
            Some(bias) => b.arg(bias),
            None => b.arg(&null),
        };
        b.arg(out).arg(&rows_i).arg(&k).arg(&n);
        unsafe { b.launch(grid(rows * w.rows)) }.map(drop).map_err(err)
    }

    /// RMSNorm of `rows` hidden-state rows of `x` (the rows `src` lists, or the first ones) with weight `w`.
    fn rms_norm(
        &self,
        x: &CudaSlice<f32>,
        src: Option<&CudaSlice<i32>>,
        w: &CudaSlice<f32>,
        rows: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        self.rms_norm_width(x, src, w, rows, self.hidden, out)
    }

    /// RMSNorm of `rows` rows of `width` values (per-head norms use the head width).
    fn rms_norm_width(
        &self,
        x: &CudaSlice<f32>,
        src: Option<&CudaSlice<i32>>,
        w: &CudaSlice<f32>,
        rows: usize,
        width: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let (rows_i, width_i, eps) = (rows as i32, width as i32, self.eps);
        let null = 0u64;
        let mut b = self.stream.launch_builder(&self.k.rms_norm);
        b.arg(x);
        match src {
            Some(src) => b.arg(src),
            None => b.arg(&null),
        };
        b.arg(w).arg(&eps).arg(out).arg(&rows_i).arg(&width_i);
        unsafe { b.launch(grid(rows)) }.map(drop).map_err(err)
    }

    fn elementwise(
        &self,
        f: &CudaFunction,
        x: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), GpuError> {
        let n_i = n as i64;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(y).arg(&n_i);
        unsafe { b.launch(grid(n)) }.map(drop).map_err(err)
    }

    /// [`Llama::forward`] on the device: the same items, the same logits rows (close to the CPU's, not the same
    /// bits: docs/worker.md).
    pub fn forward(&self, llama: &Llama, items: &[BatchItem<'_>]) -> Result<Vec<f32>, GpuError> {
        let cfg = llama.config();
        let (h, hd, kvd) = (cfg.hidden, cfg.head_dim, cfg.kv_dim());
        let qd = cfg.heads * hd;
        let (row_item, row_pos) = step_rows(items);
        let n = row_item.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        assert!(row_pos.iter().all(|&p| p < cfg.context_length), "position beyond the context window");
        let slot = |blocks: &[u32], pos: usize| {
            ((blocks[pos / self.block_size] as usize * self.block_size + pos % self.block_size) * kvd) as i64
        };
        // Embeddings on the host; the rows' own slots; every row's attended slots, flattened.
        let mut x_host = vec![0f32; n * h];
        let mut r = 0;
        for item in items {
            for &tok in item.tokens {
                llama.embed.row((tok as usize).min(cfg.vocab - 1), &mut x_host[r * h..(r + 1) * h]);
                r += 1;
            }
        }
        if let Some(scale) = cfg.embed_scale {
            x_host.iter_mut().for_each(|v| *v *= scale);
        }
        // A row's table in a layer: the sliding-window layers' own, where the item has one.
        let table = |r: usize, local: bool| {
            let item = &items[row_item[r]];
            if local && !item.window_blocks.is_empty() { item.window_blocks } else { item.blocks }
        };
        let own: Vec<i64> = (0..n).map(|r| slot(table(r, false), row_pos[r])).collect();
        let own_local: Option<Vec<i64>> = items
            .iter()
            .any(|it| !it.window_blocks.is_empty())
            .then(|| (0..n).map(|r| slot(table(r, true), row_pos[r])).collect());
        // Every row's attended slots over all earlier positions, or over a sliding window's (local layers).
        let attended = |window: usize, local: bool| {
            let (mut att, mut start, mut len) = (Vec::new(), Vec::with_capacity(n), Vec::with_capacity(n));
            for (r, &pos) in row_pos.iter().enumerate() {
                let first = (pos + 1).saturating_sub(window);
                start.push(att.len() as i32);
                len.push((pos + 1 - first) as i32);
                att.extend((first..=pos).map(|p| slot(table(r, local), p)));
            }
            (att, start, len)
        };
        let (att, start, len) = attended(usize::MAX, false);
        let max_len = row_pos.iter().max().map_or(1, |p| p + 1);
        let s = &self.stream;
        let up = |v: &[f32]| s.clone_htod(v).map_err(err);
        let zeros = |len: usize| s.alloc_zeros::<f32>(len).map_err(err);
        let mut x = up(&x_host)?;
        let pos_d = s.clone_htod(&row_pos.iter().map(|&p| p as i32).collect::<Vec<i32>>()).map_err(err)?;
        let own_d = s.clone_htod(&own).map_err(err)?;
        let own_local_d = match &own_local {
            Some(own) => Some(s.clone_htod(own).map_err(err)?),
            None => None,
        };
        let att_d = s.clone_htod(&att).map_err(err)?;
        let start_d = s.clone_htod(&start).map_err(err)?;
        let len_d = s.clone_htod(&len).map_err(err)?;
        let local_d = match cfg.sliding {
            Some(w) => {
                let (att, start, len) = attended(w.window.max(1), true);
                let up = |v: &[i32]| s.clone_htod(v).map_err(err);
                Some((s.clone_htod(&att).map_err(err)?, up(&start)?, up(&len)?))
            }
            None => None,
        };
        let (mut hbuf, mut q, mut k, mut v) = (zeros(n * h)?, zeros(n * qd)?, zeros(n * kvd)?, zeros(n * kvd)?);
        let (mut attn, mut proj) = (zeros(n * qd)?, zeros(n * h)?);
        let (mut gate, mut upb) = (zeros(n * cfg.intermediate)?, zeros(n * cfg.intermediate)?);
        let mut scratch = zeros(n * cfg.heads * max_len)?;
        let (n_i, heads_i, kv_heads_i, hd_i, max_len_i) =
            (n as i32, cfg.heads as i32, cfg.kv_heads as i32, hd as i32, max_len as i32);
        let interleaved = i32::from(cfg.rope_interleaved);
        let rotary_i = cfg.rotary() as i32;
        let attention_scale = cfg.attention_scale();
        for (li, layer) in self.layers.iter().enumerate() {
            let local = cfg.is_local(li);
            let (cos, sin) = match (&self.local_rope, local) {
                (Some([c, s]), true) => (c, s),
                _ => (&self.cos, &self.sin),
            };
            let (att_l, start_l, len_l) = match (&local_d, local) {
                (Some((a, st, l)), true) => (a, st, l),
                _ => (&att_d, &start_d, &len_d),
            };
            self.rms_norm(&x, None, &layer.attn_norm, n, &mut hbuf)?;
            let bias = layer.bias.as_ref();
            self.matmul(&hbuf, &layer.wq, bias.map(|b| &b[0]), n, &mut q)?;
            self.matmul(&hbuf, &layer.wk, bias.map(|b| &b[1]), n, &mut k)?;
            self.matmul(&hbuf, &layer.wv, bias.map(|b| &b[2]), n, &mut v)?;
            if let Some([qn, kn]) = &layer.qk_norm {
                // Every head of every row is a row of `hd` values for the norm (or every row one, for a norm as
                // wide as the row: OLMoE's).
                self.rms_norm_width(&q, None, qn, n * cfg.heads * hd / qn.len(), qn.len(), &mut attn)?;
                std::mem::swap(&mut q, &mut attn);
                let mut normed = zeros(n * kvd)?;
                self.rms_norm_width(&k, None, kn, n * kvd / kn.len(), kn.len(), &mut normed)?;
                k = normed;
            }
            {
                let mut b = s.launch_builder(&self.k.rope_store);
                let own_l = if local { own_local_d.as_ref().unwrap_or(&own_d) } else { &own_d };
                b.arg(&mut q).arg(&mut k).arg(&v).arg(&pos_d).arg(own_l).arg(cos).arg(sin);
                b.arg(&self.k_cache[li]).arg(&self.v_cache[li]);
                b.arg(&n_i).arg(&heads_i).arg(&kv_heads_i).arg(&hd_i).arg(&rotary_i).arg(&interleaved);
                unsafe { b.launch(grid(n)) }.map_err(err)?;
            }
            {
                let mut b = s.launch_builder(&self.k.attention);
                b.arg(&q).arg(&self.k_cache[li]).arg(&self.v_cache[li]).arg(att_l).arg(start_l).arg(len_l);
                b.arg(&mut scratch).arg(&mut attn);
                b.arg(&n_i).arg(&heads_i).arg(&kv_heads_i).arg(&hd_i).arg(&max_len_i).arg(&attention_scale);
                unsafe { b.launch(grid(n * cfg.heads)) }.map_err(err)?;
            }
            self.matmul(&attn, &layer.wo, None, n, &mut proj)?;
            if let Some([post, _]) = &layer.post_norms {
                self.rms_norm(&proj, None, post, n, &mut hbuf)?;
                std::mem::swap(&mut proj, &mut hbuf);
            }
            self.elementwise(&self.k.add, &mut x, &proj, n * h)?;
            self.rms_norm(&x, None, &layer.ffn_norm, n, &mut hbuf)?;
            self.matmul(&hbuf, &layer.w_gate, None, n, &mut gate)?;
            self.matmul(&hbuf, &layer.w_up, None, n, &mut upb)?;
            let activation = match cfg.activation {
                Activation::Silu => &self.k.silu_mul,
                Activation::GeluTanh => &self.k.gelu_mul,
            };
            self.elementwise(activation, &mut gate, &upb, n * cfg.intermediate)?;
            self.matmul(&gate, &layer.w_down, None, n, &mut proj)?;
            if let Some([_, post]) = &layer.post_norms {
                self.rms_norm(&proj, None, post, n, &mut hbuf)?;
                std::mem::swap(&mut proj, &mut hbuf);
            }
            self.elementwise(&self.k.add, &mut x, &proj, n * h)?;
        }
        let last_rows: Vec<i32> = logit_rows(items).into_iter().map(|r| r as i32).collect();
        if last_rows.is_empty() {
            s.synchronize().map_err(err)?;
            return Ok(Vec::new());
        }
        let m = last_rows.len();
        let src = s.clone_htod(&last_rows).map_err(err)?;
        let mut normed = zeros(m * h)?;
        self.rms_norm(&x, Some(&src), &self.norm, m, &mut normed)?;
        let mut logits = zeros(m * cfg.vocab)?;
        self.matmul(&normed, &self.output, None, m, &mut logits)?;
        s.clone_dtoh(&logits).map_err(err)
    }
}
