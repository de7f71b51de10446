//! How the KV cache stores keys and values: IEEE half precision, or 8-bit or 4-bit blocks (`--kv-dtype`).

/// Values per 8-bit or 4-bit block (one f16 scale each).
pub const Q8_BLOCK: usize = 32;

/// How the KV cache stores keys and values (`--kv-dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum KvDtype {
    /// IEEE half precision: 2 bytes a value.
    #[default]
    F16,
    /// 8-bit blocks of 32 values with an f16 scale: 34 bytes per 32 values.
    Q8,
    /// 4-bit blocks of 32 values with an f16 scale (llama.cpp's `q4_0`): 18 bytes per 32 values, 3.56x the tokens
    /// per byte of f16.
    Q4,
}

impl KvDtype {
    /// Its name in flags, logs, reports and Consul Meta.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::Q8 => "q8",
            KvDtype::Q4 => "q4",
        }
    }

    /// Bytes `values` values take (`values` a multiple of 32 for q8).
    pub fn bytes(self, values: usize) -> usize {
        match self {
            KvDtype::F16 => 2 * values,
            KvDtype::Q8 => values + values.div_ceil(Q8_BLOCK) * 2,
            KvDtype::Q4 => values.div_ceil(2) + values.div_ceil(Q8_BLOCK) * 2,
        }
    }

    /// Whether a model whose rows of keys are `kv_dim` wide can use this type, or why not.
    pub fn check(self, kv_dim: usize) -> Result<(), String> {
        match self {
            KvDtype::Q8 | KvDtype::Q4 if !kv_dim.is_multiple_of(Q8_BLOCK) => Err(format!(
                "--kv-dtype {} needs key rows (kv heads x head size) a multiple of {Q8_BLOCK} wide; this model's are \
                 {kv_dim}: use --kv-dtype f16",
                self.name()
            )),
            _ => Ok(()),
        }
    }
}
