//! A graph pass that stacks sibling linear layers: layers that read the
//! same activation on the same device, such as an attention block's q, k
//! and v projections, become one [`OpDesc::StackedLinear`] node followed
//! by one column slice per layer.
//!
//! One larger product instead of several small ones pays for its hand-over
//! to the threads and for quantizing its input once: in a decode step of a
//! small model each projection is a call of a few microseconds, and that
//! fixed cost is a good part of it. A layer's outputs are the same numbers
//! either way (each output is its own weight row's dot product), so the
//! backend decides where it pays ([`crate::Backend::stacks_linears`]) and
//! the executor applies the pass when it builds its ops. Siblings stack by
//! class (for the CPU, the weights' dtype): in a file that gives an
//! attention block's v projection more bits than q and k, as llama.cpp's
//! K-quant mixes do, q and k still become one node and v stays alone.
//!
//! A gated MLP's gate and up layers stay apart: stacked, the `Glu` would
//! read them through slices or as the two halves of one value, and could
//! no longer write its output over its input, so a long prompt's step
//! would hold the whole stacked output next to the `Glu`'s (17 MiB more
//! at 512 tokens of a 1B model), for no speed that could be measured.
//! Where the backend's kernels can apply the activation themselves, the
//! three become one node instead (see [`crate::gating`]).

use std::hash::Hash;

use indexmap::IndexMap;

use crate::graph::{Graph, Value};
use crate::op::{ColumnSlice, LinearParams, OpDesc};
use crate::rebuild::Rebuild;
use crate::Result;

/// Linear nodes that may share one stacked node: same input, device,
/// input width and bias presence.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct SiblingKey {
    input: Value,
    device: usize,
    in_features: usize,
    bias: bool,
}

/// Rewrites `graph` (whose node `i` runs on device `placement[i]`) with
/// every group of two or more sibling linear layers of one class stacked,
/// and returns it with the placement of its nodes. `stack_class(device,
/// layer)` gives a layer's class, or `None` for a layer that is never
/// stacked. Each group's stacked node takes the place of its first layer;
/// the slices that give each layer's output follow it, named after the
/// layer. Without such a group, the graph comes back unchanged.
pub fn stack_sibling_linears<C: Eq + Hash>(
    graph: Graph,
    placement: &[usize],
    stack_class: impl Fn(usize, &LinearParams) -> Option<C>,
) -> Result<(Graph, Vec<usize>)> {
    let groups = sibling_groups(&graph, placement, stack_class);
    if groups.is_empty() {
        return Ok((graph, placement.to_vec()));
    }
    // The group each node belongs to, and whether it is the group's first.
    let mut member_of = vec![None; graph.nodes().len()];
    for (g, members) in groups.iter().enumerate() {
        for (k, &i) in members.iter().enumerate() {
            member_of[i] = Some((g, k == 0));
        }
    }
    let mut rebuild = Rebuild::new(&graph);
    for (i, node) in graph.nodes().iter().enumerate() {
        match member_of[i] {
            None => rebuild.keep(i, placement[i])?,
            Some((_, false)) => {}
            Some((g, true)) => {
                let members = &groups[g];
                let layers: Vec<LinearParams> =
                    members.iter().map(|&m| linear(&graph, m).clone()).collect();
                let names: Vec<&str> = members
                    .iter()
                    .map(|&m| graph.nodes()[m].name.as_str())
                    .collect();
                let inputs = rebuild.values(&node.inputs);
                let desc = OpDesc::StackedLinear(layers.clone());
                let stacked = rebuild.add(stacked_name(&names), desc, &inputs, placement[i])?;
                let mut start = 0;
                for (&m, layer) in members.iter().zip(&layers) {
                    let len = layer.out_features;
                    let slice = OpDesc::SliceColumns(ColumnSlice { start, len });
                    let member = &graph.nodes()[m];
                    let name = format!("{}.columns", member.name);
                    let columns = rebuild.add(name, slice, &[stacked], placement[i])?;
                    rebuild.map(member.output, columns);
                    start += len;
                }
            }
        }
    }
    rebuild.finish()
}

/// The groups of two or more sibling linear nodes of one class (see
/// [`stack_sibling_linears`]), each in graph order, in the order of their
/// first nodes.
fn sibling_groups<C: Eq + Hash>(
    graph: &Graph,
    placement: &[usize],
    stack_class: impl Fn(usize, &LinearParams) -> Option<C>,
) -> Vec<Vec<usize>> {
    let mut by_key: IndexMap<(SiblingKey, C), Vec<usize>> = IndexMap::new();
    for (i, node) in graph.nodes().iter().enumerate() {
        if let OpDesc::Linear(p) = &node.desc {
            let Some(class) = stack_class(placement[i], p) else {
                continue;
            };
            let key = SiblingKey {
                input: node.inputs[0],
                device: placement[i],
                in_features: p.in_features,
                bias: p.bias.is_some(),
            };
            by_key.entry((key, class)).or_default().push(i);
        }
    }
    by_key
        .into_values()
        .filter(|members| members.len() >= 2 && !feed_one_glu(graph, members))
        .collect()
}

/// Whether some `Glu` reads two different outputs of `members` (a gated
/// MLP's gate and up layers).
fn feed_one_glu(graph: &Graph, members: &[usize]) -> bool {
    let outputs: Vec<Value> = members.iter().map(|&m| graph.nodes()[m].output).collect();
    graph
        .nodes()
        .iter()
        .any(|n| match (&n.desc, &n.inputs[..]) {
            (OpDesc::Glu(_), [gate, up]) => {
                gate != up && outputs.contains(gate) && outputs.contains(up)
            }
            _ => false,
        })
}

/// The parameters of linear node `i`.
fn linear(graph: &Graph, i: usize) -> &LinearParams {
    match &graph.nodes()[i].desc {
        OpDesc::Linear(p) => p,
        _ => unreachable!("sibling groups hold linear nodes only"),
    }
}

/// `a.b.q_proj+k_proj+v_proj` for layers `a.b.q_proj`, `a.b.k_proj` and
/// `a.b.v_proj`; the full names joined by `+` when their parents differ.
pub(crate) fn stacked_name(names: &[&str]) -> String {
    let parent = |n: &'_ str| n.rsplit_once('.').map(|(p, _)| p.to_string());
    let first = parent(names[0]);
    match first {
        Some(p)
            if names
                .iter()
                .all(|n| parent(n).as_deref() == Some(p.as_str())) =>
        {
            let leaves: Vec<&str> = names.iter().map(|n| &n[p.len() + 1..]).collect();
            format!("{p}.{}", leaves.join("+"))
        }
        _ => names.join("+"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::Linear;
    use crate::op::Activation;

    /// A graph of one node, `embed`, and its output (8 wide).
    fn embedded() -> (Graph, Value) {
        let (mut g, tokens) = Graph::new();
        let embed = crate::layers::Embedding::new(10, 8, "embed");
        let x = embed.call(&mut g, tokens).unwrap();
        (g, x)
    }

    /// Twelve nodes: q, k and v on the embedding `x`, gate and up on
    /// `h = q + q`, a lone linear on `k + v`, and down.
    fn toy() -> (Graph, Vec<String>) {
        let (mut g, x) = embedded();
        let q = Linear::new(8, 8, false, "attn.q").call(&mut g, x).unwrap();
        let k = Linear::new(8, 4, false, "attn.k").call(&mut g, x).unwrap();
        let h = g.add(q, q).unwrap();
        let v = Linear::new(8, 4, false, "attn.v").call(&mut g, x).unwrap();
        let kv = g.add(k, v).unwrap();
        let gate = Linear::new(8, 16, false, "mlp.gate")
            .call(&mut g, h)
            .unwrap();
        let up = Linear::new(8, 16, false, "mlp.up").call(&mut g, h).unwrap();
        let a = g.glu(Activation::Silu, gate, up).unwrap();
        let lone = Linear::new(4, 8, false, "lone").call(&mut g, kv).unwrap();
        let y = Linear::new(16, 8, false, "down").call(&mut g, a).unwrap();
        let out = g.add(y, lone).unwrap();
        g.set_output(out).unwrap();
        let names = g.nodes().iter().map(|n| n.name.clone()).collect();
        (g, names)
    }

    fn names(g: &Graph) -> Vec<&str> {
        g.nodes().iter().map(|n| n.name.as_str()).collect()
    }

    /// The node `name` and its inputs' producers' names.
    fn inputs_of<'g>(g: &'g Graph, name: &str) -> Vec<&'g str> {
        let node = g.nodes().iter().find(|n| n.name == name).unwrap();
        node.inputs
            .iter()
            .map(|&v| {
                g.producer(v)
                    .map_or("tokens", |p| g.nodes()[p].name.as_str())
            })
            .collect()
    }

    #[test]
    fn siblings_become_one_stacked_node_and_slices() {
        let (g, _) = toy();
        let (s, placement) = stack_sibling_linears(g, &[0; 12], |_, _| Some(())).unwrap();
        assert_eq!(
            names(&s),
            [
                "embed",
                "attn.q+k+v",
                "attn.q.columns",
                "attn.k.columns",
                "attn.v.columns",
                "add.3",
                "add.5",
                "mlp.gate",
                "mlp.up",
                "glu.8",
                "lone",
                "down",
                "add.11",
            ]
        );
        assert_eq!(placement, vec![0; 13]);
        let layers = |name: &str| match &s.nodes().iter().find(|n| n.name == name).unwrap().desc {
            OpDesc::StackedLinear(l) => l.iter().map(|p| p.weight.clone()).collect::<Vec<_>>(),
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(
            layers("attn.q+k+v"),
            ["attn.q.weight", "attn.k.weight", "attn.v.weight"]
        );
        let slice = |name: &str| match s.nodes().iter().find(|n| n.name == name).unwrap().desc {
            OpDesc::SliceColumns(c) => (c.start, c.len),
            ref other => panic!("{name}: {other:?}"),
        };
        assert_eq!(slice("attn.q.columns"), (0, 8));
        assert_eq!(slice("attn.k.columns"), (8, 4));
        assert_eq!(slice("attn.v.columns"), (12, 4));
        assert_eq!(inputs_of(&s, "attn.q+k+v"), ["embed"]);
        assert_eq!(inputs_of(&s, "add.5"), ["attn.k.columns", "attn.v.columns"]);
        assert_eq!(inputs_of(&s, "glu.8"), ["mlp.gate", "mlp.up"]);
        assert_eq!(inputs_of(&s, "add.11"), ["down", "lone"]);
        let out = s.producer(s.output().unwrap()).unwrap();
        assert_eq!(s.nodes()[out].name, "add.11");
    }

    /// Gate and up layers stay apart only when one `Glu` reads them both.
    #[test]
    fn only_the_inputs_of_one_glu_stay_apart() {
        let (mut g, x) = embedded();
        let gate = Linear::new(8, 16, false, "gate").call(&mut g, x).unwrap();
        let up = Linear::new(8, 16, false, "up").call(&mut g, x).unwrap();
        let a = g.glu(Activation::Silu, up, up).unwrap();
        let out = g.add(a, gate).unwrap();
        g.set_output(out).unwrap();
        let (s, _) = stack_sibling_linears(g, &[0; 5], |_, _| Some(())).unwrap();
        assert_eq!(
            names(&s),
            [
                "embed",
                "gate+up",
                "gate.columns",
                "up.columns",
                "glu.3",
                "add.4"
            ]
        );
        assert_eq!(inputs_of(&s, "glu.3"), ["up.columns", "up.columns"]);
    }

    #[test]
    fn nothing_changes_where_stacking_is_refused() {
        let (g, before) = toy();
        let (s, placement) = stack_sibling_linears(g, &[0; 12], |_, _| None::<()>).unwrap();
        assert_eq!(names(&s), before);
        assert_eq!(placement, vec![0; 12]);
    }

    #[test]
    fn the_class_is_asked_per_layer_with_its_device() {
        let (g, _) = toy();
        let mut placement = vec![0; 12];
        placement[7] = 1; // mlp.up on another device than mlp.gate
        let asked = std::cell::RefCell::new(Vec::new());
        let (s, new_placement) = stack_sibling_linears(g, &placement, |d, layer| {
            asked.borrow_mut().push((d, layer.weight.clone()));
            Some(())
        })
        .unwrap();
        let want = [
            "attn.q", "attn.k", "attn.v", "mlp.gate", "mlp.up", "lone", "down",
        ];
        let devices = [0, 0, 0, 0, 1, 0, 0];
        let want: Vec<(usize, String)> = devices
            .iter()
            .zip(want)
            .map(|(&d, n)| (d, format!("{n}.weight")))
            .collect();
        assert_eq!(asked.into_inner(), want);
        let up = names(&s).iter().position(|&n| n == "mlp.up").unwrap();
        assert_eq!(new_placement[up], 1);
        assert_eq!(new_placement.iter().filter(|&&d| d == 1).count(), 1);
    }

    /// Siblings of two classes become one stacked node per class with two
    /// or more layers; a layer alone in its class, or without one, stays.
    #[test]
    fn siblings_stack_by_class() {
        let (mut g, x) = embedded();
        Linear::new(8, 8, false, "q").call(&mut g, x).unwrap();
        let k = Linear::new(8, 4, false, "k").call(&mut g, x).unwrap();
        let v = Linear::new(8, 4, false, "v").call(&mut g, x).unwrap();
        let o = Linear::new(8, 4, false, "o").call(&mut g, x).unwrap();
        let kv = g.add(k, v).unwrap();
        let ko = g.add(kv, o).unwrap();
        g.set_output(ko).unwrap();
        let class = |_: usize, layer: &LinearParams| match layer.weight.as_str() {
            "q.weight" | "k.weight" => Some(5),
            "v.weight" => Some(8),
            _ => None,
        };
        let (s, _) = stack_sibling_linears(g, &[0; 7], class).unwrap();
        assert_eq!(
            names(&s),
            [
                "embed",
                "q+k",
                "q.columns",
                "k.columns",
                "v",
                "o",
                "add.5",
                "add.6"
            ]
        );
        assert_eq!(inputs_of(&s, "q+k"), ["embed"]);
        assert_eq!(inputs_of(&s, "add.5"), ["k.columns", "v"]);
        assert_eq!(inputs_of(&s, "add.6"), ["add.5", "o"]);
    }

    #[test]
    fn layers_with_and_without_bias_stay_apart() {
        let (mut g, x) = embedded();
        let a = Linear::new(8, 8, true, "a").call(&mut g, x).unwrap();
        let b = Linear::new(8, 8, false, "b").call(&mut g, x).unwrap();
        let c = Linear::new(8, 8, true, "c").call(&mut g, x).unwrap();
        let ab = g.add(a, b).unwrap();
        let out = g.add(ab, c).unwrap();
        g.set_output(out).unwrap();
        let (s, _) = stack_sibling_linears(g, &[0; 6], |_, _| Some(())).unwrap();
        assert_eq!(
            names(&s),
            [
                "embed",
                "a+c",
                "a.columns",
                "c.columns",
                "b",
                "add.4",
                "add.5"
            ]
        );
        assert_eq!(inputs_of(&s, "add.4"), ["a.columns", "b"]);
    }

    #[test]
    fn stacked_names_share_their_parent() {
        assert_eq!(stacked_name(&["l.0.q", "l.0.k"]), "l.0.q+k");
        assert_eq!(stacked_name(&["l.0.q", "l.1.k"]), "l.0.q+l.1.k");
        assert_eq!(stacked_name(&["q", "k"]), "q+k");
    }
}
