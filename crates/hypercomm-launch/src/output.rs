//! Forwarding a rank's output: read its pipe line by line, prefix `[rank K] `, echo and/or keep the lines.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::{Arc, Mutex};

/// Longest line forwarded in one piece; a longer line is split, so a child that never writes a newline cannot
/// make the launcher buffer without bound.
const MAX_LINE: u64 = 64 * 1024;

/// Lines kept per stream when capturing; later lines are still echoed but not kept.
pub const MAX_CAPTURED_LINES: usize = 100_000;

/// Which of the child's streams a pump reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

/// Where a pump sends lines.
#[derive(Debug, Clone)]
pub(crate) struct Sink {
    pub rank: usize,
    pub stream: Stream,
    pub echo: bool,
    pub capture: Option<Arc<Mutex<Vec<String>>>>,
}

/// Copies `reader` to the sink until end of file.
pub(crate) fn pump(reader: impl Read, sink: &Sink) {
    let mut reader = BufReader::new(reader);
    let mut line = Vec::new();
    // Ends at end of file, which comes when the child (and anything it started with the pipe) exits.
    loop {
        line.clear();
        match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => emit(&line, sink),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

fn emit(raw: &[u8], sink: &Sink) {
    let raw = raw.strip_suffix(b"\n").unwrap_or(raw);
    let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
    let text = String::from_utf8_lossy(raw);
    if sink.echo {
        let line = format!("[rank {}] {text}\n", sink.rank);
        // Whole lines under one lock, so ranks' lines never interleave mid-line. A closed stdout is not the
        // ranks' problem: keep draining their pipes regardless.
        let _ = match sink.stream {
            Stream::Stdout => io::stdout().lock().write_all(line.as_bytes()),
            Stream::Stderr => io::stderr().lock().write_all(line.as_bytes()),
        };
    }
    if let Some(capture) = &sink.capture {
        let mut lines = capture
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if lines.len() < MAX_CAPTURED_LINES {
            lines.push(text.into_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(input: &[u8]) -> Vec<String> {
        let store = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink {
            rank: 3,
            stream: Stream::Stdout,
            echo: false,
            capture: Some(Arc::clone(&store)),
        };
        pump(input, &sink);
        store.lock().unwrap().clone()
    }

    #[test]
    fn splits_lines_and_keeps_a_final_unterminated_one() {
        assert_eq!(captured(b"a\r\nb\n\nc"), vec!["a", "b", "", "c"]);
    }

    #[test]
    fn overlong_lines_are_split_not_buffered_whole() {
        let long = vec![b'x'; (MAX_LINE as usize) * 2 + 5];
        let lines = captured(&long);
        assert_eq!(lines.len(), 3);
        assert_eq!(lines.iter().map(String::len).sum::<usize>(), long.len());
    }

    #[test]
    fn invalid_utf8_is_replaced_not_dropped() {
        assert_eq!(captured(b"ok \xff\n"), vec!["ok \u{fffd}"]);
    }
}
