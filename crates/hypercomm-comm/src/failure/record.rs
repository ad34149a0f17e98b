//! A failure record ([`Record`]) as a rank writes it to the store and its peers read it back: a few lines of text,
//! state, fault, ranks, the rank that saw it, the communicator and the detail.

use crate::error::{Fault, RootCause};

/// A failure record: what one rank found, and how sure it is.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Record {
    /// The rank timed out waiting for `cause.ranks` and is still looking for their records.
    Provisional(RootCause),
    /// The rank's resolved root cause.
    Final(RootCause),
    /// The rank gave up without a cause of its own to report (a deliberate abort, a local error).
    NoCause,
}

/// `record` as the store holds it: the state line, then, with a cause, its fault, ranks, seer, communicator and
/// detail, one a line (the detail last, so it may span lines).
pub(super) fn encode(record: &Record) -> Vec<u8> {
    let (state, cause) = match record {
        Record::Provisional(c) => ("provisional", Some(c)),
        Record::Final(c) => ("final", Some(c)),
        Record::NoCause => ("none", None),
    };
    let Some(c) = cause else {
        return state.as_bytes().to_vec();
    };
    let ranks: Vec<String> = c.ranks.iter().map(usize::to_string).collect();
    format!(
        "{state}\n{}\n{}\n{}\n{}\n{}",
        c.fault.name(),
        ranks.join(","),
        c.seen_by,
        c.comm.replace('\n', " "),
        c.detail
    )
    .into_bytes()
}

/// Parses a record; `None` for anything malformed (a foreign or corrupted value is no evidence).
pub(super) fn decode(bytes: &[u8]) -> Option<Record> {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = text.splitn(6, '\n');
    let state = lines.next()?;
    if state == "none" {
        return Some(Record::NoCause);
    }
    let fault = Fault::from_name(lines.next()?)?;
    let ranks = lines
        .next()?
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().ok())
        .collect::<Option<Vec<_>>>()?;
    let cause = RootCause {
        ranks,
        fault,
        seen_by: lines.next()?.parse().ok()?,
        comm: lines.next()?.to_owned(),
        detail: lines.next().unwrap_or("").to_owned(),
    };
    match state {
        "provisional" => Some(Record::Provisional(cause)),
        "final" => Some(Record::Final(cause)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cause(ranks: Vec<usize>, fault: Fault, seen_by: usize) -> RootCause {
        RootCause {
            ranks,
            fault,
            comm: "c/1".into(),
            seen_by,
            detail: "all_reduce(#2)\nsecond line".into(),
        }
    }

    #[test]
    fn records_round_trip_and_junk_is_no_record() {
        for r in [
            Record::Final(cause(vec![2, 5], Fault::Died, 1)),
            Record::Provisional(cause(vec![0], Fault::Missing, 3)),
            Record::Final(cause(vec![], Fault::Disagreed, 0)),
            Record::Final(cause(vec![0, 1, 2], Fault::Deadlocked, 2)),
            Record::NoCause,
        ] {
            assert_eq!(decode(&encode(&r)), Some(r));
        }
        for junk in [
            &b"final\nexploded\n1\n0\nc\nd"[..],
            b"final\ndied\n1,x\n0\nc",
            b"",
            b"what",
        ] {
            assert_eq!(decode(junk), None, "{junk:?}");
        }
    }
}
