//! A tour of hypercomm's topology: a Megatron-Core layout, one rank's groups computed directly, and the same
//! groups found by enumeration, to show they agree.
//!
//! Run with `cargo run --example layout_tour`.

use hypercomm::grid::layout::{GroupKind, LayoutConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 64 GPUs: tensor parallel 2, pipeline 2, context parallel 2, expert parallel 4; data parallel follows.
    let layout = LayoutConfig::new(64).tp(2).pp(2).cp(2).ep(4).build()?;
    println!(
        "layout: world {}, order {}, dp {}, expert dp {}",
        layout.world(),
        layout.order(),
        layout.dp(),
        layout.expert_dp()
    );

    // Each rank works out only its own groups: no enumeration of the world, no global state.
    let rank = 37;
    println!("rank {rank} belongs to:");
    for kind in layout.kinds() {
        for m in layout.memberships(rank, kind)? {
            println!(
                "  {:<15} rank {:>2} of {:>2}  {:?}",
                kind.name(),
                m.index,
                m.members.len(),
                m.members
            );
            // The same group found by enumerating every group of the kind.
            let found = layout
                .groups(kind)?
                .find(|g| g.contains(&rank))
                .ok_or_else(|| format!("{kind}: rank {rank} found in no enumerated group"))?;
            if found != m.members {
                return Err(
                    format!("{kind}: direct {:?} != enumerated {found:?}", m.members).into(),
                );
            }
        }
    }

    // The all-gather twin of dp_cp has the same members whatever the order and offset.
    let shuffled = LayoutConfig::new(64)
        .tp(2)
        .pp(2)
        .cp(2)
        .order("cp-dp-tp-pp")
        .rank_offset(64)
        .build()?;
    let dp_cp = shuffled.group_of(100, GroupKind::DpCp)?;
    let dp_cp_ag = shuffled.group_of(100, GroupKind::DpCpAg)?;
    assert_eq!(dp_cp, dp_cp_ag);
    println!(
        "order cp-dp-tp-pp at offset 64: rank 100's dp_cp = dp_cp_ag = {:?}",
        dp_cp.map(|m| m.members)
    );
    Ok(())
}
