//! The planner's cost model: a decode step and a prefill chunk of a model served by one
//! coordinator VM and N expert-node VMs, from the model's sizes (`model.rs`), the routing
//! (`routing.rs`), the VMs' figures (`vms.rs`) and this machine's calibration (`calibrate.rs`).
//!
//! Weights run over R rows take their bytes at the FFN's from-memory rate for the first row and
//! every further row's compute on top (`Scenario::weights_time`). Per decode step at batch B:
//! the coordinator runs its dense weights over B rows and reads each sequence's KV cache; then
//! per MoE layer one call to every node that holds a routed expert: the slowest node's FFN time
//! (its distinct experts over their rows) plus the link: the round trip, a per-call software
//! cost, and the layer's bytes over the narrower of the node's and the coordinator's links, less
//! what of a large answer crossed while the node still computed (it leaves in parts). With
//! the overlap the layer's shared expert runs while the call is out, hiding the smaller of the
//! two; with two micro-batches (batch >= 2) one half computes while the other half's call is out
//! (`Scenario::step_time`). Prefill runs the same terms over a chunk of P rows (every expert
//! touched, compute-bound). Memory per VM: the coordinator holds the dense weights, the token
//! embedding and the KV cache; each node its share of the experts (one copy, round-robin).

use nightshift_proto::link::{MAX_PART_CHUNKS, PART_MIN_BYTES};

use super::routing::Routing;
use super::vms::Vm;
use super::{Calibration, ModelCost};

/// Bytes of one call's request besides the activation rows (`cluster/remote/call.rs` counts
/// the same: ids, layer, types, sizes).
pub const CALL_HEADER_BYTES: f64 = 32.0;
/// Bytes per (expert, row) pair in a request (expert index and row index, u32 each).
pub const PAIR_BYTES: f64 = 8.0;

/// The deployment and workload to predict.
#[derive(Clone, Debug)]
pub struct Scenario<'a> {
    pub model: &'a ModelCost,
    pub routing: &'a Routing,
    pub cal: &'a Calibration,
    pub coordinator: &'a Vm,
    pub node: &'a Vm,
    pub nodes: usize,
    pub batch: usize,
    /// Round trip between the coordinator and a node, seconds.
    pub rtt: f64,
    /// Software cost of one layer call (gRPC, TLS, node dispatch), seconds.
    pub call_overhead: f64,
    /// Context length the KV cache is read over (decode) and held for (memory).
    pub context: usize,
    /// Bytes of one cached KV value (`serve --kv-type`: 4 for f32, 2 for f16, 34/32 for q8_0).
    pub kv_elem_bytes: f64,
    /// Rows per prefill chunk.
    pub prefill_chunk: usize,
    /// The layer's shared expert computed while its routed experts are out.
    pub overlap: bool,
    /// With `overlap` and batch >= 2: two micro-batches whose layer calls alternate.
    pub micro_batches: bool,
    /// The coordinator and the nodes compute on the same cores (nodes on the coordinator's
    /// machine, the `--netns` harness): the overlaps then hide only the time nobody computes
    /// (round trip and wire), never one side's compute behind the other's, and the nodes share
    /// the machine's memory bandwidth ([`Scenario::node_time`]).
    pub shared_cores: bool,
}

/// Network bytes of one layer call at batch B: (to the nodes, from the nodes), total and the
/// busiest node's.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerBytes {
    pub out_total: f64,
    pub in_total: f64,
    pub out_max: f64,
    pub in_max: f64,
}

/// What the planner predicts for a scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// Aggregate decode tokens per second at the scenario's batch.
    pub decode_tok_s: f64,
    /// Decode step time and its parts, seconds.
    pub step: f64,
    pub step_coordinator: f64,
    pub step_nodes: f64,
    pub step_network: f64,
    pub step_hidden: f64,
    pub prefill_tok_s: f64,
    /// Network bytes per decoded token (both ways).
    pub bytes_per_token: f64,
    pub coordinator_bytes: f64,
    pub node_bytes: f64,
    pub fits: bool,
    pub usd_per_hour: f64,
    pub usd_per_mtok: f64,
    /// One PR review: `REVIEW_IN` tokens prefilled, `REVIEW_OUT` decoded, B reviews at a time.
    pub usd_per_review: f64,
}

/// Tokens of the per-PR review the costs are quoted for.
pub const REVIEW_IN: f64 = 20_000.0;
pub const REVIEW_OUT: f64 = 1_000.0;
/// Share of a VM's memory the planner lets the model use (the rest: OS, runtime, buffers).
pub const MEMORY_HEADROOM: f64 = 0.9;

impl Scenario<'_> {
    fn eff_bw(&self, vm: &Vm) -> f64 {
        vm.mem_bw_gbs * 1e9 * self.cal.efficiency()
    }

    fn compute_rate(&self, vm: &Vm) -> f64 {
        self.cal.ffn_byte_rows_per_core * f64::from(vm.cores)
    }

    /// Bytes of one layer call at `batch` rows.
    pub fn layer_bytes(&self, layer: usize, batch: usize) -> LayerBytes {
        let m = self.model;
        let mut b = LayerBytes::default();
        for l in self.routing.node_loads(layer, self.nodes, batch) {
            let out = l.rows * m.act_row_bytes as f64
                + l.pairs * PAIR_BYTES
                + l.called * CALL_HEADER_BYTES;
            let inn = l.pairs * (m.n_embd * 4) as f64;
            b.out_total += out;
            b.in_total += inn;
            b.out_max = b.out_max.max(out);
            b.in_max = b.in_max.max(inn);
        }
        b
    }

    /// Wire time of a call moving `b`, (to the nodes, from them): each way's bytes over the
    /// narrower of the busiest node's link and the coordinator's.
    fn wires(&self, b: &LayerBytes) -> (f64, f64) {
        let (cn, nn) = (
            self.coordinator.net_gbps * 1e9 / 8.0,
            self.node.net_gbps * 1e9 / 8.0,
        );
        (
            (b.out_total / cn).max(b.out_max / nn),
            (b.in_total / cn).max(b.in_max / nn),
        )
    }

    /// The link time of a call moving `b`: round trip, call cost, and the slower way's wire
    /// time (full duplex: each way apart).
    pub fn link_time(&self, b: &LayerBytes) -> f64 {
        let (out, back) = self.wires(b);
        self.rtt + self.call_overhead + out.max(back)
    }

    /// The part of a call's wire time that crosses while its nodes still compute (`node`
    /// seconds): a node sends an answer of at least two `PART_MIN_BYTES` in up to
    /// `MAX_PART_CHUNKS` chunks of whole experts, each but the last as soon as it is computed
    /// (`expert-node/src/parts.rs`), so (k - 1) / k of the smaller of the answer's wire time
    /// and the FFN overlap; the call still waits for its request's wire.
    pub fn answer_overlap(&self, b: &LayerBytes, node: f64) -> f64 {
        let k = (b.in_max as usize / PART_MIN_BYTES).min(MAX_PART_CHUNKS);
        if k < 2 {
            return 0.0;
        }
        let (out, back) = self.wires(b);
        let hidden = back.min(node) * (k - 1) as f64 / k as f64;
        out.max(back) - out.max(back - hidden)
    }

    /// Time to run `bytes` of weights over `rows` rows on `vm`: the first row streams them at the
    /// FFN's from-memory rate (batch 1, its compute included: `Calibration::ffn_gbs`), each
    /// further row adds its compute at the cached rate. The two do not overlap: a kernel whose
    /// batch-1 pass is partly compute-bound pays every extra row's multiply-adds on top (taking
    /// the larger of the two predicted 37% under a K2-shaped layer's measured time at batch 8).
    fn weights_time(&self, vm: &Vm, bytes: f64, rows: f64) -> f64 {
        bytes / self.eff_bw(vm) + (rows - 1.0).max(0.0) * bytes / self.compute_rate(vm)
    }

    /// FFN time of `experts` distinct experts over `pairs` (expert, row) pairs on `vm`: each
    /// expert's weights run over its rows ([`Self::weights_time`], `pairs / experts` on average).
    fn ffn_time(&self, vm: &Vm, experts: f64, pairs: f64) -> f64 {
        if experts <= 0.0 {
            return 0.0;
        }
        let eb = self.model.expert_bytes as f64;
        self.weights_time(vm, experts * eb, pairs / experts)
    }

    /// The slowest node's FFN time in one layer call at `batch` rows. With `shared_cores` the
    /// nodes run on one machine (the coordinator's): their reads share its memory bandwidth and
    /// their compute its cores, so the call also takes at least all nodes' experts and pairs
    /// on the machine: two nodes on one machine read no faster than one process does.
    pub fn node_time(&self, layer: usize, batch: usize) -> f64 {
        let loads = self.routing.node_loads(layer, self.nodes, batch);
        let slowest = loads
            .iter()
            .map(|l| self.ffn_time(self.node, l.experts, l.pairs))
            .fold(0.0, f64::max);
        if !self.shared_cores {
            return slowest;
        }
        let (experts, pairs) = loads
            .iter()
            .fold((0.0, 0.0), |(e, p), l| (e + l.experts, p + l.pairs));
        slowest.max(self.ffn_time(self.coordinator, experts, pairs))
    }

    /// One layer call's remote time at `batch` rows: the slowest node's FFN plus the link,
    /// less the answer's wire time that crossed during the FFN ([`Self::answer_overlap`]).
    pub fn remote_time(&self, layer: usize, batch: usize) -> f64 {
        let (node, b) = (self.node_time(layer, batch), self.layer_bytes(layer, batch));
        node + self.link_time(&b) - self.answer_overlap(&b, node)
    }

    /// The part of a layer call's remote time in which no core of this deployment computes:
    /// the round trip and the wire not crossed during the FFN (the node's FFN and the per-call
    /// software cost run on cores). What an overlap can hide when the cores are shared.
    pub fn idle_time(&self, layer: usize, batch: usize) -> f64 {
        let (node, b) = (self.node_time(layer, batch), self.layer_bytes(layer, batch));
        self.link_time(&b) - self.call_overhead - self.answer_overlap(&b, node)
    }

    /// A decode step from the coordinator's own compute `own` (everything but the routed
    /// experts) and its shared expert's time per MoE layer: without overlap the two add up
    /// layer by layer; with it the shared expert hides up to the layer's remote time; with
    /// micro-batches each layer takes the longer of its compute and half its compute plus a
    /// half batch's remote time (one half computes while the other's call is out). With
    /// `shared_cores` a layer also takes at least all the compute on those cores, one after
    /// the other: the coordinator's, both halves' node FFN and call costs; and the shared expert
    /// hides only the call's idle time ([`Scenario::idle_time`]).
    pub fn step_time(&self, own: f64, shared_layer: f64) -> f64 {
        let (b, l) = (self.batch.max(1), self.model.moe_layers);
        if l == 0 {
            return own;
        }
        if self.overlap && self.micro_batches && b >= 2 {
            let c = own / l as f64;
            let (b1, b2) = (b.div_ceil(2), b / 2);
            return (0..l)
                .map(|i| {
                    let r = self.remote_time(i, b1).max(self.remote_time(i, b2));
                    let mut t = c.max(c / 2.0 + r);
                    if self.shared_cores {
                        let busy = |h| self.node_time(i, h) + self.call_overhead;
                        t = t.max(c + busy(b1) + busy(b2));
                    }
                    t
                })
                .sum();
        }
        own + (0..l)
            .map(|i| {
                let r = self.remote_time(i, b);
                let hideable = if self.shared_cores {
                    self.idle_time(i, b)
                } else {
                    r
                };
                r - if self.overlap {
                    shared_layer.min(hideable)
                } else {
                    0.0
                }
            })
            .sum::<f64>()
    }

    pub fn predict(&self) -> Prediction {
        let m = self.model;
        let (b, l) = (self.batch.max(1), m.moe_layers.max(1));
        let c = self.coordinator;
        let dense = m.dense_bytes as f64;
        let kv_pos = m.kv_floats_per_pos as f64 * self.kv_elem_bytes;
        let kv_read = (b * self.context) as f64 * kv_pos;
        let coord = self.weights_time(c, dense, b as f64) + kv_read / self.eff_bw(c);
        let shared_layer = self.weights_time(c, m.shared_bytes as f64 / l as f64, b as f64);
        let (mut nodes, mut net, mut bytes) = (0.0, 0.0, 0.0);
        for layer in 0..m.moe_layers {
            let lb = self.layer_bytes(layer, b);
            nodes += self.node_time(layer, b);
            net += self.link_time(&lb);
            bytes += lb.out_total + lb.in_total;
        }
        let step = self.step_time(coord, shared_layer);
        let hidden = coord + nodes + net - step;
        let decode_tok_s = b as f64 / step;
        // prefill: a chunk of P rows, compute-bound on every expert the chunk touches
        let p = self.prefill_chunk.max(1);
        let pre_coord = self.weights_time(c, dense, p as f64);
        let mut pre = pre_coord;
        for layer in 0..m.moe_layers {
            pre += self.remote_time(layer, p);
        }
        let prefill_tok_s = p as f64 / pre;
        let coordinator_bytes = (m.dense_bytes + m.embd_bytes) as f64 + kv_read;
        let node_bytes = m.all_expert_bytes() as f64 / self.nodes.max(1) as f64;
        let fits = coordinator_bytes <= MEMORY_HEADROOM * c.memory_bytes()
            && node_bytes <= MEMORY_HEADROOM * self.node.memory_bytes();
        let usd_per_hour = c.usd_per_hour + self.nodes as f64 * self.node.usd_per_hour;
        let usd_per_s = usd_per_hour / 3600.0;
        // B reviews at once: their prefills one after another, then their decodes together
        let review_secs = (b as f64 * REVIEW_IN / prefill_tok_s
            + REVIEW_OUT * b as f64 / decode_tok_s)
            / b as f64;
        Prediction {
            decode_tok_s,
            step,
            step_coordinator: coord,
            step_nodes: nodes,
            step_network: net,
            step_hidden: hidden,
            prefill_tok_s,
            bytes_per_token: bytes / b as f64,
            coordinator_bytes,
            node_bytes,
            fits,
            usd_per_hour,
            usd_per_mtok: usd_per_s / decode_tok_s * 1e6,
            usd_per_review: usd_per_s * review_secs,
        }
    }

    /// Fewest nodes whose memory holds one copy of every expert.
    pub fn min_nodes(model: &ModelCost, node: &Vm) -> usize {
        let per = MEMORY_HEADROOM * node.memory_bytes();
        (model.all_expert_bytes() as f64 / per).ceil().max(1.0) as usize
    }
}
