//! Layouts written as their parallel sizes, `tp=2,pp=2,dp=2`, as `hypercomm plan --refit` takes them: the world
//! is the product of tp, pp, cp and dp, so an inference engine with two replicas of tp 2 is `tp=2,dp=2`.

use hypercomm_grid::layout::{LayoutConfig, ParallelLayout};
use hypercomm_grid::parse_dims;

use crate::RefitError;

const KEYS: [&str; 6] = ["tp", "pp", "cp", "dp", "ep", "etp"];

/// Parses `tp=2,pp=2,dp=2` (keys tp, pp, cp, dp, ep, etp; each defaults to 1, etp to tp) into a layout of
/// `tp·pp·cp·dp` ranks in Megatron's default order, starting at rank 0.
///
/// ```
/// use hypercomm_refit::{describe_layout, parse_layout};
///
/// let layout = parse_layout("tp=2, pp=2, dp=2")?;
/// assert_eq!((layout.world(), layout.dp()), (8, 2));
/// assert_eq!(describe_layout(&layout), "tp=2,pp=2,dp=2");
/// assert!(parse_layout("tp=2,xp=2").is_err());
/// # Ok::<(), hypercomm_refit::RefitError>(())
/// ```
pub fn parse_layout(text: &str) -> Result<ParallelLayout, RefitError> {
    let parse_err = |why: String| RefitError::Parse {
        what: "layout (tp=..,pp=..,cp=..,dp=..,ep=..,etp=..)",
        text: text.to_owned(),
        why,
    };
    let dims = parse_dims(text).map_err(|e| parse_err(e.to_string()))?;
    let mut sizes = [None; KEYS.len()];
    for dim in dims {
        let index = KEYS.iter().position(|k| *k == dim.name).ok_or_else(|| {
            parse_err(format!(
                "unknown size {:?} (known: {})",
                dim.name,
                KEYS.join(", ")
            ))
        })?;
        if sizes[index].replace(dim.size).is_some() {
            return Err(parse_err(format!("{} is given more than once", dim.name)));
        }
    }
    let [tp, pp, cp, dp, ep, etp] = sizes.map(|s| s.unwrap_or(1));
    let world = [tp, pp, cp, dp]
        .iter()
        .try_fold(1usize, |acc, &s| acc.checked_mul(s))
        .ok_or_else(|| parse_err("the world size overflows".to_owned()))?;
    let mut config = LayoutConfig::new(world).tp(tp).pp(pp).cp(cp).ep(ep);
    if sizes[5].is_some() {
        config = config.etp(etp);
    }
    Ok(config.build()?)
}

/// The sizes of `layout` other than 1, in the form [`parse_layout`] reads (`tp=2,pp=2,dp=2`; `dp=1` for one rank),
/// etp when it differs from tp, and the offset after `@` when not 0.
pub fn describe_layout(layout: &ParallelLayout) -> String {
    let c = layout.config();
    let sizes = [
        ("tp", c.tp),
        ("pp", c.pp),
        ("cp", c.cp),
        ("dp", layout.dp()),
        ("ep", c.ep),
    ];
    let mut shown: Vec<String> = sizes
        .iter()
        .filter(|(_, s)| *s > 1)
        .map(|(k, s)| format!("{k}={s}"))
        .collect();
    if layout.etp() != c.tp {
        shown.push(format!("etp={}", layout.etp()));
    }
    let mut text = if shown.is_empty() {
        "dp=1".to_owned()
    } else {
        shown.join(",")
    };
    if c.rank_offset != 0 {
        text.push_str(&format!("@{}", c.rank_offset));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_make_the_world_and_errors_name_the_key() {
        let l = parse_layout("tp=4,ep=2,etp=1,dp=2").unwrap();
        assert_eq!((l.world(), l.etp(), l.expert_dp()), (8, 1, 4));
        assert_eq!(describe_layout(&l), "tp=4,dp=2,ep=2,etp=1");
        assert_eq!(parse_layout(&describe_layout(&l)).unwrap(), l);
        assert_eq!(describe_layout(&parse_layout("dp=1").unwrap()), "dp=1");
        let err = |text| parse_layout(text).unwrap_err().to_string();
        assert!(
            err("tp=2,tp=4").ends_with("tp is given more than once"),
            "{}",
            err("tp=2,tp=4")
        );
        assert!(err("tp=2,world=8").contains("unknown size \"world\""));
        assert!(
            err("tp").contains("\"tp\" is not name=size"),
            "{}",
            err("tp")
        );
        assert!(parse_layout("tp=0").is_err());
        assert!(
            err("tp=2,ep=4").contains("etp*ep*pp"),
            "{}",
            err("tp=2,ep=4")
        );
    }
}
