//! A graph pass that fuses a gated MLP's gate and up layers with their
//! gated activation: `Glu(act, gate(x), up(x))`, where both layers read
//! the same `x` on the same device, have one shape and no bias, and feed
//! nothing else, becomes one [`OpDesc::GatedLinear`] node.
//!
//! A backend whose kernels can apply the activation to the products while
//! they are in the cache says so ([`crate::Backend::fuses_gated_linears`]);
//! the layer's output is then written once, half as wide as the two
//! products, and no `Glu` pass reads them back. Each output is the same
//! number either way: the backend's gated op applies the activation that
//! its `Glu` op applies, value by value.

use crate::graph::{Graph, Value};
use crate::op::{GatedLinearParams, LinearParams, OpDesc};
use crate::rebuild::Rebuild;
use crate::stacking::stacked_name;
use crate::Result;

/// Rewrites `graph` (whose node `i` runs on device `placement[i]`) with
/// every gate/up/`Glu` triple that qualifies (see the module
/// documentation) and that `fuse(device, gate, up)` accepts replaced by
/// one gated node where the `Glu` was, named after both layers, and
/// returns it with the placement of its nodes. Without such a triple the
/// graph comes back unchanged.
pub fn fuse_gated_linears(
    graph: Graph,
    placement: &[usize],
    fuse: impl Fn(usize, &LinearParams, &LinearParams) -> bool,
) -> Result<(Graph, Vec<usize>)> {
    let triples = gated_triples(&graph, placement, fuse);
    if triples.is_empty() {
        return Ok((graph, placement.to_vec()));
    }
    // For each node: fused away (a gate or up layer), or the `Glu` whose
    // place the gated node takes (with its triple).
    let mut role = vec![None; graph.nodes().len()];
    for (t, triple) in triples.iter().enumerate() {
        role[triple.gate] = Some(None);
        role[triple.up] = Some(None);
        role[triple.glu] = Some(Some(t));
    }
    let mut rebuild = Rebuild::new(&graph);
    for (i, node) in graph.nodes().iter().enumerate() {
        match role[i] {
            Some(None) => {}
            None => rebuild.keep(i, placement[i])?,
            Some(Some(t)) => {
                let GatedTriple { gate, up, .. } = triples[t];
                let names = [gate, up].map(|m| graph.nodes()[m].name.as_str());
                let desc = OpDesc::GatedLinear(triples[t].params.clone());
                let inputs = rebuild.values(&graph.nodes()[gate].inputs);
                let gated = rebuild.add(stacked_name(&names), desc, &inputs, placement[i])?;
                rebuild.map(node.output, gated);
            }
        }
    }
    rebuild.finish()
}

/// A gate layer, an up layer and the `Glu` that reads them (node indices),
/// with the gated node's parameters.
struct GatedTriple {
    gate: usize,
    up: usize,
    glu: usize,
    params: GatedLinearParams,
}

/// The triples that qualify and that `fuse` accepts.
fn gated_triples(
    graph: &Graph,
    placement: &[usize],
    fuse: impl Fn(usize, &LinearParams, &LinearParams) -> bool,
) -> Vec<GatedTriple> {
    let mut readers = vec![0usize; graph.n_values()];
    for node in graph.nodes() {
        for &v in &node.inputs {
            readers[v.index()] += 1;
        }
    }
    if let Some(v) = graph.output() {
        readers[v.index()] += 1;
    }
    let nodes = graph.nodes();
    let as_linear = |v: Value| {
        let i = graph.producer(v)?;
        match &nodes[i].desc {
            OpDesc::Linear(p) if readers[v.index()] == 1 => Some((i, p)),
            _ => None,
        }
    };
    let mut triples = Vec::new();
    for (glu, node) in nodes.iter().enumerate() {
        let (&OpDesc::Glu(act), &[g, u]) = (&node.desc, &node.inputs[..]) else {
            continue;
        };
        if g == u {
            continue;
        }
        let (Some((gate, gp)), Some((up, upp))) = (as_linear(g), as_linear(u)) else {
            continue;
        };
        let device = placement[glu];
        let qualifies = nodes[gate].inputs == nodes[up].inputs
            && placement[gate] == device
            && placement[up] == device
            && gp.in_features == upp.in_features
            && gp.out_features == upp.out_features
            && gp.bias.is_none()
            && upp.bias.is_none();
        if qualifies && fuse(device, gp, upp) {
            let params = GatedLinearParams {
                gate: gp.clone(),
                up: upp.clone(),
                act,
            };
            triples.push(GatedTriple {
                gate,
                up,
                glu,
                params,
            });
        }
    }
    triples
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::Linear;
    use crate::op::Activation;

    /// An MLP on an embedding: `down(act(gate(x)) · up(x))`, eight nodes
    /// counting the embedding, with `bias` on the gate layer.
    fn mlp(act: Activation, bias: bool) -> Graph {
        let (mut g, tokens) = Graph::new();
        let x = crate::layers::Embedding::new(10, 8, "embed")
            .call(&mut g, tokens)
            .unwrap();
        let gate = Linear::new(8, 16, bias, "mlp.gate")
            .call(&mut g, x)
            .unwrap();
        let up = Linear::new(8, 16, false, "mlp.up").call(&mut g, x).unwrap();
        let h = g.glu(act, gate, up).unwrap();
        let y = Linear::new(16, 8, false, "mlp.down")
            .call(&mut g, h)
            .unwrap();
        g.set_output(y).unwrap();
        g
    }

    fn names(g: &Graph) -> Vec<&str> {
        g.nodes().iter().map(|n| n.name.as_str()).collect()
    }

    #[test]
    fn gate_up_and_glu_become_one_node_where_the_glu_was() {
        for act in [Activation::Silu, Activation::GeluTanh] {
            let asked = std::cell::RefCell::new(Vec::new());
            let (g, placement) = fuse_gated_linears(mlp(act, false), &[0; 5], |d, gate, up| {
                asked
                    .borrow_mut()
                    .push((d, gate.weight.clone(), up.weight.clone()));
                true
            })
            .unwrap();
            let want_asked = (0, "mlp.gate.weight".into(), "mlp.up.weight".into());
            assert_eq!(asked.into_inner(), [want_asked]);
            assert_eq!(names(&g), ["embed", "mlp.gate+up", "mlp.down"]);
            assert_eq!(placement, [0; 3]);
            let fused = &g.nodes()[1];
            let OpDesc::GatedLinear(p) = &fused.desc else {
                panic!("{:?}", fused.desc)
            };
            assert_eq!(
                (p.gate.weight.as_str(), p.up.weight.as_str()),
                ("mlp.gate.weight", "mlp.up.weight")
            );
            assert_eq!((p.gate.out_features, p.act), (16, act));
            assert_eq!(fused.inputs, [g.nodes()[0].output]);
            assert_eq!(g.nodes()[2].inputs, [fused.output]);
            assert_eq!(g.output(), Some(g.nodes()[2].output));
        }
    }

    #[test]
    fn nothing_changes_where_fusing_is_refused_or_does_not_apply() {
        let unchanged = |g: Graph, placement: &[usize], accept: bool| {
            let before: Vec<String> = g.nodes().iter().map(|n| n.name.clone()).collect();
            let (after, new_placement) =
                fuse_gated_linears(g, placement, |_, _, _| accept).unwrap();
            assert_eq!(names(&after), before);
            assert_eq!(new_placement, placement);
        };
        // The backend says no.
        unchanged(mlp(Activation::Silu, false), &[0; 5], false);
        // A gate with a bias.
        unchanged(mlp(Activation::Silu, true), &[0; 5], true);
        // Up on another device than gate.
        unchanged(mlp(Activation::Silu, false), &[0, 0, 1, 0, 0], true);
        // The gate's output read by another node too.
        let (mut g, tokens) = Graph::new();
        let x = crate::layers::Embedding::new(10, 8, "embed")
            .call(&mut g, tokens)
            .unwrap();
        let gate = Linear::new(8, 16, false, "gate").call(&mut g, x).unwrap();
        let up = Linear::new(8, 16, false, "up").call(&mut g, x).unwrap();
        let h = g.swiglu(gate, up).unwrap();
        let out = g.add(h, gate).unwrap();
        g.set_output(out).unwrap();
        unchanged(g, &[0; 5], true);
        // Gate and up on different inputs, and of different widths.
        let (mut g, tokens) = Graph::new();
        let x = crate::layers::Embedding::new(10, 8, "embed")
            .call(&mut g, tokens)
            .unwrap();
        let x2 = g.scale(x, 2.0).unwrap();
        let gate = Linear::new(8, 16, false, "gate").call(&mut g, x).unwrap();
        let up = Linear::new(8, 16, false, "up").call(&mut g, x2).unwrap();
        let a = g.swiglu(gate, up).unwrap();
        let wide = Linear::new(8, 32, false, "wide").call(&mut g, x).unwrap();
        let narrow = Linear::new(8, 16, false, "narrow").call(&mut g, x).unwrap();
        let wide = g.slice_columns(wide, 0, 16).unwrap();
        let b = g.swiglu(wide, narrow).unwrap();
        let out = g.add(a, b).unwrap();
        g.set_output(out).unwrap();
        unchanged(g, &[0; 11], true);
    }
}
