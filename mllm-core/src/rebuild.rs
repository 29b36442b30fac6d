//! A graph rebuilt node by node from another one, the frame of the graph
//! passes that replace nodes ([`crate::stacking`], [`crate::gating`]): the
//! new graph, the device of each of its nodes, and where each old value
//! went.

use crate::graph::{Graph, Value};
use crate::op::OpDesc;
use crate::Result;

/// A new graph being built from `old` (whose node `i` ran on device
/// `placement[i]`), in the old graph's order.
pub(crate) struct Rebuild<'g> {
    old: &'g Graph,
    graph: Graph,
    placement: Vec<usize>,
    /// The new value of each old one that has been given one.
    remap: Vec<Option<Value>>,
}

impl<'g> Rebuild<'g> {
    /// An empty rebuild of `old`: only its token input has its new value.
    pub(crate) fn new(old: &'g Graph) -> Self {
        let (graph, tokens) = Graph::new();
        let mut remap = vec![None; old.n_values()];
        remap[0] = Some(tokens);
        Rebuild {
            old,
            graph,
            placement: Vec::with_capacity(old.nodes().len()),
            remap,
        }
    }

    /// The new values of the old values `old` (each a graph input or the
    /// output of a node already rebuilt, as the old graph's order keeps).
    pub(crate) fn values(&self, old: &[Value]) -> Vec<Value> {
        old.iter().map(|&v| self.value(v)).collect()
    }

    /// The new value of the old value `old` (as in [`Rebuild::values`]).
    fn value(&self, old: Value) -> Value {
        self.remap[old.index()].expect("a node's inputs come before it")
    }

    /// Adds a node on `device` reading the new values `inputs`; returns
    /// its output.
    pub(crate) fn add(
        &mut self,
        name: String,
        desc: OpDesc,
        inputs: &[Value],
        device: usize,
    ) -> Result<Value> {
        let output = self.graph.add_node(name, desc, inputs)?;
        self.placement.push(device);
        Ok(output)
    }

    /// Makes `new` the value that stands for the old value `old`.
    pub(crate) fn map(&mut self, old: Value, new: Value) {
        self.remap[old.index()] = Some(new);
    }

    /// Copies the old graph's node `i` unchanged onto `device`.
    pub(crate) fn keep(&mut self, i: usize, device: usize) -> Result<()> {
        let node = &self.old.nodes()[i];
        let inputs = self.values(&node.inputs);
        let output = self.add(node.name.clone(), node.desc.clone(), &inputs, device)?;
        self.map(node.output, output);
        Ok(())
    }

    /// The new graph, with the new value of the old output as its output,
    /// and the device of each of its nodes.
    pub(crate) fn finish(mut self) -> Result<(Graph, Vec<usize>)> {
        if let Some(v) = self.old.output() {
            self.graph.set_output(self.value(v))?;
        }
        Ok((self.graph, self.placement))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::{Embedding, Linear};

    /// embed → a → b, b the output.
    fn chain() -> Graph {
        let (mut g, tokens) = Graph::new();
        let x = Embedding::new(10, 8, "embed").call(&mut g, tokens).unwrap();
        let a = Linear::new(8, 8, false, "a").call(&mut g, x).unwrap();
        let b = Linear::new(8, 4, false, "b").call(&mut g, a).unwrap();
        g.set_output(b).unwrap();
        g
    }

    fn names(g: &Graph) -> Vec<&str> {
        g.nodes().iter().map(|n| n.name.as_str()).collect()
    }

    #[test]
    fn kept_nodes_keep_their_inputs_devices_and_the_output() {
        let old = chain();
        let mut rebuild = Rebuild::new(&old);
        for (i, device) in [3, 1, 2].into_iter().enumerate() {
            rebuild.keep(i, device).unwrap();
        }
        let (new, placement) = rebuild.finish().unwrap();
        assert_eq!(names(&new), ["embed", "a", "b"]);
        assert_eq!(placement, [3, 1, 2]);
        for (n, o) in new.nodes().iter().zip(old.nodes()) {
            assert_eq!((&n.inputs, n.output), (&o.inputs, o.output));
        }
        assert_eq!(new.output(), old.output());
    }

    #[test]
    fn a_replaced_node_stands_for_the_old_value_it_is_mapped_to() {
        let old = chain();
        let mut rebuild = Rebuild::new(&old);
        rebuild.keep(0, 0).unwrap();
        // Node "a" is dropped; "b" is replaced by a node "c" that reads
        // the embedding, and "c" stands for "b"'s output.
        let inputs = rebuild.values(&old.nodes()[1].inputs);
        let desc = old.nodes()[2].desc.clone();
        let c = rebuild.add("c".into(), desc, &inputs, 5).unwrap();
        rebuild.map(old.nodes()[2].output, c);
        let (new, placement) = rebuild.finish().unwrap();
        assert_eq!(names(&new), ["embed", "c"]);
        assert_eq!(placement, [0, 5]);
        assert_eq!(new.nodes()[1].inputs, [new.nodes()[0].output]);
        assert_eq!(new.output(), Some(c));
    }
}
