//! Whole-number arguments (sizes, ranks, counts, ports) that cannot be negative.
//!
//! clap reads a value that starts with `-` as a flag, so `--world -64` used to fail as "unexpected argument '-6'",
//! naming neither the option nor the value. Every such argument is declared with
//! `allow_negative_numbers = true, value_parser = crate::numbers::non_negative::<T>`: clap hands `-64` to
//! [`non_negative`], which rejects it by the rule it breaks, and clap's error names the option and the value
//! (`invalid value '-64' for '--world <WORLD>': cannot be negative`), with exit status 2. Arguments that may be
//! negative as far as their type goes and that their command checks itself (seconds and model sizes, as `f64`) set
//! `allow_negative_numbers` alone, so that `--kill-after-secs -1` reaches that check too.

use std::num::ParseIntError;
use std::str::FromStr;

/// Parses an unsigned whole number; a negative one is refused as "cannot be negative", anything else that does not
/// parse with the number type's own message ("invalid digit found in string", "number too large to fit in target
/// type").
pub fn non_negative<T: FromStr<Err = ParseIntError>>(value: &str) -> Result<T, String> {
    let negative = value
        .strip_prefix('-')
        .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()));
    if negative {
        return Err("cannot be negative".to_owned());
    }
    value.parse().map_err(|e: ParseIntError| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::non_negative;

    #[test]
    fn negative_numbers_are_refused_by_the_rule_and_others_parse_as_before() {
        assert_eq!(non_negative::<usize>("64"), Ok(64));
        assert_eq!(non_negative::<u16>("0"), Ok(0));
        for negative in ["-64", "-1", "-0", "-18446744073709551616"] {
            assert_eq!(
                non_negative::<usize>(negative),
                Err("cannot be negative".to_owned()),
                "{negative}"
            );
        }
        assert_eq!(
            non_negative::<usize>("x"),
            Err("invalid digit found in string".to_owned())
        );
        assert_eq!(
            non_negative::<usize>("-"),
            Err("invalid digit found in string".to_owned())
        );
        assert_eq!(
            non_negative::<u16>("70000"),
            Err("number too large to fit in target type".to_owned())
        );
    }
}
