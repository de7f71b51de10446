//! Merging an adapter into a float model (`W + scale * B A` in every adapted matrix): the reference that adapters
//! applied at run time are measured against, as a fine-tune's merged export would be served.

use super::kernels::Weight;
use super::llama::{Ffn, Llama};
use super::lora::{LoraAdapter, Target};

/// Add `adapter`'s updates to `llama`'s weights, which must be f32 (a model loaded at `Precision::Float`).
pub fn merge(llama: &mut Llama, adapter: &LoraAdapter) -> Result<(), String> {
    if adapter.pairs().any(|(li, _, _)| li >= llama.layers.len()) {
        return Err("the adapter has more layers than the model".into());
    }
    for (li, target, pair) in adapter.pairs() {
        let layer = &mut llama.layers[li];
        let weight = match (target, &mut layer.ffn) {
            (Target::Q, _) => &mut layer.wq,
            (Target::K, _) => &mut layer.wk,
            (Target::V, _) => &mut layer.wv,
            (Target::O, _) => &mut layer.wo,
            (Target::Gate, Ffn::Dense { gate, .. }) => gate,
            (Target::Up, Ffn::Dense { up, .. }) => up,
            (Target::Down, Ffn::Dense { down, .. }) => down,
            (_, Ffn::Experts(_)) => return Err(format!("layer {li}: the MLP is a mixture of experts")),
        };
        let format = weight.format_name();
        let Weight::F32 { rows, cols, w } = weight else {
            return Err(format!("layer {li} {} is {format}: merging needs f32 weights", target.peft_name()));
        };
        if pair.shape() != (*rows, *cols) {
            return Err(format!("layer {li} {}: the update does not fit the matrix", target.peft_name()));
        }
        for (j, row) in w.chunks_exact_mut(*cols).enumerate() {
            pair.add_delta_row(j, row);
        }
    }
    Ok(())
}
