//! Reading LoRA adapters: Hugging Face PEFT directories (`adapter_config.json` with `r`, `lora_alpha`,
//! `target_modules`, and `adapter_model.safetensors`) and llama.cpp's GGUF adapters (`general.type = adapter`,
//! `adapter.lora.alpha`, `blk.N.<tensor>.weight.lora_a|lora_b`), each checked against the base it is to apply to:
//! its architecture, its layers and every matrix's shape. An adapter made for the other RoPE layout of Q and K (a
//! PEFT adapter over a llama.cpp Llama GGUF, whose converter permutes those rows) is permuted to the base's.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device};

use super::LoadError;
use super::config::LlamaConfig;
use super::gguf::{read_content, rope_interleaved};
use super::lora::{LoraAdapter, LoraPair, Target};

/// Where an adapter came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterFormat {
    /// A Hugging Face PEFT directory.
    Peft,
    /// A llama.cpp GGUF adapter file.
    Gguf,
}

impl AdapterFormat {
    /// `"peft"` or `"gguf"`.
    pub fn name(self) -> &'static str {
        match self {
            AdapterFormat::Peft => "peft",
            AdapterFormat::Gguf => "gguf",
        }
    }
}

/// A loaded adapter and what its files said.
#[derive(Clone, Debug)]
pub struct LoadedAdapter {
    /// The updates, in the base's layout.
    pub adapter: LoraAdapter,
    /// The file format.
    pub format: AdapterFormat,
}

/// The base an adapter must fit: its shape and its architecture (`LoadedModel::family`).
#[derive(Clone, Copy, Debug)]
pub struct Base<'a> {
    /// The base's shape.
    pub config: &'a LlamaConfig,
    /// Its architecture, as GGUF names it (`llama`, `qwen2`, `qwen3`, `gemma3`, `phi3`, `mistral`).
    pub family: &'a str,
}

/// Load the adapter at `path`: a PEFT directory (or its `adapter_model.safetensors`), or a GGUF adapter file.
pub fn load(path: &Path, base: Base<'_>) -> Result<LoadedAdapter, LoadError> {
    let (adapter, format) = if path.is_dir() || path.extension().is_some_and(|e| e == "safetensors") {
        let dir = if path.is_dir() { path } else { path.parent().unwrap_or(Path::new(".")) };
        (peft(dir, base)?, AdapterFormat::Peft)
    } else {
        (gguf(path, base)?, AdapterFormat::Gguf)
    };
    Ok(LoadedAdapter { adapter, format })
}

/// The fields of PEFT's `adapter_config.json` that change what an adapter computes.
#[derive(Debug, serde::Deserialize)]
struct PeftConfig {
    peft_type: Option<String>,
    r: usize,
    lora_alpha: f32,
    #[serde(default)]
    target_modules: Option<serde_json::Value>,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    alpha_pattern: Option<HashMap<String, f32>>,
    #[serde(default)]
    modules_to_save: Option<Vec<String>>,
    #[serde(default)]
    bias: Option<String>,
}

impl PeftConfig {
    /// Refuse what changes the computation in ways this loader does not apply.
    fn check(&self) -> Result<(), LoadError> {
        let unsupported = |what: &str| Err(LoadError::Unsupported(format!("PEFT adapter: {what}")));
        if self.peft_type.as_deref().is_some_and(|t| t != "LORA") {
            return unsupported(&format!("peft_type {:?} (only LORA is served)", self.peft_type));
        }
        if self.use_dora {
            return unsupported("use_dora (DoRA's magnitude vectors are not applied; merge the adapter instead)");
        }
        if self.fan_in_fan_out {
            return unsupported("fan_in_fan_out (GPT-2 style Conv1D bases)");
        }
        if self.modules_to_save.as_ref().is_some_and(|m| !m.is_empty()) {
            return unsupported("modules_to_save (whole replaced modules; only low-rank updates are applied)");
        }
        if self.bias.as_deref().is_some_and(|b| b != "none") {
            return unsupported(&format!("bias {:?} (only \"none\")", self.bias));
        }
        if let Some(serde_json::Value::Array(modules)) = &self.target_modules {
            for m in modules {
                let name = m.as_str().unwrap_or_default();
                if !Target::ALL.iter().any(|t| t.peft_name() == name) {
                    return unsupported(&format!(
                        "target module {m} (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj and down_proj are)"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The scale of a module's update of rank `rank`: `alpha / r` (`alpha / sqrt(r)` with rsLoRA), `alpha` from
    /// `alpha_pattern` where a key names the module.
    fn scale(&self, module: &str, rank: usize) -> f32 {
        let alpha = self
            .alpha_pattern
            .iter()
            .flatten()
            .find(|(key, _)| module == key.as_str() || module.ends_with(&format!(".{key}")))
            .map_or(self.lora_alpha, |(_, &a)| a);
        if self.use_rslora { alpha / (rank as f32).sqrt() } else { alpha / rank as f32 }
    }
}

/// Which update a PEFT tensor holds: (layer, target, is `B`, module path).
fn peft_tensor(name: &str) -> Result<(usize, Target, bool, String), LoadError> {
    let unsupported = || {
        LoadError::Unsupported(format!(
            "PEFT tensor {name}: only lora_A/lora_B of the decoder layers' q/k/v/o/gate/up/down projections are served"
        ))
    };
    let parts: Vec<&str> = name.split('.').collect();
    let at = parts.iter().position(|p| *p == "lora_A" || *p == "lora_B").ok_or_else(unsupported)?;
    let is_b = parts[at] == "lora_B";
    let module = &parts[..at];
    let layer_at = module.iter().position(|p| *p == "layers").ok_or_else(unsupported)?;
    let layer: usize = module.get(layer_at + 1).and_then(|l| l.parse().ok()).ok_or_else(unsupported)?;
    let last = module.last().ok_or_else(unsupported)?;
    let target = Target::ALL.into_iter().find(|t| t.peft_name() == *last).ok_or_else(unsupported)?;
    Ok((layer, target, is_b, module[layer_at..].join(".")))
}

/// A tensor's values as f32 and its dimensions.
fn tensor_values(t: &candle_core::Tensor, name: &str) -> Result<(Vec<f32>, Vec<usize>), LoadError> {
    let bad = |e: candle_core::Error| LoadError::Format(format!("{name}: {e}"));
    let values = t.to_dtype(DType::F32).and_then(|t| t.flatten_all()).and_then(|t| t.to_vec1::<f32>()).map_err(bad)?;
    Ok((values, t.dims().to_vec()))
}

/// One update's factors as read (values and dimensions), and the module they belong to.
struct Factors {
    a: Option<(Vec<f32>, Vec<usize>)>,
    b: Option<(Vec<f32>, Vec<usize>)>,
    module: String,
}

/// The factors read so far, by (layer, target).
#[derive(Default)]
struct Halves(HashMap<(usize, Target), Factors>);

impl Halves {
    /// Keep tensor `t` (`name`) as `A` or (`is_b`) `B` of `module`'s update.
    fn put(
        &mut self,
        (layer, target): (usize, Target),
        is_b: bool,
        module: &str,
        t: &candle_core::Tensor,
        name: &str,
    ) -> Result<(), LoadError> {
        let values = Some(tensor_values(t, name)?);
        let f =
            self.0.entry((layer, target)).or_insert_with(|| Factors { a: None, b: None, module: module.to_owned() });
        if is_b {
            f.b = values
        } else {
            f.a = values
        }
        Ok(())
    }
}

/// Pair up `A`s and `B`s per (layer, target) into an adapter for `cfg`: `scale(module, rank)` gives each update's
/// scale.
fn assemble(halves: Halves, cfg: &LlamaConfig, scale: impl Fn(&str, usize) -> f32) -> Result<LoraAdapter, LoadError> {
    let mut layers: Vec<[Option<LoraPair>; 7]> = (0..cfg.layers).map(|_| Default::default()).collect();
    for ((layer, target), Factors { a, b, module }) in halves.0 {
        let (Some((a, a_dims)), Some((b, b_dims))) = (a, b) else {
            return Err(LoadError::Format(format!("{module}: lora_A and lora_B must both be present")));
        };
        let slot = layers.get_mut(layer).ok_or_else(|| {
            LoadError::Format(format!("{module}: layer {layer}, but the base has {} layers", cfg.layers))
        })?;
        if cfg.moe.is_some() && matches!(target, Target::Gate | Target::Up | Target::Down) {
            return Err(LoadError::Unsupported(format!(
                "{module}: the base's MLPs are a mixture of experts; adapters apply to its attention (q, k, v, o) only"
            )));
        }
        let (outputs, inputs) = target.shape(cfg);
        let rank = a_dims.first().copied().unwrap_or(0);
        if a_dims != [rank, inputs] || b_dims != [outputs, rank] {
            return Err(LoadError::Format(format!(
                "{module}: A is {a_dims:?} and B {b_dims:?}; the base's matrix needs A [rank, {inputs}] and B \
                 [{outputs}, rank] (an adapter for another model?)"
            )));
        }
        let pair = LoraPair::new(&a, &b, inputs, outputs, scale(&module, rank))
            .map_err(|e| LoadError::Format(format!("{module}: {e}")))?;
        slot[Target::ALL.iter().position(|t| *t == target).unwrap_or(0)] = Some(pair);
    }
    LoraAdapter::new(layers, cfg).map_err(LoadError::Format)
}

/// A PEFT directory.
fn peft(dir: &Path, base: Base<'_>) -> Result<LoraAdapter, LoadError> {
    let io = |p: &Path| {
        let p = p.display().to_string();
        move |e: std::io::Error| LoadError::Io(p, e)
    };
    let config_path = dir.join("adapter_config.json");
    let text = std::fs::read_to_string(&config_path).map_err(io(&config_path))?;
    let config: PeftConfig =
        serde_json::from_str(&text).map_err(|e| LoadError::Format(format!("{}: {e}", config_path.display())))?;
    config.check()?;
    if config.r == 0 {
        return Err(LoadError::Format("adapter_config.json: r is 0".into()));
    }
    let weights = dir.join("adapter_model.safetensors");
    if !weights.exists() {
        return Err(LoadError::Format(format!(
            "{} is missing (adapter_model.bin, PyTorch's pickle format, is not read: save with safe_serialization)",
            weights.display()
        )));
    }
    let tensors = candle_core::safetensors::load(&weights, &Device::Cpu)
        .map_err(|e| LoadError::Format(format!("{}: {e}", weights.display())))?;
    let mut halves = Halves::default();
    for (name, t) in &tensors {
        let (layer, target, is_b, module) = peft_tensor(name)?;
        halves.put((layer, target), is_b, &module, t, name)?;
    }
    let mut adapter = assemble(halves, base.config, |module, rank| config.scale(module, rank))?;
    // PEFT adapters hold Hugging Face's layout of Q and K.
    if base.config.rope_interleaved {
        adapter.permute_heads(base.config, true);
    }
    Ok(adapter)
}

/// A llama.cpp GGUF adapter.
fn gguf(path: &Path, base: Base<'_>) -> Result<LoraAdapter, LoadError> {
    use candle_core::quantized::gguf_file::Value;
    let (content, mut file) = read_content(path)?;
    let text = |key: &str| content.metadata.get(key).and_then(|v| v.to_string().ok()).cloned();
    if text("general.type").as_deref() != Some("adapter") || text("adapter.type").as_deref() != Some("lora") {
        return Err(LoadError::Format(format!(
            "{}: not a LoRA adapter (general.type {:?}, adapter.type {:?}; a whole model is served as a model)",
            path.display(),
            text("general.type"),
            text("adapter.type")
        )));
    }
    let arch = text("general.architecture").unwrap_or_default();
    if arch != base.family {
        return Err(LoadError::Format(format!("the adapter is for a {arch} model, the base is {}", base.family)));
    }
    // llama.cpp: scale = alpha / rank, or 1 when the file gives no alpha.
    let alpha = match content.metadata.get("adapter.lora.alpha") {
        Some(Value::F32(a)) => *a,
        Some(Value::F64(a)) => *a as f32,
        _ => 0.0,
    };
    let mut halves = Halves::default();
    let names: Vec<String> = content.tensor_infos.keys().cloned().collect();
    for name in names {
        let unsupported = || {
            LoadError::Unsupported(format!(
                "GGUF adapter tensor {name}: only blk.N.<attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down>\
                 .weight.lora_a/lora_b are served"
            ))
        };
        let (module, half) = name.rsplit_once(".weight.").ok_or_else(unsupported)?;
        let is_b = match half {
            "lora_a" => false,
            "lora_b" => true,
            _ => return Err(unsupported()),
        };
        let (layer, tensor) = module.strip_prefix("blk.").and_then(|m| m.split_once('.')).ok_or_else(unsupported)?;
        let layer: usize = layer.parse().map_err(|_| unsupported())?;
        let target = Target::ALL.into_iter().find(|t| t.gguf_name() == tensor).ok_or_else(unsupported)?;
        let t = content
            .tensor(&mut file, &name, &Device::Cpu)
            .and_then(|q| q.dequantize(&Device::Cpu))
            .map_err(|e| LoadError::Format(format!("{name}: {e}")))?;
        halves.put((layer, target), is_b, module, &t, &name)?;
    }
    let mut adapter = assemble(halves, base.config, |_, rank| if alpha == 0.0 { 1.0 } else { alpha / rank as f32 })?;
    let (file_layout, base_layout) = (rope_interleaved(&arch), base.config.rope_interleaved);
    if file_layout != base_layout {
        adapter.permute_heads(base.config, base_layout);
    }
    Ok(adapter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peft_tensor_names_name_their_layer_and_matrix() {
        let (layer, target, is_b, module) =
            peft_tensor("base_model.model.model.layers.12.self_attn.k_proj.lora_B.weight").unwrap();
        assert_eq!((layer, target, is_b, module.as_str()), (12, Target::K, true, "layers.12.self_attn.k_proj"));
        assert_eq!(
            peft_tensor("base_model.model.model.layers.0.mlp.down_proj.lora_A.default.weight").unwrap().1,
            Target::Down
        );
        for bad in [
            "base_model.model.lm_head.lora_A.weight",
            "base_model.model.model.embed_tokens.lora_embedding_A",
            "base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight",
            "base_model.model.model.layers.x.self_attn.q_proj.lora_A.weight",
        ] {
            assert!(matches!(peft_tensor(bad), Err(LoadError::Unsupported(_))), "{bad}");
        }
    }

    #[test]
    fn peft_scales_are_alpha_over_rank_unless_rslora_or_a_pattern_says_otherwise() {
        let mut c: PeftConfig =
            serde_json::from_str(r#"{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}"#).unwrap();
        c.check().unwrap();
        assert_eq!(c.scale("layers.0.self_attn.q_proj", 8), 2.0);
        c.alpha_pattern = Some(HashMap::from([("v_proj".to_string(), 4.0)]));
        assert_eq!(c.scale("layers.0.self_attn.v_proj", 8), 0.5);
        c.use_rslora = true;
        assert_eq!(c.scale("layers.0.self_attn.q_proj", 4), 8.0);
        for bad in [
            r#""use_dora": true"#,
            r#""fan_in_fan_out": true"#,
            r#""modules_to_save": ["lm_head"]"#,
            r#""bias": "all""#,
            r#""target_modules": ["embed_tokens"]"#,
        ] {
            let c: PeftConfig = serde_json::from_str(&format!(r#"{{"r": 8, "lora_alpha": 16, {bad}}}"#)).unwrap();
            assert!(matches!(c.check(), Err(LoadError::Unsupported(_))), "{bad}");
        }
    }
}
