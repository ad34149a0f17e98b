//! [`GptConfig`]: the sharding of Megatron-Core's GPT model (its Transformer Engine layer spec), dense or MoE.
//!
//! Names and splits follow `GPTModel` built with `get_gpt_layer_with_transformer_engine_spec`:
//!
//! | parameter | shape | split |
//! | --- | --- | --- |
//! | `embedding.word_embeddings.weight` | `[vocab, hidden]` | vocab-parallel (dim 0), first stage (and last when tied) |
//! | `embedding.position_embeddings.weight` | `[positions, hidden]` | replicated, first stage (learned absolute only) |
//! | `decoder.layers.{l}.self_attention.linear_qkv.layer_norm_{weight,bias}` | `[hidden]` | replicated |
//! | `decoder.layers.{l}.self_attention.linear_qkv.{weight,bias}` | `[(heads + 2·kv_heads)·head_dim, hidden]` | column (dim 0) |
//! | `decoder.layers.{l}.self_attention.linear_proj.weight` | `[hidden, heads·head_dim]` | row (dim 1); its bias replicated |
//! | `decoder.layers.{l}.mlp.linear_fc1.layer_norm_{weight,bias}` | `[hidden]` | replicated |
//! | `decoder.layers.{l}.mlp.linear_fc1.{weight,bias}` | `[ffn·g, hidden]` | column; gated (SwiGLU, g = 2) in 2 blocks `[gate; up]` |
//! | `decoder.layers.{l}.mlp.linear_fc2.weight` | `[hidden, ffn]` | row; its bias replicated |
//! | `decoder.final_layernorm.{weight,bias}` | `[hidden]` | replicated, last stage |
//! | `output_layer.weight` | `[vocab, hidden]` | column, last stage (absent when tied) |
//!
//! An MoE layer has `decoder.layers.{l}.pre_mlp_layernorm.{weight,bias}` and `mlp.router.weight` `[experts,
//! hidden]` (replicated), and per expert `e` (the global index) `mlp.experts.{e}.linear_fc1` and `linear_fc2`,
//! split over `etp` on the expert grid. Layer `l`'s parameters are placed by layer, so the pipeline split is
//! Megatron's even one. Biases are left out with `bias=false`, norm biases with `rmsnorm`. The QKV rows are in
//! Megatron's order (query groups interleaved), so a plain split along dim 0 is its tensor-parallel split.
//!
//! The vocabulary is taken as given: Megatron pads it to a multiple of 128·tp, so give the padded size, which
//! every tensor-parallel size of both layouts must divide.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{DType, ParamSharding, Place, RefitError, Sharding, Split};

/// The shape of a Megatron GPT model; see the module docs. `sharding()` describes its parameters.
///
/// ```
/// use hypercomm_refit::{GptConfig, Split};
///
/// let gpt: GptConfig = "layers=2,hidden=1024,vocab=32000,gated,heads=8,kv_heads=2".parse()?;
/// let sharding = gpt.sharding()?;
/// let qkv = sharding.params.iter().find(|p| p.name == "decoder.layers.1.self_attention.linear_qkv.weight").unwrap();
/// assert_eq!(qkv.shape, [(8 + 2 * 2) * 128, 1024]);
/// let fc1 = sharding.params.iter().find(|p| p.name == "decoder.layers.0.mlp.linear_fc1.weight").unwrap();
/// assert_eq!((fc1.shape.clone(), fc1.split), (vec![2 * 4096, 1024], Split::column_blocks(2)));
/// # Ok::<(), hypercomm_refit::RefitError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GptConfig {
    /// Transformer layers.
    pub layers: usize,
    /// Hidden size.
    pub hidden: u64,
    /// Vocabulary size, padded as Megatron pads it.
    pub vocab: u64,
    /// MLP hidden size (default 4·hidden).
    pub ffn: Option<u64>,
    /// Attention heads (default hidden / 64, or 1 when 64 does not divide hidden).
    pub heads: Option<u64>,
    /// Query groups (key/value heads; default: heads).
    pub kv_heads: Option<u64>,
    /// A gated MLP (SwiGLU): `linear_fc1` holds gate and up.
    pub gated: bool,
    /// Linear layers have biases (Megatron's `add_bias_linear`, default true).
    pub bias: bool,
    /// RMSNorm (no norm biases) rather than LayerNorm.
    pub rmsnorm: bool,
    /// The output layer shares the word embeddings (held on the first and the last stage).
    pub tied: bool,
    /// Learned absolute position embeddings of this many positions; 0 for none (rotary).
    pub positions: u64,
    /// Experts per layer; 0 for a dense model.
    pub experts: usize,
    /// Each expert's MLP hidden size (default: ffn).
    pub moe_ffn: Option<u64>,
    /// The parameters' element type (default bf16).
    pub dtype: DType,
}

impl Default for GptConfig {
    fn default() -> Self {
        GptConfig {
            layers: 0,
            hidden: 0,
            vocab: 0,
            ffn: None,
            heads: None,
            kv_heads: None,
            gated: false,
            bias: true,
            rmsnorm: false,
            tied: false,
            positions: 0,
            experts: 0,
            moe_ffn: None,
            dtype: DType::Bf16,
        }
    }
}

impl GptConfig {
    /// A dense GPT of `layers` layers, `hidden` hidden size and `vocab` (padded) vocabulary, other fields at their
    /// defaults.
    pub fn new(layers: usize, hidden: u64, vocab: u64) -> GptConfig {
        GptConfig {
            layers,
            hidden,
            vocab,
            ..GptConfig::default()
        }
    }

    /// The model's parameters and their layout, in `GPTModel`'s order. Fails when a size is zero, the heads do not
    /// divide the hidden size, the query groups do not divide the heads, a dimension overflows 64 bits, or the
    /// model has more than [`MAX_GPT_PARAMS`] parameters.
    pub fn sharding(&self) -> Result<Sharding, RefitError> {
        let bad = |field, value: u64, why: &str| RefitError::BadModel {
            field,
            value,
            why: why.to_owned(),
        };
        for (field, value) in [
            ("layers", self.layers as u64),
            ("hidden", self.hidden),
            ("vocab", self.vocab),
        ] {
            if value == 0 {
                return Err(bad(field, value, "must be at least 1"));
            }
        }
        let h = self.hidden;
        let heads = self.heads.unwrap_or(if h % 64 == 0 { h / 64 } else { 1 });
        if heads == 0 || h % heads != 0 {
            return Err(bad("heads", heads, &format!("must divide hidden={h}")));
        }
        let kv = self.kv_heads.unwrap_or(heads);
        if kv == 0 || heads % kv != 0 {
            return Err(bad("kv_heads", kv, &format!("must divide heads={heads}")));
        }
        let overflow = |field, value| bad(field, value, "makes a dimension overflow 64 bits");
        let ffn = match self.ffn {
            Some(ffn) => ffn,
            None => h.checked_mul(4).ok_or_else(|| overflow("hidden", h))?,
        };
        let moe_ffn = self.moe_ffn.unwrap_or(ffn);
        for (field, value) in [("ffn", ffn), ("moe_ffn", moe_ffn)] {
            if value == 0 {
                return Err(bad(field, value, "must be at least 1"));
            }
        }
        let gate = if self.gated { 2 } else { 1 };
        let fc1_rows = ffn.checked_mul(gate).ok_or_else(|| overflow("ffn", ffn))?;
        let moe_fc1_rows = moe_ffn
            .checked_mul(gate)
            .ok_or_else(|| overflow("moe_ffn", moe_ffn))?;
        let head_dim = h / heads;
        let qkv = kv
            .checked_mul(2)
            .and_then(|k| k.checked_add(heads))
            .and_then(|q| q.checked_mul(head_dim))
            .ok_or_else(|| overflow("kv_heads", kv))?;
        // At most 14 parameters per layer plus 4 per expert, and 5 outside the layers.
        let count = self.layers as u128 * (14 + 4 * self.experts as u128) + 5;
        if count > MAX_GPT_PARAMS as u128 {
            return Err(bad(
                if self.experts > 0 {
                    "experts"
                } else {
                    "layers"
                },
                if self.experts > 0 {
                    self.experts
                } else {
                    self.layers
                } as u64,
                &format!("the model would have more than {MAX_GPT_PARAMS} parameters"),
            ));
        }
        let mut s = Sharding::new(self.layers, self.experts);
        let dtype = self.dtype;
        let param = |name: String, shape: Vec<u64>, split, place| {
            ParamSharding::new(name, shape, dtype, split, place)
        };
        let norm = |s: &mut Sharding, weight: String, bias: String, place| {
            s.push(param(weight, vec![h], Split::Replicated, place));
            if !self.rmsnorm {
                s.push(param(bias, vec![h], Split::Replicated, place));
            }
        };
        let embedding_place = if self.tied {
            Place::FirstAndLast
        } else {
            Place::First
        };
        s.push(param(
            "embedding.word_embeddings.weight".into(),
            vec![self.vocab, h],
            Split::VOCAB,
            embedding_place,
        ));
        if self.positions > 0 {
            s.push(param(
                "embedding.position_embeddings.weight".into(),
                vec![self.positions, h],
                Split::Replicated,
                Place::First,
            ));
        }
        for l in 0..self.layers {
            let at = Place::Layer(l);
            let pre = format!("decoder.layers.{l}");
            let attn = format!("{pre}.self_attention");
            norm(
                &mut s,
                format!("{attn}.linear_qkv.layer_norm_weight"),
                format!("{attn}.linear_qkv.layer_norm_bias"),
                at,
            );
            s.push(param(
                format!("{attn}.linear_qkv.weight"),
                vec![qkv, h],
                Split::COLUMN,
                at,
            ));
            if self.bias {
                s.push(param(
                    format!("{attn}.linear_qkv.bias"),
                    vec![qkv],
                    Split::COLUMN,
                    at,
                ));
            }
            s.push(param(
                format!("{attn}.linear_proj.weight"),
                vec![h, heads * head_dim],
                Split::ROW,
                at,
            ));
            if self.bias {
                s.push(param(
                    format!("{attn}.linear_proj.bias"),
                    vec![h],
                    Split::Replicated,
                    at,
                ));
            }
            if self.experts == 0 {
                let mlp = format!("{pre}.mlp");
                norm(
                    &mut s,
                    format!("{mlp}.linear_fc1.layer_norm_weight"),
                    format!("{mlp}.linear_fc1.layer_norm_bias"),
                    at,
                );
                self.push_mlp(&mut s, &mlp, (fc1_rows, ffn), at, None);
            } else {
                norm(
                    &mut s,
                    format!("{pre}.pre_mlp_layernorm.weight"),
                    format!("{pre}.pre_mlp_layernorm.bias"),
                    at,
                );
                s.push(param(
                    format!("{pre}.mlp.router.weight"),
                    vec![self.experts as u64, h],
                    Split::Replicated,
                    at,
                ));
                for e in 0..self.experts {
                    self.push_mlp(
                        &mut s,
                        &format!("{pre}.mlp.experts.{e}"),
                        (moe_fc1_rows, moe_ffn),
                        at,
                        Some(e),
                    );
                }
            }
        }
        norm(
            &mut s,
            "decoder.final_layernorm.weight".into(),
            "decoder.final_layernorm.bias".into(),
            Place::Last,
        );
        if !self.tied {
            s.push(param(
                "output_layer.weight".into(),
                vec![self.vocab, h],
                Split::COLUMN,
                Place::Last,
            ));
        }
        Ok(s)
    }

    /// `linear_fc1` (`fc1_rows` rows: column-parallel, in blocks when gated) and `linear_fc2` (`ffn` columns:
    /// row-parallel) under `prefix`.
    fn push_mlp(
        &self,
        s: &mut Sharding,
        prefix: &str,
        (fc1_rows, ffn): (u64, u64),
        at: Place,
        expert: Option<usize>,
    ) {
        let h = self.hidden;
        let gate = if self.gated { 2 } else { 1 };
        let mut push = |name: String, shape: Vec<u64>, split| {
            let p = ParamSharding::new(name, shape, self.dtype, split, at);
            s.push(match expert {
                Some(e) => p.of_expert(e),
                None => p,
            });
        };
        push(
            format!("{prefix}.linear_fc1.weight"),
            vec![fc1_rows, h],
            Split::column_blocks(gate),
        );
        if self.bias {
            push(
                format!("{prefix}.linear_fc1.bias"),
                vec![fc1_rows],
                Split::column_blocks(gate),
            );
        }
        push(
            format!("{prefix}.linear_fc2.weight"),
            vec![h, ffn],
            Split::ROW,
        );
        if self.bias {
            push(
                format!("{prefix}.linear_fc2.bias"),
                vec![h],
                Split::Replicated,
            );
        }
    }
}

/// The most parameters [`GptConfig::sharding`] describes: 16M, far above any model's count (a 1T-parameter MoE has
/// tens of thousands), and a bound on the memory a mistyped `layers` or `experts` can ask for.
pub const MAX_GPT_PARAMS: usize = 1 << 24;

const KEYS: &str = "layers, hidden, vocab, ffn, heads, kv_heads, gated, bias, rmsnorm, tied, positions, experts, moe_ffn, dtype";

impl FromStr for GptConfig {
    type Err = RefitError;

    /// Parses `key=value` pairs separated by commas (`layers=4,hidden=1024,vocab=32000`); a flag alone (`gated`)
    /// means `gated=true`. Keys are the field names.
    fn from_str(text: &str) -> Result<GptConfig, RefitError> {
        let parse_err = |why: String| RefitError::Parse {
            what: "GPT model",
            text: text.to_owned(),
            why,
        };
        let mut gpt = GptConfig::default();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item.split_once('=').unwrap_or((item, "true"));
            let (key, value) = (key.trim(), value.trim());
            let number = || -> Result<u64, RefitError> {
                value
                    .parse::<u64>()
                    .map_err(|e| parse_err(format!("{key}={value:?}: {e}")))
            };
            let flag = || -> Result<bool, RefitError> {
                value
                    .parse::<bool>()
                    .map_err(|_| parse_err(format!("{key}={value:?} is not true or false")))
            };
            match key {
                "layers" => gpt.layers = number()? as usize,
                "hidden" => gpt.hidden = number()?,
                "vocab" => gpt.vocab = number()?,
                "ffn" => gpt.ffn = Some(number()?),
                "heads" => gpt.heads = Some(number()?),
                "kv_heads" => gpt.kv_heads = Some(number()?),
                "gated" => gpt.gated = flag()?,
                "bias" => gpt.bias = flag()?,
                "rmsnorm" => gpt.rmsnorm = flag()?,
                "tied" => gpt.tied = flag()?,
                "positions" => gpt.positions = number()?,
                "experts" => gpt.experts = number()? as usize,
                "moe_ffn" => gpt.moe_ffn = Some(number()?),
                "dtype" => gpt.dtype = value.parse()?,
                other => return Err(parse_err(format!("unknown key {other:?} (known: {KEYS})"))),
            }
        }
        Ok(gpt)
    }
}

impl fmt::Display for GptConfig {
    /// The `key=value` form [`FromStr`] reads, with the sizes always and other fields where not at their defaults.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "layers={},hidden={},vocab={}",
            self.layers, self.hidden, self.vocab
        )?;
        let d = GptConfig::default();
        for (key, value) in [
            ("ffn", self.ffn),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("moe_ffn", self.moe_ffn),
        ] {
            if let Some(v) = value {
                write!(f, ",{key}={v}")?;
            }
        }
        for (key, value, default) in [
            ("gated", self.gated, d.gated),
            ("bias", self.bias, d.bias),
            ("rmsnorm", self.rmsnorm, d.rmsnorm),
            ("tied", self.tied, d.tied),
        ] {
            if value != default {
                write!(f, ",{key}={value}")?;
            }
        }
        if self.positions != 0 {
            write!(f, ",positions={}", self.positions)?;
        }
        if self.experts != 0 {
            write!(f, ",experts={}", self.experts)?;
        }
        if self.dtype != d.dtype {
            write!(f, ",dtype={}", self.dtype)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: &Sharding) -> Vec<&str> {
        s.params.iter().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn dense_gpt_has_megatron_names_splits_and_places() {
        let s = GptConfig::new(2, 64, 256).sharding().unwrap();
        s.check().unwrap();
        assert_eq!(s.params.len(), 2 + 2 * 12 + 2);
        assert_eq!(
            names(&s)[..5],
            [
                "embedding.word_embeddings.weight",
                "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
                "decoder.layers.0.self_attention.linear_qkv.layer_norm_bias",
                "decoder.layers.0.self_attention.linear_qkv.weight",
                "decoder.layers.0.self_attention.linear_qkv.bias",
            ]
        );
        let get = |name: &str| s.params.iter().find(|p| p.name == name).unwrap();
        let proj = get("decoder.layers.1.self_attention.linear_proj.weight");
        assert_eq!(
            (proj.shape.as_slice(), proj.split, proj.place),
            (&[64, 64][..], Split::ROW, Place::Layer(1))
        );
        let fc2_bias = get("decoder.layers.1.mlp.linear_fc2.bias");
        assert_eq!(fc2_bias.split, Split::Replicated);
        let fc1 = get("decoder.layers.0.mlp.linear_fc1.weight");
        assert_eq!(
            (fc1.shape.as_slice(), fc1.split),
            (&[256, 64][..], Split::COLUMN)
        );
        assert_eq!(get("output_layer.weight").place, Place::Last);
        assert_eq!(get("embedding.word_embeddings.weight").place, Place::First);
        // 64 hidden: one head of 64; qkv rows 3 * 64.
        assert_eq!(
            get("decoder.layers.0.self_attention.linear_qkv.weight").shape,
            [192, 64]
        );
    }

    #[test]
    fn options_change_the_parameters() {
        let tied: GptConfig = "layers=1,hidden=128,vocab=512,tied,rmsnorm,bias=false,positions=32"
            .parse()
            .unwrap();
        let s = tied.sharding().unwrap();
        let n = names(&s);
        assert!(!n.contains(&"output_layer.weight"));
        assert!(n.contains(&"embedding.position_embeddings.weight"));
        assert!(!n.iter().any(|n| n.ends_with("bias")), "{n:?}");
        assert_eq!(s.params[0].place, Place::FirstAndLast);
        let moe: GptConfig = "layers=2,hidden=64,vocab=128,experts=4,moe_ffn=32,gated"
            .parse()
            .unwrap();
        let s = moe.sharding().unwrap();
        s.check().unwrap();
        let e3 = s
            .params
            .iter()
            .find(|p| p.name == "decoder.layers.1.mlp.experts.3.linear_fc1.weight")
            .unwrap();
        assert_eq!(
            (e3.shape.as_slice(), e3.expert, e3.split),
            (&[64, 64][..], Some(3), Split::column_blocks(2))
        );
        assert!(names(&s).contains(&"decoder.layers.0.mlp.router.weight"));
        assert!(names(&s).contains(&"decoder.layers.0.pre_mlp_layernorm.weight"));
        assert_eq!(s.experts, 4);
    }

    #[test]
    fn bad_models_name_the_field() {
        let err = |text: &str| {
            text.parse::<GptConfig>()
                .and_then(|g| g.sharding())
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err("layers=0,hidden=64,vocab=8"),
            "model layers=0: must be at least 1"
        );
        assert_eq!(
            err("layers=1,hidden=64,vocab=8,heads=5"),
            "model heads=5: must divide hidden=64"
        );
        assert_eq!(
            err("layers=1,hidden=64,vocab=8,heads=4,kv_heads=3"),
            "model kv_heads=3: must divide heads=4"
        );
        assert!(
            err("layers=1,hidden=64,vocab=8,depth=3")
                .contains("unknown key \"depth\" (known: layers")
        );
        assert!(err("layers=x").contains("layers=\"x\": invalid digit"));
        assert!(
            err("layers=1,hidden=64,vocab=8,gated=yes")
                .contains("gated=\"yes\" is not true or false")
        );
    }

    #[test]
    fn sizes_that_overflow_or_explode_are_errors_not_panics() {
        let err = |text: &str| {
            text.parse::<GptConfig>()
                .and_then(|g| g.sharding())
                .unwrap_err()
                .to_string()
        };
        let huge = u64::MAX / 2;
        assert_eq!(
            err(&format!("layers=1,hidden={huge},heads=1,vocab=8")),
            format!("model hidden={huge}: makes a dimension overflow 64 bits")
        );
        assert!(
            err(&format!(
                "layers=1,hidden=64,vocab=8,ffn={},gated",
                huge + 1
            ))
            .starts_with("model ffn=")
        );
        assert_eq!(
            err("layers=100000000,hidden=64,vocab=8"),
            "model layers=100000000: the model would have more than 16777216 parameters"
        );
        assert!(
            err("layers=1000,hidden=64,vocab=8,experts=100000").starts_with("model experts=100000")
        );
        // A shape whose bytes overflow is caught when the sharding is checked.
        let s = GptConfig::new(1, 1 << 32, 1 << 32).sharding().unwrap();
        assert!(matches!(s.check(), Err(RefitError::TooLarge { .. })));
    }

    #[test]
    fn display_round_trips() {
        for text in [
            "layers=4,hidden=1024,vocab=32000",
            "layers=2,hidden=64,vocab=128,kv_heads=1,gated=true,tied=true,experts=4,dtype=f32",
        ] {
            let gpt: GptConfig = text.parse().unwrap();
            assert_eq!(gpt.to_string(), text);
        }
    }
}
