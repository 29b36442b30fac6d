//! The traced computation graph and the `Module` trait that builds it.

use crate::op::{Activation, ColumnSlice, OpDesc, ValueKind};
use crate::{Error, Result};

/// A handle to a value (an edge) of a [`Graph`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Value(pub(crate) usize);

impl Value {
    /// The value's index in its graph.
    pub fn index(self) -> usize {
        self.0
    }
}

/// One op application: a named node with its inputs and single output.
#[derive(Clone, Debug)]
pub struct Node {
    /// Unique name (the layer name, or an op name with a counter).
    pub name: String,
    /// What the node computes.
    pub desc: OpDesc,
    /// Input values, in the order the op expects.
    pub inputs: Vec<Value>,
    /// The value this node produces.
    pub output: Value,
}

/// A graph traced once from [`Module::forward`]: nodes in topological order
/// (a node can only use values that already exist), one token input, one output.
#[derive(Clone, Debug)]
pub struct Graph {
    nodes: Vec<Node>,
    kinds: Vec<ValueKind>,
    producers: Vec<Option<usize>>,
    output: Option<Value>,
}

/// A model, or any part of one, that adds its computation to a graph.
pub trait Module {
    /// Adds this module's nodes to `g`, consuming `x` and returning the result.
    fn forward(&self, g: &mut Graph, x: Value) -> Result<Value>;
}

impl Graph {
    /// An empty graph and its token-ids input.
    pub fn new() -> (Graph, Value) {
        let g = Graph {
            nodes: Vec::new(),
            kinds: vec![ValueKind::Tokens],
            producers: vec![None],
            output: None,
        };
        (g, Value(0))
    }

    /// Traces a module on a fresh graph; its result becomes the graph output.
    pub fn trace(module: &dyn Module) -> Result<Graph> {
        let (mut g, tokens) = Graph::new();
        let out = module.forward(&mut g, tokens)?;
        g.set_output(out)?;
        Ok(g)
    }

    /// Adds a node computing `desc` from `inputs`; checks the input kinds.
    pub fn add_node(
        &mut self,
        name: impl Into<String>,
        desc: OpDesc,
        inputs: &[Value],
    ) -> Result<Value> {
        let name = name.into();
        let expected = desc.input_kinds();
        if inputs.len() != expected.len() {
            return Err(Error::shape(
                format!("node '{name}'"),
                format!(
                    "{} takes {} inputs, got {}",
                    desc.kind_name(),
                    expected.len(),
                    inputs.len()
                ),
            ));
        }
        for (i, (v, want)) in inputs.iter().zip(expected).enumerate() {
            let got = self.kinds.get(v.0).ok_or_else(|| {
                Error::InvalidInput(format!(
                    "node '{name}': input {i} is not a value of this graph"
                ))
            })?;
            if got != want {
                return Err(Error::shape(
                    format!("node '{name}'"),
                    format!("input {i} must be {want:?}, got {got:?}"),
                ));
            }
        }
        if self.nodes.iter().any(|n| n.name == name) {
            return Err(Error::InvalidInput(format!("two nodes are named '{name}'")));
        }
        let output = Value(self.kinds.len());
        self.kinds.push(desc.output_kind());
        self.producers.push(Some(self.nodes.len()));
        self.nodes.push(Node {
            name,
            desc,
            inputs: inputs.to_vec(),
            output,
        });
        Ok(output)
    }

    /// Adds an unnamed node; it is named `<op>.<index>`.
    pub fn op(&mut self, desc: OpDesc, inputs: &[Value]) -> Result<Value> {
        let name = format!("{}.{}", desc.kind_name(), self.nodes.len());
        self.add_node(name, desc, inputs)
    }

    /// `a + b`.
    pub fn add(&mut self, a: Value, b: Value) -> Result<Value> {
        self.op(OpDesc::Add, &[a, b])
    }

    /// `a * b` elementwise.
    pub fn mul(&mut self, a: Value, b: Value) -> Result<Value> {
        self.op(OpDesc::Mul, &[a, b])
    }

    /// `silu(gate) * up`.
    pub fn swiglu(&mut self, gate: Value, up: Value) -> Result<Value> {
        self.glu(Activation::Silu, gate, up)
    }

    /// `act(gate) * up`.
    pub fn glu(&mut self, act: Activation, gate: Value, up: Value) -> Result<Value> {
        self.op(OpDesc::Glu(act), &[gate, up])
    }

    /// `x * factor`.
    pub fn scale(&mut self, x: Value, factor: f32) -> Result<Value> {
        self.op(OpDesc::Scale(factor), &[x])
    }

    /// Columns `start..start + len` of `x` (`[tokens, n]`).
    pub fn slice_columns(&mut self, x: Value, start: usize, len: usize) -> Result<Value> {
        self.op(OpDesc::SliceColumns(ColumnSlice { start, len }), &[x])
    }

    /// An activation function.
    pub fn activation(&mut self, act: Activation, x: Value) -> Result<Value> {
        self.op(OpDesc::Activation(act), &[x])
    }

    /// `x * sigmoid(x)`.
    pub fn silu(&mut self, x: Value) -> Result<Value> {
        self.activation(Activation::Silu, x)
    }

    /// Softmax over the last dimension.
    pub fn softmax(&mut self, x: Value) -> Result<Value> {
        self.op(OpDesc::Softmax, &[x])
    }

    /// Keeps the rows that get logits this step.
    pub fn select_logits_rows(&mut self, x: Value) -> Result<Value> {
        self.op(OpDesc::SelectLogitsRows, &[x])
    }

    /// Marks the graph output (an activation).
    pub fn set_output(&mut self, v: Value) -> Result<()> {
        if self.kinds.get(v.0) != Some(&ValueKind::Activation) {
            return Err(Error::InvalidInput(
                "the graph output must be an activation".into(),
            ));
        }
        self.output = Some(v);
        Ok(())
    }

    /// The output value, once set.
    pub fn output(&self) -> Option<Value> {
        self.output
    }

    /// The nodes in execution order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The kind of a value.
    pub fn kind(&self, v: Value) -> ValueKind {
        self.kinds[v.0]
    }

    /// Number of values (the token input plus one per node).
    pub fn n_values(&self) -> usize {
        self.kinds.len()
    }

    /// The node that produces `v` (`None` for the token input).
    pub fn producer(&self, v: Value) -> Option<usize> {
        self.producers[v.0]
    }
}
