//! Runs a traced graph step by step: re-plans shapes and buffers only when
//! the step's shapes change, then executes every node in order.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{Backend, StepRunner};
use crate::graph::Graph;
use crate::op::{Op, OpInput, ValueKind};
use crate::step::{LogitsMode, StepInput, StepLayout};
use crate::tensor::TensorRef;
use crate::weights::WeightSource;
use crate::{Error, Result, Shape, Tensor};

/// Shapes in a step depend only on these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    n_tokens: usize,
    n_seqs: usize,
    logits: LogitsMode,
}

/// Shapes of every value and the arena buffer each activation lives in.
#[derive(Debug)]
struct Plan {
    shapes: Vec<Shape>,
    buffer_of: Vec<Option<usize>>,
    buffer_sizes: Vec<usize>,
}

/// Executes a [`Graph`] with ops from one [`Backend`].
pub struct Executor {
    graph: Graph,
    ops: Vec<Box<dyn Op>>,
    last_use: Vec<usize>,
    plans: HashMap<PlanKey, Plan>,
    current: Option<PlanKey>,
    arena: Vec<Vec<f32>>,
    slot_lens: Vec<usize>,
    max_context: usize,
    reshapes: usize,
    profile: Option<Vec<Duration>>,
    runner: Option<Arc<dyn StepRunner>>,
}

/// Time spent in one kind of op while profiling.
#[derive(Clone, Debug, PartialEq)]
pub struct OpProfile {
    /// The op kind (`linear`, `attention`, ...).
    pub kind: &'static str,
    /// Number of nodes of this kind in the graph.
    pub nodes: usize,
    /// Total execute time of those nodes since profiling was switched on.
    pub total: Duration,
}

impl Executor {
    /// Creates one op per node on `backend` and loads its weights.
    ///
    /// `max_context` bounds every sequence (prompt plus generated tokens).
    pub fn new(
        graph: Graph,
        backend: &dyn Backend,
        weights: &dyn WeightSource,
        max_context: usize,
    ) -> Result<Self> {
        let output = graph
            .output()
            .ok_or_else(|| Error::InvalidInput("the graph has no output".into()))?;
        let mut ops = Vec::with_capacity(graph.nodes().len());
        for node in graph.nodes() {
            let mut op = backend.create_op(&node.desc)?;
            op.load(weights)?;
            ops.push(op);
        }
        for op in &mut ops {
            op.loaded();
        }
        let mut last_use = vec![0; graph.n_values()];
        for (i, node) in graph.nodes().iter().enumerate() {
            for v in &node.inputs {
                last_use[v.index()] = i;
            }
        }
        last_use[output.index()] = usize::MAX;
        Ok(Executor {
            graph,
            ops,
            last_use,
            plans: HashMap::new(),
            current: None,
            arena: Vec::new(),
            slot_lens: Vec::new(),
            max_context,
            reshapes: 0,
            profile: None,
            runner: backend.step_runner(),
        })
    }

    /// The graph being executed.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Longest sequence a slot can hold.
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Tokens the sequence in `slot` holds so far.
    pub fn slot_len(&self, slot: usize) -> usize {
        self.slot_lens.get(slot).copied().unwrap_or(0)
    }

    /// Forgets the sequence in `slot` (its KV cache entries and length).
    pub fn reset_slot(&mut self, slot: usize) {
        for op in &mut self.ops {
            op.reset_slot(slot);
        }
        if let Some(len) = self.slot_lens.get_mut(slot) {
            *len = 0;
        }
    }

    /// Keeps only the first `len` tokens of the sequence in `slot` (no-op when
    /// it holds fewer); the next step writes from position `len` on. Ops treat
    /// each step's `past` as authoritative, so nothing else needs clearing.
    pub fn truncate_slot(&mut self, slot: usize, len: usize) {
        if let Some(current) = self.slot_lens.get_mut(slot) {
            *current = (*current).min(len);
        }
    }

    /// Starts (or, with `false`, stops and clears) timing every node's execute.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(|| vec![Duration::ZERO; self.graph.nodes().len()]);
    }

    /// Execute time per op kind since profiling was switched on, largest first.
    pub fn profile(&self) -> Vec<OpProfile> {
        let Some(times) = &self.profile else {
            return Vec::new();
        };
        let mut by_kind: Vec<OpProfile> = Vec::new();
        for (node, &t) in self.graph.nodes().iter().zip(times) {
            let kind = node.desc.kind_name();
            match by_kind.iter_mut().find(|p| p.kind == kind) {
                Some(p) => {
                    p.nodes += 1;
                    p.total += t;
                }
                None => by_kind.push(OpProfile {
                    kind,
                    nodes: 1,
                    total: t,
                }),
            }
        }
        by_kind.sort_by_key(|p| std::cmp::Reverse(p.total));
        by_kind
    }

    /// How many times the ops were re-planned (shapes recomputed) so far.
    pub fn reshape_count(&self) -> usize {
        self.reshapes
    }

    /// Total f32 elements held by the activation arena.
    pub fn arena_len(&self) -> usize {
        self.arena.iter().map(Vec::len).sum()
    }

    /// Runs one step and returns the logits `[rows, vocab]`: one row per
    /// sequence (`LogitsMode::Last`) or per new token (`LogitsMode::All`).
    pub fn step(&mut self, input: &StepInput) -> Result<Tensor> {
        let layout = StepLayout::pack(input, |s| self.slot_len(s), self.max_context)?;
        let key = PlanKey {
            n_tokens: layout.n_tokens(),
            n_seqs: layout.seqs.len(),
            logits: input.logits,
        };
        if self.current != Some(key) {
            let plan = self.reshape(&layout)?;
            self.plans.insert(key, plan);
            self.current = Some(key);
        }
        let plan = &self.plans[&key];
        for (i, &size) in plan.buffer_sizes.iter().enumerate() {
            if self.arena.len() <= i {
                self.arena.push(Vec::new());
            }
            if self.arena[i].len() < size {
                self.arena[i].resize(size, 0.0);
            }
        }
        for (op, node) in self.ops.iter_mut().zip(self.graph.nodes()) {
            op.prepare(&layout).map_err(|e| annotate(e, &node.name))?;
        }
        match self.runner.clone() {
            Some(runner) => {
                let mut result = Ok(());
                runner.run(layout.n_tokens(), &mut || result = self.execute(&layout));
                result?;
            }
            None => self.execute(&layout)?,
        }
        for seq in &layout.seqs {
            if self.slot_lens.len() <= seq.slot {
                self.slot_lens.resize(seq.slot + 1, 0);
            }
            self.slot_lens[seq.slot] = seq.past + seq.len;
        }
        let plan = &self.plans[&key];
        let out = self.graph.output().expect("checked in new").index();
        let shape = plan.shapes[out].clone();
        let buf = plan.buffer_of[out].expect("outputs are activations");
        let data = self.arena[buf][..shape.numel()].to_vec();
        Tensor::new(shape, data)
    }

    /// Computes every value's shape with the ops' `reshape` and assigns
    /// arena buffers by liveness: a buffer is reused once its value is dead.
    fn reshape(&mut self, layout: &StepLayout) -> Result<Plan> {
        self.reshapes += 1;
        let n_values = self.graph.n_values();
        let mut shapes = vec![Shape::default(); n_values];
        shapes[0] = Shape::new([layout.n_tokens()]);
        let mut buffer_of = vec![None; n_values];
        let mut buffer_sizes: Vec<usize> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        for (i, node) in self.graph.nodes().iter().enumerate() {
            let in_shapes: Vec<&Shape> = node.inputs.iter().map(|v| &shapes[v.index()]).collect();
            let out_shape = self.ops[i]
                .reshape(&in_shapes, layout)
                .map_err(|e| annotate(e, &node.name))?;
            let out = node.output.index();
            if self.graph.kind(node.output) == ValueKind::Activation {
                let need = out_shape.numel();
                // Best fit among free buffers, else a new one.
                let pick = free
                    .iter()
                    .enumerate()
                    .filter(|(_, &b)| buffer_sizes[b] >= need)
                    .min_by_key(|(_, &b)| buffer_sizes[b])
                    .or_else(|| {
                        free.iter()
                            .enumerate()
                            .max_by_key(|(_, &b)| buffer_sizes[b])
                    })
                    .map(|(pos, _)| pos);
                let buf = match pick {
                    Some(pos) => free.swap_remove(pos),
                    None => {
                        buffer_sizes.push(0);
                        buffer_sizes.len() - 1
                    }
                };
                buffer_sizes[buf] = buffer_sizes[buf].max(need);
                buffer_of[out] = Some(buf);
            }
            shapes[out] = out_shape;
            for v in &node.inputs {
                let v = v.index();
                if self.last_use[v] == i {
                    if let Some(b) = buffer_of[v] {
                        if !free.contains(&b) {
                            free.push(b);
                        }
                    }
                }
            }
        }
        Ok(Plan {
            shapes,
            buffer_of,
            buffer_sizes,
        })
    }

    fn execute(&mut self, layout: &StepLayout) -> Result<()> {
        let key = self.current.expect("planned before execute");
        let plan = &self.plans[&key];
        for (i, node) in self.graph.nodes().iter().enumerate() {
            let out = node.output.index();
            let mut out_buf = match plan.buffer_of[out] {
                Some(b) => std::mem::take(&mut self.arena[b]),
                None => Vec::new(),
            };
            let (earlier, rest) = self.ops.split_at_mut(i);
            let inputs = node
                .inputs
                .iter()
                .map(|v| {
                    let idx = v.index();
                    Ok(match self.graph.kind(*v) {
                        ValueKind::Tokens => OpInput::Tokens(&layout.token_ids),
                        ValueKind::Activation => {
                            let shape = &plan.shapes[idx];
                            let buf = plan.buffer_of[idx].expect("activations have buffers");
                            OpInput::Tensor(TensorRef {
                                shape,
                                data: &self.arena[buf][..shape.numel()],
                            })
                        }
                        ValueKind::State => {
                            let producer = self.graph.producer(*v).expect("state has a producer");
                            OpInput::State(earlier[producer].state().ok_or_else(|| {
                                Error::InvalidInput(format!(
                                    "node '{}': its input has no state",
                                    node.name
                                ))
                            })?)
                        }
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let n = plan.shapes[out].numel();
            let out_slice = match plan.buffer_of[out] {
                Some(_) => &mut out_buf[..n],
                None => &mut out_buf[..],
            };
            let started = self.profile.is_some().then(Instant::now);
            let result = rest[0].execute(&inputs, out_slice, layout);
            if let (Some(times), Some(t0)) = (self.profile.as_mut(), started) {
                times[i] += t0.elapsed();
            }
            drop(inputs);
            if let Some(b) = plan.buffer_of[out] {
                self.arena[b] = out_buf;
            }
            result.map_err(|e| annotate(e, &node.name))?;
        }
        Ok(())
    }
}

/// Adds the node name to shape errors, which otherwise lack context.
fn annotate(e: Error, node: &str) -> Error {
    match e {
        Error::ShapeMismatch { context, detail } => Error::ShapeMismatch {
            context: format!("node '{node}' ({context})"),
            detail,
        },
        other => other,
    }
}
