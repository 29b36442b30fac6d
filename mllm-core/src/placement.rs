//! Which device each node of a graph runs on: everything on the CPU,
//! everything on an accelerator, or the first N decoder layers on it (as
//! llama.cpp's `-ngl`). Model code never names a device; the policy reads
//! the decoder layer of every node from the graph.

use std::fmt;
use std::str::FromStr;

use crate::graph::Graph;
use crate::{Error, Result};

/// A device to run on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Device {
    /// The CPU backend.
    #[default]
    Cpu,
    /// CUDA device `N`.
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for Device {
    type Err = Error;

    /// `cpu`, `cuda` (device 0) or `cuda:N`.
    fn from_str(s: &str) -> Result<Device> {
        let bad = || Error::InvalidInput(format!("unknown device '{s}' (use cpu, cuda or cuda:N)"));
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(bad),
        }
    }
}

/// Where a model's nodes run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// The device for the placed nodes.
    pub device: Device,
    /// With `Some(n)`, only the nodes of decoder layers `0..n` run on
    /// `device`; the embedding, the other layers and the head stay on the
    /// CPU. With `None`, every node runs on `device`.
    pub layers: Option<usize>,
}

impl Placement {
    /// The placement of the `--device` and `--gpu-layers` flags: the
    /// device named (default: the CPU, or `cuda:0` when only
    /// `--gpu-layers` is given), with only the first `gpu_layers` decoder
    /// layers on it when given.
    pub fn from_flags(device: Option<&str>, gpu_layers: Option<usize>) -> Result<Placement> {
        let device = match (device, gpu_layers) {
            (Some(d), _) => d.parse()?,
            (None, Some(_)) => Device::Cuda(0),
            (None, None) => Device::Cpu,
        };
        if device == Device::Cpu && gpu_layers.is_some() {
            return Err(Error::InvalidInput(
                "--gpu-layers places layers on a GPU: use it with --device cuda[:N]".into(),
            ));
        }
        Ok(Placement {
            device,
            layers: gpu_layers,
        })
    }

    /// Device index per node: 0 for the CPU, 1 for `self.device` (when it
    /// is not the CPU).
    pub fn assign(&self, graph: &Graph) -> Vec<usize> {
        let accel = usize::from(self.device != Device::Cpu);
        match self.layers {
            None => vec![accel; graph.nodes().len()],
            Some(n) => node_layers(graph)
                .into_iter()
                .map(|l| if l.is_some_and(|l| l < n) { accel } else { 0 })
                .collect(),
        }
    }
}

/// The decoder layer of every node: from its name (`model.layers.3.mlp`,
/// `transformer.h.3.attn`, `model.decoder.layers.3.fc1`), and for unnamed
/// nodes (`add.57`) the layer of the node before them. Nodes outside the
/// layers (embeddings, final norm, head) get `None`.
pub fn node_layers(graph: &Graph) -> Vec<Option<usize>> {
    let mut current = None;
    graph
        .nodes()
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let unnamed = node.name == format!("{}.{i}", node.desc.kind_name());
            if !unnamed {
                current = layer_in_name(&node.name);
            }
            current
        })
        .collect()
}

/// The number after a `layers`, `h` or `blocks` segment of a dotted name.
fn layer_in_name(name: &str) -> Option<usize> {
    let parts: Vec<&str> = name.split('.').collect();
    parts
        .windows(2)
        .find(|w| matches!(w[0], "layers" | "h" | "blocks") && w[1].parse::<usize>().is_ok())
        .and_then(|w| w[1].parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda(0));
        assert_eq!("cuda:2".parse::<Device>().unwrap(), Device::Cuda(2));
        assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
        let e = "gpu".parse::<Device>().unwrap_err().to_string();
        assert!(e.contains("unknown device 'gpu'"), "{e}");
        assert!("cuda:x".parse::<Device>().is_err());
        let p = Placement::from_flags(None, Some(4)).unwrap();
        assert_eq!((p.device, p.layers), (Device::Cuda(0), Some(4)));
        assert_eq!(
            Placement::from_flags(None, None).unwrap(),
            Placement::default()
        );
        assert!(Placement::from_flags(Some("cpu"), Some(2)).is_err());
    }

    #[test]
    fn layer_numbers_come_from_names() {
        assert_eq!(layer_in_name("model.layers.12.self_attn.q_proj"), Some(12));
        assert_eq!(layer_in_name("transformer.h.3.attn.c_attn"), Some(3));
        assert_eq!(layer_in_name("model.decoder.layers.0.fc1"), Some(0));
        assert_eq!(layer_in_name("model.norm"), None);
        assert_eq!(layer_in_name("lm_head"), None);
    }
}
