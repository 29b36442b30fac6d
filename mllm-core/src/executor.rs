//! Runs a traced graph step by step: re-plans shapes and buffers only when
//! the step's shapes change, then executes every node in order.
//!
//! Nodes may be placed on several devices (one [`Backend`] each). Every
//! device gets its own activation buffers, and where a node reads an
//! activation produced on another device the executor inserts a copy (once
//! per value and device) instead of adding nodes. A node's state (the KV
//! cache) lives with the node, on its device. Before building its ops the
//! executor stacks sibling linear layers where their backend asks for it
//! ([`crate::stacking`]); [`Executor::graph`] is the graph after that pass.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{Backend, StepRunner};
use crate::gating::fuse_gated_linears;
use crate::graph::{Graph, Value};
use crate::line_buffer::LineBuffer;
use crate::op::{LinearParams, Op, OpInput, ValueKind};
use crate::stacking::stack_sibling_linears;
use crate::step::{LogitsMode, StepInput, StepLayout};
use crate::tensor::TensorRef;
use crate::weights::WeightSource;
use crate::{DType, Error, Result, Shape, Tensor};

/// Shapes in a step depend only on these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    n_tokens: usize,
    n_seqs: usize,
    logits: LogitsMode,
}

/// Shapes of every value and the buffer (device, index) each activation
/// lives in.
#[derive(Debug)]
struct Plan {
    shapes: Vec<Shape>,
    buffer_of: Vec<Option<(usize, usize)>>,
    buffer_sizes: Vec<Vec<usize>>,
}

/// One entry of the execution order: a graph node, or a copy of an
/// activation to another device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Task {
    /// Run graph node `i`.
    Node(usize),
    /// Copy value `src` into value `dst` (on another device).
    Copy { src: usize, dst: usize },
}

/// A copy the executor inserted because a value crosses devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedCopy {
    /// The node whose output is copied.
    pub producer: String,
    /// The device it is produced on (an index into the executor's backends).
    pub from: usize,
    /// The device it is copied to.
    pub to: usize,
}

/// Executes a [`Graph`] with ops from one or more [`Backend`]s.
pub struct Executor {
    graph: Graph,
    ops: Vec<Box<dyn Op>>,
    devices: Vec<String>,
    node_device: Vec<usize>,
    tasks: Vec<Task>,
    node_inputs: Vec<Vec<usize>>,
    value_device: Vec<usize>,
    value_kind: Vec<ValueKind>,
    output: usize,
    last_use: Vec<usize>,
    plans: HashMap<PlanKey, Plan>,
    current: Option<PlanKey>,
    arenas: Vec<Vec<LineBuffer<f32>>>,
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

impl OpProfile {
    /// The times of `nodes` summed per op kind, largest first.
    pub fn of_nodes(nodes: &[NodeProfile]) -> Vec<OpProfile> {
        let mut by_kind: Vec<OpProfile> = Vec::new();
        for node in nodes {
            match by_kind.iter_mut().find(|p| p.kind == node.kind) {
                Some(p) => {
                    p.nodes += 1;
                    p.total += node.total;
                }
                None => by_kind.push(OpProfile {
                    kind: node.kind,
                    nodes: 1,
                    total: node.total,
                }),
            }
        }
        by_kind.sort_by_key(|p| std::cmp::Reverse(p.total));
        by_kind
    }
}

/// Time spent in one node of the graph while profiling.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeProfile {
    /// The node's name (`model.layers.0.self_attn.attn`, ...).
    pub name: String,
    /// Its op kind.
    pub kind: &'static str,
    /// Its total execute time since profiling was switched on.
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
        let placement = vec![0; graph.nodes().len()];
        Self::with_placement(graph, &[backend], &placement, weights, max_context)
    }

    /// Creates node `i`'s op on `backends[placement[i]]` and loads the
    /// weights; activations that cross devices are copied (see
    /// [`Executor::copies`]), and the output is copied to device 0. First
    /// a gated MLP's gate and up layers and their activation become one
    /// node where the device's backend [fuses](Backend::fuses_gated_linears)
    /// their weights' dtype, then sibling linear layers on one device are
    /// stacked, those of each weight dtype that device's backend
    /// [stacks](Backend::stacks_linears) into one node.
    pub fn with_placement(
        graph: Graph,
        backends: &[&dyn Backend],
        placement: &[usize],
        weights: &dyn WeightSource,
        max_context: usize,
    ) -> Result<Self> {
        if graph.output().is_none() {
            return Err(Error::InvalidInput("the graph has no output".into()));
        }
        if placement.len() != graph.nodes().len() {
            return Err(Error::InvalidInput(format!(
                "placement names {} devices for {} nodes",
                placement.len(),
                graph.nodes().len()
            )));
        }
        if let Some(&d) = placement.iter().find(|&&d| d >= backends.len()) {
            return Err(Error::InvalidInput(format!(
                "placement uses device {d} but only {} backends were given",
                backends.len()
            )));
        }
        let (graph, placement) = fuse_gated_linears(graph, placement, |d, gate, up| {
            let backend = backends[d];
            let (g, u) = (weight_dtype(gate, weights), weight_dtype(up, weights));
            g == u && g.is_some_and(|dtype| backend.fuses_gated_linears(dtype))
        })?;
        let (graph, placement) = stack_sibling_linears(graph, &placement, |d, layer| {
            stack_class(backends[d], layer, weights)
        })?;
        let placement = &placement[..];
        let output = graph.output().expect("stacking keeps the output");
        let mut ops = Vec::with_capacity(graph.nodes().len());
        for (node, &d) in graph.nodes().iter().zip(placement) {
            let mut op = backends[d].create_op(&node.desc).map_err(|e| match e {
                Error::Device(m) => Error::Device(format!(
                    "node '{}' on {}: {m}",
                    node.name,
                    backends[d].name()
                )),
                other => other,
            })?;
            op.load(weights)?;
            ops.push(op);
        }
        for op in &mut ops {
            op.loaded();
        }
        let schedule = Schedule::build(&graph, placement, output.index())?;
        let mut last_use = vec![0; schedule.value_device.len()];
        for (t, task) in schedule.tasks.iter().enumerate() {
            match *task {
                Task::Node(i) => {
                    for &v in &schedule.node_inputs[i] {
                        last_use[v] = t;
                    }
                }
                Task::Copy { src, .. } => last_use[src] = t,
            }
        }
        last_use[schedule.output] = usize::MAX;
        Ok(Executor {
            ops,
            devices: backends.iter().map(|b| b.name()).collect(),
            node_device: placement.to_vec(),
            tasks: schedule.tasks,
            node_inputs: schedule.node_inputs,
            value_device: schedule.value_device,
            value_kind: schedule.value_kind,
            output: schedule.output,
            last_use,
            graph,
            plans: HashMap::new(),
            current: None,
            arenas: backends.iter().map(|_| Vec::new()).collect(),
            slot_lens: Vec::new(),
            max_context,
            reshapes: 0,
            profile: None,
            runner: backends[0].step_runner(),
        })
    }

    /// The copies inserted where activations cross devices, in execution
    /// order (empty on one device).
    pub fn copies(&self) -> Vec<PlannedCopy> {
        self.tasks
            .iter()
            .filter_map(|t| match *t {
                Task::Copy { src, dst } => Some(PlannedCopy {
                    producer: self.graph.producer(Value(src)).map_or_else(
                        || "input".to_string(),
                        |n| self.graph.nodes()[n].name.clone(),
                    ),
                    from: self.value_device[src],
                    to: self.value_device[dst],
                }),
                Task::Node(_) => None,
            })
            .collect()
    }

    /// The device node `i` runs on (an index into the executor's backends).
    pub fn node_device(&self, i: usize) -> usize {
        self.node_device[i]
    }

    /// The names of the executor's devices (`cpu`, `cuda:0`), by index.
    pub fn device_names(&self) -> &[String] {
        &self.devices
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

    /// Makes slot `to` hold the first `len` tokens of the sequence in slot
    /// `from` (`from` is unchanged), so that a new sequence sharing that
    /// prefix continues from it: a fork. The CPU KV cache shares the
    /// prefix's pages and copies a page only when one of the two slots
    /// writes into it, so forking costs no more than a page per layer
    /// however long the prefix. An error when `from` holds fewer than
    /// `len` tokens or is `to`.
    pub fn copy_slot(&mut self, from: usize, to: usize, len: usize) -> Result<()> {
        let held = self.slot_len(from);
        if from == to || len > held {
            return Err(Error::InvalidInput(format!(
                "cannot copy {len} tokens of slot {from} (holding {held}) into slot {to}"
            )));
        }
        for op in &mut self.ops {
            op.copy_slot(from, to, len);
        }
        if self.slot_lens.len() <= to {
            self.slot_lens.resize(to + 1, 0);
        }
        self.slot_lens[to] = len;
        Ok(())
    }

    /// Starts (or, with `false`, stops and clears) timing every node's execute.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(|| vec![Duration::ZERO; self.graph.nodes().len()]);
    }

    /// Execute time of every node since profiling was switched on, in graph
    /// order (empty when profiling is off); [`OpProfile::of_nodes`] sums it
    /// per op kind.
    pub fn node_profile(&self) -> Vec<NodeProfile> {
        let Some(times) = &self.profile else {
            return Vec::new();
        };
        let nodes = self.graph.nodes().iter().zip(times);
        nodes
            .map(|(node, &total)| NodeProfile {
                name: node.name.clone(),
                kind: node.desc.kind_name(),
                total,
            })
            .collect()
    }

    /// How many times the ops were re-planned (shapes recomputed) so far.
    pub fn reshape_count(&self) -> usize {
        self.reshapes
    }

    /// Total f32 elements held by the activation arena.
    pub fn arena_len(&self) -> usize {
        self.arenas.iter().flatten().map(|b| b.len()).sum()
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
        for (arena, sizes) in self.arenas.iter_mut().zip(&plan.buffer_sizes) {
            for (i, &size) in sizes.iter().enumerate() {
                if arena.len() <= i {
                    arena.push(LineBuffer::default());
                }
                arena[i].grow_to(size);
            }
        }
        for (op, node) in self.ops.iter_mut().zip(self.graph.nodes()) {
            op.prepare(&layout).map_err(|e| annotate(e, &node.name))?;
        }
        match self.runner.clone() {
            Some(runner) => {
                let mut result = Ok(());
                runner.run(&mut || result = self.execute(&layout));
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
        let shape = plan.shapes[self.output].clone();
        let (dev, buf) = plan.buffer_of[self.output].expect("outputs are activations");
        let data = self.arenas[dev][buf][..shape.numel()].to_vec();
        Tensor::new(shape, data)
    }

    /// Computes every value's shape with the ops' `reshape` and assigns
    /// buffers by liveness, per device: a buffer is reused once its value
    /// is dead.
    fn reshape(&mut self, layout: &StepLayout) -> Result<Plan> {
        self.reshapes += 1;
        let n_values = self.value_kind.len();
        let mut shapes = vec![Shape::default(); n_values];
        shapes[0] = Shape::new([layout.n_tokens()]);
        let mut pools = vec![BufferPool::default(); self.devices.len()];
        let mut buffer_of = vec![None; n_values];
        for (t, task) in self.tasks.iter().enumerate() {
            let (out, inputs): (usize, &[usize]) = match task {
                &Task::Node(i) => {
                    let node = &self.graph.nodes()[i];
                    let ins = &self.node_inputs[i];
                    let in_shapes: Vec<&Shape> = ins.iter().map(|&v| &shapes[v]).collect();
                    let out_shape = self.ops[i]
                        .reshape(&in_shapes, layout)
                        .map_err(|e| annotate(e, &node.name))?;
                    let out = node.output.index();
                    shapes[out] = out_shape;
                    (out, ins)
                }
                Task::Copy { src, dst } => {
                    shapes[*dst] = shapes[*src].clone();
                    (*dst, std::slice::from_ref(src))
                }
            };
            let handed_over = match task {
                &Task::Node(i) => self.overwritable(i, t, &shapes, &buffer_of),
                Task::Copy { .. } => None,
            };
            if let Some(v) = handed_over {
                buffer_of[out] = buffer_of[v];
            } else if self.value_kind[out] == ValueKind::Activation {
                let dev = self.value_device[out];
                buffer_of[out] = Some((dev, pools[dev].take(shapes[out].numel())));
            }
            for &v in inputs {
                if self.last_use[v] == t && Some(v) != handed_over {
                    if let Some((dev, b)) = buffer_of[v] {
                        pools[dev].release(b);
                    }
                }
            }
        }
        Ok(Plan {
            shapes,
            buffer_of,
            buffer_sizes: pools.into_iter().map(|p| p.sizes).collect(),
        })
    }

    /// The input value of node `i` (task `t`) whose buffer its output takes
    /// over (see `Op::overwritable_input`): an activation on the output's
    /// device, of the output's size, read by no later task and by no other
    /// input of the node.
    fn overwritable(
        &self,
        i: usize,
        t: usize,
        shapes: &[Shape],
        buffer_of: &[Option<(usize, usize)>],
    ) -> Option<usize> {
        let ins = &self.node_inputs[i];
        let v = *ins.get(self.ops[i].overwritable_input()?)?;
        let out = self.graph.nodes()[i].output.index();
        let fits = self.value_kind[out] == ValueKind::Activation
            && self.value_kind[v] == ValueKind::Activation
            && self.value_device[v] == self.value_device[out]
            && self.last_use[v] == t
            && ins.iter().filter(|&&x| x == v).count() == 1
            && shapes[v].numel() == shapes[out].numel()
            && buffer_of[v].is_some();
        fits.then_some(v)
    }

    fn execute(&mut self, layout: &StepLayout) -> Result<()> {
        let key = self.current.expect("planned before execute");
        let plan = &self.plans[&key];
        for task in &self.tasks {
            let i = match *task {
                Task::Copy { src, dst } => {
                    let n = plan.shapes[src].numel();
                    let (sd, sb) = plan.buffer_of[src].expect("copies move activations");
                    let (dd, db) = plan.buffer_of[dst].expect("copies move activations");
                    let mut to = std::mem::take(&mut self.arenas[dd][db]);
                    to[..n].copy_from_slice(&self.arenas[sd][sb][..n]);
                    self.arenas[dd][db] = to;
                    continue;
                }
                Task::Node(i) => i,
            };
            let node = &self.graph.nodes()[i];
            let out = node.output.index();
            let out_place = plan.buffer_of[out];
            let mut out_buf = match out_place {
                Some((d, b)) => std::mem::take(&mut self.arenas[d][b]),
                None => LineBuffer::default(),
            };
            let (earlier, rest) = self.ops.split_at_mut(i);
            let arenas = &self.arenas;
            let inputs = self.node_inputs[i]
                .iter()
                .map(|&idx| {
                    if out_place.is_some() && plan.buffer_of[idx] == out_place {
                        return Ok(OpInput::InOutput);
                    }
                    Ok(match self.value_kind[idx] {
                        ValueKind::Tokens => OpInput::Tokens(&layout.token_ids),
                        ValueKind::Activation => {
                            let shape = &plan.shapes[idx];
                            let (d, b) = plan.buffer_of[idx].expect("activations have buffers");
                            OpInput::Tensor(TensorRef {
                                shape,
                                data: &arenas[d][b][..shape.numel()],
                            })
                        }
                        ValueKind::State => {
                            let producer = self
                                .graph
                                .producer(Value(idx))
                                .expect("state has a producer");
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
            let out_slice = match out_place {
                Some(_) => &mut out_buf[..n],
                None => &mut out_buf[..],
            };
            let started = self.profile.is_some().then(Instant::now);
            let result = rest[0].execute(&inputs, out_slice, layout);
            if let (Some(times), Some(t0)) = (self.profile.as_mut(), started) {
                times[i] += t0.elapsed();
            }
            drop(inputs);
            if let Some((d, b)) = out_place {
                self.arenas[d][b] = out_buf;
            }
            result.map_err(|e| annotate(e, &node.name))?;
        }
        Ok(())
    }
}

/// Buffers of one device while planning: their sizes and which are free.
#[derive(Clone, Debug, Default)]
struct BufferPool {
    sizes: Vec<usize>,
    free: Vec<usize>,
}

impl BufferPool {
    /// A buffer of at least `need` floats: the best-fitting free one, else
    /// the largest free one (grown), else a new one.
    fn take(&mut self, need: usize) -> usize {
        let sizes = &self.sizes;
        let pick = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, &b)| sizes[b] >= need)
            .min_by_key(|(_, &b)| sizes[b])
            .or_else(|| self.free.iter().enumerate().max_by_key(|(_, &b)| sizes[b]))
            .map(|(pos, _)| pos);
        let buf = match pick {
            Some(pos) => self.free.swap_remove(pos),
            None => {
                self.sizes.push(0);
                self.sizes.len() - 1
            }
        };
        self.sizes[buf] = self.sizes[buf].max(need);
        buf
    }

    /// Marks `buf` free (once).
    fn release(&mut self, buf: usize) {
        if !self.free.contains(&buf) {
            self.free.push(buf);
        }
    }
}

/// The execution order with copies, and where every value lives.
struct Schedule {
    tasks: Vec<Task>,
    node_inputs: Vec<Vec<usize>>,
    value_device: Vec<usize>,
    value_kind: Vec<ValueKind>,
    output: usize,
}

impl Schedule {
    /// Inserts a copy before the first node on device `d` that reads an
    /// activation produced on another device (later readers on `d` share
    /// it), and one of the output to device 0 when it is elsewhere. State
    /// cannot be copied: its producer and readers must share a device.
    fn build(graph: &Graph, placement: &[usize], output: usize) -> Result<Schedule> {
        let n = graph.n_values();
        let mut s = Schedule {
            tasks: Vec::with_capacity(graph.nodes().len()),
            node_inputs: Vec::with_capacity(graph.nodes().len()),
            value_device: vec![0; n],
            value_kind: (0..n).map(|v| graph.kind(Value(v))).collect(),
            output,
        };
        let mut copies: HashMap<(usize, usize), usize> = HashMap::new();
        for (i, node) in graph.nodes().iter().enumerate() {
            let d = placement[i];
            let mut inputs = Vec::with_capacity(node.inputs.len());
            for v in &node.inputs {
                let v = v.index();
                let here = match s.value_kind[v] {
                    ValueKind::Tokens => v,
                    _ if s.value_device[v] == d => v,
                    ValueKind::State => {
                        let producer = graph.producer(Value(v)).unwrap_or(0);
                        return Err(Error::InvalidInput(format!(
                            "node '{}' reads the state of '{}', which is placed on another device",
                            node.name,
                            graph.nodes()[producer].name
                        )));
                    }
                    ValueKind::Activation => *copies.entry((v, d)).or_insert_with(|| s.copy(v, d)),
                };
                inputs.push(here);
            }
            s.value_device[node.output.index()] = d;
            s.tasks.push(Task::Node(i));
            s.node_inputs.push(inputs);
        }
        if s.value_device[output] != 0 {
            s.output = s.copy(output, 0);
        }
        Ok(s)
    }

    /// Appends a copy of `src` to device `d` and returns the new value.
    fn copy(&mut self, src: usize, d: usize) -> usize {
        let dst = self.value_kind.len();
        self.value_kind.push(ValueKind::Activation);
        self.value_device.push(d);
        self.tasks.push(Task::Copy { src, dst });
        dst
    }
}

/// The stacking class of `layer` on `backend` (see [`crate::stacking`]):
/// its weights' dtype where the backend stacks it (see
/// [`Backend::stacks_linears`]), else `None`. A weight that cannot be read
/// is left to the layer's own load to report.
fn stack_class(
    backend: &dyn Backend,
    layer: &LinearParams,
    weights: &dyn WeightSource,
) -> Option<DType> {
    let dtype = weight_dtype(layer, weights)?;
    backend.stacks_linears(dtype).then_some(dtype)
}

/// The dtype of `layer`'s weight, `None` when it cannot be read (left to
/// the layer's own load to report).
fn weight_dtype(layer: &LinearParams, weights: &dyn WeightSource) -> Option<DType> {
    let shape = [layer.out_features, layer.in_features];
    Some(weights.weight(&layer.weight, &shape).ok()?.dtype())
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
