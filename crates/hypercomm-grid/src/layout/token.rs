//! [`Token`]: one of the five dimensions a Megatron-Core order names. Below both the order and the layout's
//! errors, which name tokens.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One of the five dimensions of a Megatron-Core layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Token {
    /// Tensor parallelism.
    Tp,
    /// Context parallelism.
    Cp,
    /// Expert parallelism.
    Ep,
    /// Data parallelism.
    Dp,
    /// Pipeline parallelism.
    Pp,
}

impl Token {
    /// Every token, in the order Megatron appends missing ones (`tp, pp, dp, ep, cp`; its `name_to_size` dict).
    pub const APPEND_ORDER: [Token; 5] = [Token::Tp, Token::Pp, Token::Dp, Token::Ep, Token::Cp];

    /// The lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Token::Tp => "tp",
            Token::Cp => "cp",
            Token::Ep => "ep",
            Token::Dp => "dp",
            Token::Pp => "pp",
        }
    }

    pub(super) fn parse(text: &str) -> Option<Token> {
        Token::APPEND_ORDER
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(text))
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
