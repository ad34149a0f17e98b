//! Several model instances side by side, as in an RL pipeline: a policy model on ranks 0-3 (tp 2, dp 2) and a
//! reference model on ranks 4-7 (tp 4), each a layout with its own rank offset, plus a weight-sync group that joins
//! policy rank 0 with the reference ranks. Nothing is global: the two layouts are ordinary values.
//!
//! Run with `cargo run --example rl_layouts`.

use hypercomm::grid::layout::{GroupKind, LayoutConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy = LayoutConfig::new(4).tp(2).build()?;
    let reference = LayoutConfig::new(4).tp(4).rank_offset(4).build()?;

    for (name, layout) in [("policy", &policy), ("reference", &reference)] {
        let tp: Vec<Vec<usize>> = layout.groups(GroupKind::Tp)?.collect();
        let dp: Vec<Vec<usize>> = layout.groups(GroupKind::Dp)?.collect();
        println!("{name:<9} ranks {:?}: tp {tp:?}, dp {dp:?}", layout.ranks());
    }

    // The weight-sync group: the policy's first rank plus every reference rank.
    let mut sync = vec![policy.ranks().start];
    sync.extend(reference.ranks());
    println!("weight sync: {sync:?}");

    // The two instances never share a rank.
    if policy.ranks().any(|r| reference.ranks().contains(&r)) {
        return Err("policy and reference overlap".into());
    }
    assert_eq!(
        reference.group_of(6, GroupKind::Tp)?.map(|m| m.members),
        Some(vec![4, 5, 6, 7])
    );
    Ok(())
}
