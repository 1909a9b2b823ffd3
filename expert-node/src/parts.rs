//! A data link's answer sent in parts (`nightshift_proto::link::PART`): when the coordinator
//! allows it and the answer is large, the request's expert groups are computed in chunks, and
//! every chunk but the last goes out as soon as it is done, so those rows cross the network
//! while the node computes the rest; the response carries the last chunk's rows. At decode a
//! node's answer is one f32 row of `n_embd` per (expert, row) pair, most of the bytes of a layer
//! call (8 rows x 8 experts of a 7168-wide model: 1.8 MB), and it used to leave only after the
//! last expert. Every row is what one answer would hold: a pair's row depends only on its expert
//! and activation row, not on what else is computed with it.

use nightshift_model::expert::{expert_groups, SIDE_BY_SIDE_GROUPS_PER_THREAD};
use nightshift_model::ExpertPair;
use nightshift_proto::link::{MAX_PART_CHUNKS, PART_MIN_BYTES};
use tonic::Status;

use crate::service::{status_of_store, NodeService, Work};
use crate::store::ExpertStore;

/// The request's pairs cut into chunks of whole expert groups (each group's pairs computed as
/// one GEMM, so no expert is read twice), in the order the groups first appear, each chunk's
/// indices ascending: one chunk (every pair) when the answer is smaller than two parts or has
/// one group; otherwise as many chunks as parts of [`PART_MIN_BYTES`] fit, at most
/// [`MAX_PART_CHUNKS`] and at most one per group. A pool of `threads` runs a call of at least
/// [`SIDE_BY_SIDE_GROUPS_PER_THREAD`] groups per thread as whole groups side by side
/// (`run_grouped`), and fewer by splitting each group's GEMMs over the pool (a fork and join
/// per GEMM): a call in the first mode keeps it in every chunk.
pub(crate) fn chunks(pairs: &[ExpertPair], n_embd: usize, threads: usize) -> Vec<Vec<u32>> {
    let groups = expert_groups(pairs);
    let side_by_side = SIDE_BY_SIDE_GROUPS_PER_THREAD * threads.max(1);
    let most = if threads > 1 && groups.len() >= side_by_side {
        groups.len() / side_by_side
    } else {
        groups.len()
    };
    let bytes = pairs.len() * n_embd * 4;
    let n = (bytes / PART_MIN_BYTES).min(MAX_PART_CHUNKS).min(most);
    if n < 2 {
        return vec![(0..pairs.len() as u32).collect()];
    }
    // groups in order, a chunk closed once it holds its share of the pairs
    let per = pairs.len().div_ceil(n);
    let mut out: Vec<Vec<u32>> = vec![Vec::new()];
    for (_, idx) in groups {
        if out.last().is_some_and(|c| c.len() >= per) && out.len() < n {
            out.push(Vec::new());
        }
        out.last_mut().expect("one chunk").extend(idx);
    }
    for c in &mut out {
        c.sort_unstable();
    }
    out
}

/// Computes validated `work` chunk by chunk ([`chunks`]), handing every chunk but the last to
/// `send` (its pair indices and their rows) when it is done, and returns the last chunk's rows
/// (ascending pair order: the pairs no part carried) as little-endian bytes. Stops at the first
/// error: a compute error is returned as the answer's status; a `send` failure (the link broke)
/// is returned as `Err` from `send`'s own error.
pub(crate) fn run<E>(
    store: &ExpertStore,
    pool: Option<&rayon::ThreadPool>,
    n_embd: usize,
    work: &Work,
    mut send: impl FnMut(&[u32], &[f32]) -> Result<(), E>,
) -> Result<Result<Vec<u8>, Status>, E> {
    let threads = pool.map_or(1, |p| p.current_num_threads());
    let chunks = chunks(&work.pairs, n_embd, threads);
    let (last, ahead) = chunks.split_last().expect("at least one chunk");
    let compute = |idx: &[u32]| -> Result<Vec<f32>, Status> {
        let pairs: Vec<ExpertPair> = idx.iter().map(|&i| work.pairs[i as usize]).collect();
        let mut rows = vec![0f32; pairs.len() * n_embd];
        store
            .run(work.layer, &work.acts, &pairs, n_embd, &mut rows, pool)
            .map_err(status_of_store)?;
        Ok(rows)
    };
    for idx in ahead {
        match NodeService::guarded(|| compute(idx)) {
            Ok(rows) => send(idx, &rows)?,
            Err(status) => return Ok(Err(status)),
        }
    }
    Ok(
        NodeService::guarded(|| compute(last))
            .map(|rows| nightshift_proto::f32s_to_le_bytes(&rows)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(rows: u32, experts: &[u32]) -> Vec<ExpertPair> {
        (0..rows)
            .flat_map(|row| {
                experts.iter().map(move |&e| ExpertPair {
                    expert: e + row % 3,
                    row,
                })
            })
            .collect()
    }

    /// Cut into 2..=MAX_PART_CHUNKS chunks, every pair in exactly one, whole expert groups per
    /// chunk, indices ascending.
    fn check(pairs: &[ExpertPair], chunks: &[Vec<u32>]) {
        assert!(
            (2..=MAX_PART_CHUNKS).contains(&chunks.len()),
            "{} chunks",
            chunks.len()
        );
        let mut all: Vec<u32> = chunks.iter().flatten().copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..pairs.len() as u32).collect::<Vec<_>>());
        for c in chunks {
            assert!(c.windows(2).all(|w| w[0] < w[1]));
            for other in chunks.iter().filter(|o| !std::ptr::eq(*o, c)) {
                for &i in c {
                    let e = pairs[i as usize].expert;
                    assert!(other.iter().all(|&j| pairs[j as usize].expert != e));
                }
            }
        }
    }

    #[test]
    fn large_answers_are_cut_at_expert_groups_and_small_ones_are_not() {
        // 8 rows x 8 experts of 7168: 1.8 MB of rows, 10 groups (experts 0-9)
        let big = pairs(8, &[0, 1, 2, 3, 4, 5, 6, 7]);
        check(&big, &chunks(&big, 7168, 1));
        // 2 threads run these 10 groups side by side: a chunk of fewer than 8 would not
        assert_eq!(chunks(&big, 7168, 2).len(), 1);
        // 4 threads split each group's GEMMs anyway: chunks cost nothing more
        check(&big, &chunks(&big, 7168, 4));
        // one row of 2048: 8 x 8 KiB, below two parts: one response
        let small = pairs(1, &[0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(chunks(&small, 2048, 1), vec![(0..8).collect::<Vec<u32>>()]);
        // one expert group, however large, is one GEMM
        let one: Vec<ExpertPair> = (0..64).map(|row| ExpertPair { expert: 5, row }).collect();
        assert_eq!(chunks(&one, 7168, 1).len(), 1);
    }
}
