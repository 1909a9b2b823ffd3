//! The capacity planner behind `nightshift plan-cluster`: how many VMs of which size a MoE
//! model needs, at what decode and prefill speed, network traffic, memory per VM and cost.
//!
//! It lives in the coordinator (not in `nightshift-atlas simulate`) because its inputs are the
//! runtime's: `gen-model`'s presets and the GGUF reader for the model's sizes, `expert_ffn` for
//! the calibration, and the layer call's wire format for the bytes; atlas must not depend on
//! the model crate, and `cluster-report --netns` (benches) calls the same cost model to put its
//! prediction next to what the namespaces measure.
//!
//! `model` the model's sizes, `vms` the VM table (shipped in `coordinator/data/vms.toml`, each
//! figure with a source), `routing` selection probabilities and per-node loads, `calibrate`
//! this machine's measured memory and FFN figures, `predict` the cost model.

mod calibrate;
mod model;
mod predict;
mod routing;
mod vms;

pub use calibrate::Calibration;
pub use model::ModelCost;
pub use predict::{
    LayerBytes, Prediction, Scenario, CALL_HEADER_BYTES, MEMORY_HEADROOM, PAIR_BYTES, REVIEW_IN,
    REVIEW_OUT,
};
pub use routing::{NodeLoad, Routing};
pub use vms::{Sources, Vm, VmTable, BUILTIN_VMS};

/// What can be wrong with the planner's inputs.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("model: {0}")]
    Model(String),
    #[error("vm table {what}: {msg}")]
    Vms { what: String, msg: String },
    #[error("routing: {0}")]
    Routing(String),
    #[error("calibration: {0}")]
    Calibration(String),
    #[error("{0}")]
    Input(String),
}
