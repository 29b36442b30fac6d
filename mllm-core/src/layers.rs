//! Layers: named building blocks of Modules. Each layer owns the description
//! of one op (its typed parameters and weight names) and adds it to a graph.

use crate::graph::{Graph, Value};
use crate::op::{
    AttentionParams, EmbeddingParams, KvCacheParams, LinearParams, NormParams, OpDesc,
    PositionEmbeddingParams, RopeParams,
};
use crate::Result;

/// A named layer that applies one op.
pub trait Layer {
    /// The layer's unique name (also the prefix of its weights).
    fn name(&self) -> &str;
    /// The op the layer applies.
    fn desc(&self) -> OpDesc;
    /// Adds the layer's node to `g`.
    fn apply(&self, g: &mut Graph, inputs: &[Value]) -> Result<Value> {
        g.add_node(self.name(), self.desc(), inputs)
    }
}

macro_rules! layer {
    ($(#[$doc:meta])* $ty:ident, $params:ty, $variant:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $ty {
            name: String,
            params: $params,
        }

        impl $ty {
            /// The layer's parameters.
            pub fn params(&self) -> &$params {
                &self.params
            }
        }

        impl Layer for $ty {
            fn name(&self) -> &str {
                &self.name
            }
            fn desc(&self) -> OpDesc {
                OpDesc::$variant(self.params.clone())
            }
        }
    };
}

layer!(
    /// `y = x W^T + b`; weights `{name}.weight` `[out, in]` and `{name}.bias`.
    Linear, LinearParams, Linear
);
layer!(
    /// Token embedding; weight `{name}.weight` `[vocab, dim]`.
    Embedding, EmbeddingParams, Embedding
);
layer!(
    /// Learned absolute positions; weight `{name}.weight` `[rows, dim]`.
    PositionEmbedding, PositionEmbeddingParams, PositionEmbedding
);
layer!(
    /// RMSNorm; weight `{name}.weight` `[dim]`.
    RmsNorm, NormParams, RmsNorm
);
layer!(
    /// LayerNorm; weights `{name}.weight` and `{name}.bias` `[dim]`.
    LayerNorm, NormParams, LayerNorm
);
layer!(
    /// Rotary position embedding of queries or keys.
    Rope, RopeParams, Rope
);
layer!(
    /// The per-layer KV cache.
    KvCache, KvCacheParams, KvCache
);
layer!(
    /// Causal attention over a KV cache.
    Attention, AttentionParams, Attention
);

impl Linear {
    /// A linear layer reading `{name}.weight` (and `{name}.bias` when `bias`).
    pub fn new(
        in_features: usize,
        out_features: usize,
        bias: bool,
        name: impl Into<String>,
    ) -> Self {
        let name = name.into();
        Self::with_weights(
            in_features,
            out_features,
            format!("{name}.weight"),
            bias.then(|| format!("{name}.bias")),
            name,
        )
    }

    /// A linear layer reading explicitly named weights (e.g. a head tied to
    /// the embedding table).
    pub fn with_weights(
        in_features: usize,
        out_features: usize,
        weight: impl Into<String>,
        bias: Option<String>,
        name: impl Into<String>,
    ) -> Self {
        Linear {
            name: name.into(),
            params: LinearParams {
                in_features,
                out_features,
                weight: weight.into(),
                bias,
            },
        }
    }

    /// Applies the layer to `x`.
    pub fn call(&self, g: &mut Graph, x: Value) -> Result<Value> {
        self.apply(g, &[x])
    }
}

impl Embedding {
    /// An embedding table `{name}.weight` of `[vocab, dim]`.
    pub fn new(vocab: usize, dim: usize, name: impl Into<String>) -> Self {
        let name = name.into();
        Embedding {
            params: EmbeddingParams {
                vocab,
                dim,
                weight: format!("{name}.weight"),
            },
            name,
        }
    }

    /// Looks up the token ids `tokens`.
    pub fn call(&self, g: &mut Graph, tokens: Value) -> Result<Value> {
        self.apply(g, &[tokens])
    }
}

impl PositionEmbedding {
    /// A `[rows, dim]` table `{name}.weight` whose row `offset` holds position 0.
    pub fn new(rows: usize, dim: usize, offset: usize, name: impl Into<String>) -> Self {
        let name = name.into();
        PositionEmbedding {
            params: PositionEmbeddingParams {
                rows,
                dim,
                offset,
                weight: format!("{name}.weight"),
            },
            name,
        }
    }

    /// The embeddings of the positions of the step's tokens (`tokens` is the
    /// graph's token input; only its length is used).
    pub fn call(&self, g: &mut Graph, tokens: Value) -> Result<Value> {
        self.apply(g, &[tokens])
    }
}

impl RmsNorm {
    /// RMSNorm over `dim` with weight `{name}.weight`.
    pub fn new(dim: usize, eps: f32, name: impl Into<String>) -> Self {
        let name = name.into();
        RmsNorm {
            params: NormParams {
                dim,
                eps,
                weight: format!("{name}.weight"),
                groups: 1,
                bias: None,
                unit_offset: false,
            },
            name,
        }
    }

    /// Scale by `1 + weight` (Gemma).
    pub fn with_unit_offset(mut self) -> Self {
        self.params.unit_offset = true;
        self
    }

    /// Normalizes each of `n_heads` vectors of `dim` in a row of
    /// `[tokens, n_heads * dim]` separately (per-head q/k norms).
    pub fn per_head(mut self, n_heads: usize) -> Self {
        self.params.groups = n_heads;
        self
    }

    /// Applies the norm to `x`.
    pub fn call(&self, g: &mut Graph, x: Value) -> Result<Value> {
        self.apply(g, &[x])
    }
}

impl LayerNorm {
    /// LayerNorm over `dim` with `{name}.weight` and, when `bias`, `{name}.bias`.
    pub fn new(dim: usize, eps: f32, bias: bool, name: impl Into<String>) -> Self {
        let name = name.into();
        LayerNorm {
            params: NormParams {
                dim,
                eps,
                weight: format!("{name}.weight"),
                groups: 1,
                bias: bias.then(|| format!("{name}.bias")),
                unit_offset: false,
            },
            name,
        }
    }

    /// Applies the norm to `x`.
    pub fn call(&self, g: &mut Graph, x: Value) -> Result<Value> {
        self.apply(g, &[x])
    }
}

impl Rope {
    /// Rotary embedding with the given parameters.
    pub fn new(params: RopeParams, name: impl Into<String>) -> Self {
        Rope {
            name: name.into(),
            params,
        }
    }

    /// Rotates `x` (`[tokens, heads * head_dim]`) by each token's position.
    pub fn call(&self, g: &mut Graph, x: Value) -> Result<Value> {
        self.apply(g, &[x])
    }
}

impl KvCache {
    /// A KV cache for `n_kv_heads` heads of `head_dim`, grown `chunk` positions at a time.
    pub fn new(n_kv_heads: usize, head_dim: usize, name: impl Into<String>) -> Self {
        KvCache {
            name: name.into(),
            params: KvCacheParams {
                n_kv_heads,
                head_dim,
                chunk: 256,
            },
        }
    }

    /// Appends `k` and `v`; returns the cache state for [`Attention::call`].
    pub fn call(&self, g: &mut Graph, k: Value, v: Value) -> Result<Value> {
        self.apply(g, &[k, v])
    }
}

impl Attention {
    /// Causal attention with the given parameters.
    pub fn new(params: AttentionParams, name: impl Into<String>) -> Self {
        Attention {
            name: name.into(),
            params,
        }
    }

    /// Attends `q` over the cache state `kv`.
    pub fn call(&self, g: &mut Graph, q: Value, kv: Value) -> Result<Value> {
        self.apply(g, &[q, kv])
    }
}
