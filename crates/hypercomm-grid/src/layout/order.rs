//! [`Order`]: a Megatron-Core order string such as `tp-cp-ep-dp-pp`, parsed and checked.
//!
//! The order names the parallel dimensions from fastest to slowest varying. Parsing is case-insensitive. Megatron
//! appends every dimension the string leaves out if its size is 1 and fails if its size is larger; it silently
//! accepts a repeated token, which then yields wrong groups, so we reject repeats.

use std::fmt;

use super::token::Token;
use crate::layout::LayoutError;

/// A checked order of all five tokens, fastest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Order([Token; 5]);

impl Order {
    /// Megatron-Core's default order, `tp-cp-ep-dp-pp`.
    pub const DEFAULT: Order = Order([Token::Tp, Token::Cp, Token::Ep, Token::Dp, Token::Pp]);

    /// Parses `text` (tokens joined by `-`, any case). A token left out is appended when `size_of` it is 1; a
    /// token left out with a larger size, an unknown token, a repeated token or an empty token is an error.
    ///
    /// ```
    /// use hypercomm_grid::layout::{Order, Token};
    ///
    /// let order = Order::parse("TP-dp-PP", |t| if t == Token::Dp { 4 } else { 1 })?;
    /// assert_eq!(order.to_string(), "tp-dp-pp-ep-cp");
    /// assert!(Order::parse("tp-dp-dp", |_| 1).is_err());
    /// assert!(Order::parse("tp-pp", |t| if t == Token::Dp { 4 } else { 1 }).is_err());
    /// # Ok::<(), hypercomm_grid::layout::LayoutError>(())
    /// ```
    pub fn parse(text: &str, size_of: impl Fn(Token) -> usize) -> Result<Order, LayoutError> {
        let mut tokens = Vec::with_capacity(5);
        for piece in text.split('-') {
            let token = Token::parse(piece.trim()).ok_or_else(|| LayoutError::UnknownToken {
                order: text.to_owned(),
                token: piece.to_owned(),
            })?;
            if tokens.contains(&token) {
                return Err(LayoutError::RepeatedToken {
                    order: text.to_owned(),
                    token,
                });
            }
            tokens.push(token);
        }
        for token in Token::APPEND_ORDER {
            if tokens.contains(&token) {
                continue;
            }
            let size = size_of(token);
            if size != 1 {
                return Err(LayoutError::MissingToken {
                    order: text.to_owned(),
                    token,
                    size,
                });
            }
            tokens.push(token);
        }
        let mut out = [Token::Tp; 5];
        out.copy_from_slice(&tokens);
        Ok(Order(out))
    }

    /// The tokens, fastest first.
    pub fn tokens(&self) -> [Token; 5] {
        self.0
    }
}

impl Default for Order {
    fn default() -> Self {
        Order::DEFAULT
    }
}

impl fmt::Display for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|t| t.name()).collect();
        f.write_str(&names.join("-"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_order_parses_to_itself() {
        assert_eq!(
            Order::parse("tp-cp-ep-dp-pp", |_| 8).unwrap(),
            Order::DEFAULT
        );
        assert_eq!(Order::DEFAULT.to_string(), "tp-cp-ep-dp-pp");
    }

    #[test]
    fn errors_name_the_token() {
        let err = Order::parse("tp-xp-dp", |_| 1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "order \"tp-xp-dp\" has unknown token \"xp\" (known: tp, cp, ep, dp, pp)"
        );
        let err = Order::parse("tp--dp", |_| 1).unwrap_err();
        assert!(
            matches!(err, LayoutError::UnknownToken { ref token, .. } if token.is_empty()),
            "{err}"
        );
        let err = Order::parse("tp-Tp", |_| 1).unwrap_err();
        assert_eq!(err.to_string(), "order \"tp-Tp\" names tp more than once");
        let err = Order::parse("tp-dp", |t| if t == Token::Pp { 4 } else { 1 }).unwrap_err();
        assert_eq!(
            err.to_string(),
            "order \"tp-dp\" leaves out pp, whose size is 4 (only size-1 dims may be left out)"
        );
    }
}
