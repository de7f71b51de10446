//! OpenAI's logit adjustments (protocol 1.11): frequency and presence penalties, `min_p` and `logit_bias`, checked
//! and converted to and from FlatBuffers.

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use super::check::invalid;
use super::{MessageError, fb};

/// Most `logit_bias` entries.
pub const MAX_LOGIT_BIAS: usize = 1024;

/// Logit adjustments a worker applies before sampling.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Penalties {
    /// Subtracted once per time a token was output, in [-2, 2].
    pub frequency: f32,
    /// Subtracted once a token was output at all, in [-2, 2].
    pub presence: f32,
    /// Keep tokens at least this share as likely as the likeliest (after temperature), in [0, 1].
    pub min_p: f32,
    /// (token id, bias in [-100, 100]), each id once.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Penalties {
    /// Whether it changes nothing.
    pub fn is_neutral(&self) -> bool {
        self.frequency == 0.0 && self.presence == 0.0 && self.min_p == 0.0 && self.logit_bias.is_empty()
    }

    pub(crate) fn check(&self) -> Result<(), MessageError> {
        let within = |name: &'static str, v: f32, lo: f32, hi: f32| {
            if v.is_finite() && (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(invalid(name, format!("{v} is outside [{lo}, {hi}]")))
            }
        };
        within("Penalties.frequency_penalty", self.frequency, -2.0, 2.0)?;
        within("Penalties.presence_penalty", self.presence, -2.0, 2.0)?;
        within("Penalties.min_p", self.min_p, 0.0, 1.0)?;
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return Err(invalid("Penalties.logit_bias_ids", format!("at most {MAX_LOGIT_BIAS} entries")));
        }
        for &(_, bias) in &self.logit_bias {
            within("Penalties.logit_bias_values", bias, -100.0, 100.0)?;
        }
        let mut ids: Vec<u32> = self.logit_bias.iter().map(|b| b.0).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(invalid("Penalties.logit_bias_ids", "each token id at most once"));
        }
        Ok(())
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::Penalties<'b>> {
        let ids: Vec<u32> = self.logit_bias.iter().map(|b| b.0).collect();
        let values: Vec<f32> = self.logit_bias.iter().map(|b| b.1).collect();
        let (ids, values) = (fbb.create_vector(&ids), fbb.create_vector(&values));
        fb::Penalties::create(
            fbb,
            &fb::PenaltiesArgs {
                frequency_penalty: self.frequency,
                presence_penalty: self.presence,
                min_p: self.min_p,
                logit_bias_ids: Some(ids),
                logit_bias_values: Some(values),
            },
        )
    }

    pub(crate) fn read(t: Option<fb::Penalties<'_>>) -> Result<Option<Self>, MessageError> {
        let Some(t) = t else { return Ok(None) };
        let ids = t.logit_bias_ids().unwrap_or_default();
        let values = t.logit_bias_values().unwrap_or_default();
        if ids.len() != values.len() {
            return Err(invalid("Penalties.logit_bias_values", format!("{} ids, {} values", ids.len(), values.len())));
        }
        if ids.len() > MAX_LOGIT_BIAS {
            return Err(invalid("Penalties.logit_bias_ids", format!("at most {MAX_LOGIT_BIAS} entries")));
        }
        let p = Penalties {
            frequency: t.frequency_penalty(),
            presence: t.presence_penalty(),
            min_p: t.min_p(),
            logit_bias: ids.iter().zip(values.iter()).collect(),
        };
        p.check()?;
        Ok(Some(p))
    }
}
