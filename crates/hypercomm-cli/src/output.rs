//! Output helpers shared by subcommands: JSON objects whose keys keep the order the user gave, group lists printed
//! compactly, and rank lists streamed as JSON without holding them.

use std::io::Write;

use hypercomm_grid::GroupRanks;
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

/// Like [`format_ranks`] for a group of any size: groups of more than 12 ranks show their first 6 and last 2
/// members around `...`, so the text stays short at any world size.
pub fn format_group_ranks(ranks: &GroupRanks) -> String {
    const HEAD: usize = 6;
    const TAIL: usize = 2;
    let len = ranks.len();
    if len <= 2 * HEAD {
        return format_ranks(&ranks.to_vec());
    }
    let shown = |range: std::ops::Range<usize>| -> Vec<String> {
        range
            .filter_map(|i| ranks.get(i))
            .map(|r| r.to_string())
            .collect()
    };
    format!(
        "[{}, ..., {}]",
        shown(0..HEAD).join(", "),
        shown(len - TAIL..len).join(", ")
    )
}

/// Writes JSON text to a buffer, flushing it to `out` in large chunks; integers are formatted by hand, which is
/// several times faster than `write!` for the millions of ranks a world-sized group lists.
pub struct JsonStream<W: Write> {
    out: W,
    buf: Box<[u8]>,
    len: usize,
    /// The first write error; later appends are skipped and [`JsonStream::finish`] returns it.
    error: Option<std::io::Error>,
}

/// `"00" "01" ... "99"`: two digits per division.
const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

impl<W: Write> JsonStream<W> {
    /// Buffered bytes that trigger a write; the buffer holds this much plus room for one number.
    const CHUNK: usize = 1 << 16;

    /// A stream writing to `out`.
    pub fn new(out: W) -> Self {
        JsonStream {
            out,
            buf: vec![0; Self::CHUNK + 32].into_boxed_slice(),
            len: 0,
            error: None,
        }
    }

    /// Appends raw JSON text (the caller makes it valid).
    pub fn raw(&mut self, text: &str) {
        // Pieces of at most 32 bytes fit in the spare room after the chunk.
        for chunk in text.as_bytes().chunks(32) {
            self.buf[self.len..self.len + chunk.len()].copy_from_slice(chunk);
            self.len += chunk.len();
            self.spill();
        }
    }

    /// Appends `n` as a JSON number.
    pub fn number(&mut self, mut n: usize) {
        // Below CHUNK after every spill, so the at most 20 digits fit in the 32 spare bytes.
        let digits = n.checked_ilog10().map_or(1, |d| d as usize + 1);
        let mut at = self.len + digits;
        while n >= 100 {
            let pair = (n % 100) * 2;
            n /= 100;
            self.buf[at - 2..at].copy_from_slice(&PAIRS[pair..pair + 2]);
            at -= 2;
        }
        if n >= 10 {
            self.buf[at - 2..at].copy_from_slice(&PAIRS[n * 2..n * 2 + 2]);
        } else {
            // n < 10, so the cast keeps the value.
            self.buf[at - 1] = b'0' + n as u8;
        }
        self.len += digits;
        self.spill();
    }

    /// Appends `[r0,r1,...]`, streaming the ranks.
    pub fn ranks(&mut self, ranks: impl IntoIterator<Item = usize>) {
        self.raw("[");
        let mut first = true;
        ranks.into_iter().for_each(|rank| {
            if !first {
                self.buf[self.len] = b',';
                self.len += 1;
            }
            first = false;
            self.number(rank);
        });
        self.raw("]");
    }

    /// Writes out whatever is buffered, flushes `out`, and returns the first error met on the way.
    pub fn finish(mut self) -> std::io::Result<()> {
        self.write_buffered();
        if let Some(error) = self.error.take() {
            return Err(error);
        }
        self.out.flush()
    }

    fn spill(&mut self) {
        if self.len >= Self::CHUNK {
            self.write_buffered();
        }
    }

    fn write_buffered(&mut self) {
        if self.error.is_none() {
            self.error = self.out.write_all(&self.buf[..self.len]).err();
        }
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_stream_prints_numbers_like_serde_json() {
        let numbers = [
            0,
            7,
            9,
            10,
            99,
            100,
            101,
            999,
            1000,
            65_536,
            1_048_575,
            usize::MAX,
        ];
        let mut out = Vec::new();
        let mut stream = JsonStream::new(&mut out);
        stream.raw("{\"a\":");
        stream.ranks(numbers);
        stream.raw("}");
        stream.finish().unwrap();
        let expected = format!(
            "{{\"a\":{}}}",
            serde_json::to_string(&numbers.to_vec()).unwrap()
        );
        assert_eq!(String::from_utf8(out).unwrap(), expected);
    }

    #[test]
    fn json_stream_spills_across_chunks() {
        let ranks: Vec<usize> = (0..200_000).map(|i| i * 7919).collect();
        let mut out = Vec::new();
        let mut stream = JsonStream::new(&mut out);
        stream.ranks(ranks.iter().copied());
        stream.finish().unwrap();
        assert_eq!(out, serde_json::to_vec(&ranks).unwrap());
    }
}
