//! Output helpers shared by subcommands: JSON objects whose keys keep the order the user gave, and group lists
//! printed compactly.

use std::io::Write;

use serde::ser::{Serialize, SerializeMap, Serializer};

/// A JSON object with keys in insertion order (serde_json's own map sorts them).
#[derive(Debug, Default)]
pub struct OrderedMap<V>(pub Vec<(String, V)>);

impl<V: Serialize> Serialize for OrderedMap<V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in &self.0 {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// Prints `value` as one line of JSON to standard output.
pub fn print_json(value: &impl Serialize) -> Result<(), crate::error::CliError> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)
        .map_err(|e| crate::error::CliError::Failed(format!("cannot write JSON: {e}")))?;
    writeln!(out)?;
    Ok(())
}

/// Writes a titled list of groups, one per line, eliding the middle of very long lists.
pub fn write_groups(
    out: &mut impl Write,
    title: &str,
    groups: &[Vec<usize>],
) -> std::io::Result<()> {
    const SHOWN: usize = 16;
    let size = groups.first().map_or(0, Vec::len);
    writeln!(out, "{title}: {} group(s) of {size}", groups.len())?;
    for (i, group) in groups.iter().enumerate() {
        if groups.len() > SHOWN && i == SHOWN / 2 {
            writeln!(out, "  ... {} more ...", groups.len() - SHOWN)?;
        }
        if groups.len() > SHOWN && (SHOWN / 2..groups.len() - SHOWN / 2).contains(&i) {
            continue;
        }
        writeln!(out, "  {i:>5}: {}", format_ranks(group))?;
    }
    Ok(())
}

/// `[0, 1, 2]`-style text for a list of ranks.
pub fn format_ranks(ranks: &[usize]) -> String {
    let inner: Vec<String> = ranks.iter().map(usize::to_string).collect();
    format!("[{}]", inner.join(", "))
}
