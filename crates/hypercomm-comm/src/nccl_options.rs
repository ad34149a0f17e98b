//! [`NcclOptions`]: NCCL's communicator knobs, listed once. [`CommOptions`](crate::CommOptions) holds them, the
//! NCCL backend translates them (to `ncclConfig_t` and the stream's priority), the host backend refuses any that
//! is set, and a collection's per-kind options file reads them by the same names.

use serde::{Deserialize, Serialize};

/// Defines [`NcclOptions`] from one list of knobs: the struct, its names, which are set, and overlaying.
macro_rules! nccl_knobs {
    ($( $(#[$doc:meta])* $name:ident : $ty:ty ),* $(,)?) => {
        /// NCCL's knobs for one communicator, all unset by default. Each set knob is honoured by the NCCL backend
        /// (or refused by name when the loaded NCCL is too old for it) and refused by the host backend: none is
        /// dropped silently.
        ///
        /// ```
        /// use hypercomm_comm::{CommOptions, NcclOptions};
        ///
        /// let opts = CommOptions {
        ///     nccl: NcclOptions { max_ctas: Some(16), high_priority_stream: Some(true), ..NcclOptions::default() },
        ///     ..CommOptions::named("tp")
        /// };
        /// assert_eq!(opts.nccl.set(), ["high_priority_stream", "max_ctas"]);
        /// ```
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct NcclOptions {
            $(
                $(#[$doc])*
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $name: Option<$ty>,
            )*
        }

        impl NcclOptions {
            /// Every knob's name, in field order (the keys of an options file).
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            /// The names of the knobs that are set, in field order.
            pub fn set(&self) -> Vec<&'static str> {
                let mut set = Vec::new();
                $(
                    if self.$name.is_some() {
                        set.push(stringify!($name));
                    }
                )*
                set
            }

            /// Takes every knob that `other` sets from it, keeping the others.
            pub fn overlay(&mut self, other: &NcclOptions) {
                $(
                    if other.$name.is_some() {
                        self.$name = other.$name.clone();
                    }
                )*
            }
        }
    };
}

nccl_knobs! {
    /// Run on a high-priority CUDA stream (the context's greatest priority; a stream property, any release).
    high_priority_stream: bool,
    /// CGA cluster size (`cgaClusterSize`, 0..=8; NCCL 2.17).
    cga_cluster_size: u32,
    /// Minimum CTAs per collective (`minCTAs`, 1..=64; NCCL 2.17).
    min_ctas: u32,
    /// Maximum CTAs per collective (`maxCTAs`, 1..=64; NCCL 2.17).
    max_ctas: u32,
    /// Network plugin name (`netName`; NCCL 2.17).
    net_name: String,
    /// Blocking (`true`) or non-blocking communicator calls (`blocking`; NCCL 2.14). Unset: non-blocking, polled.
    blocking: bool,
    /// Share resources with the parent on split (`splitShare`; NCCL 2.18).
    split_share: bool,
    /// IB traffic class (`trafficClass`; NCCL 2.25).
    traffic_class: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_set_and_overlay_follow_the_one_list() {
        assert_eq!(NcclOptions::NAMES.len(), 8);
        assert!(NcclOptions::default().set().is_empty());
        let mut base = NcclOptions {
            max_ctas: Some(4),
            blocking: Some(true),
            ..NcclOptions::default()
        };
        base.overlay(&NcclOptions {
            max_ctas: Some(16),
            net_name: Some("IB".into()),
            ..NcclOptions::default()
        });
        assert_eq!(base.set(), ["max_ctas", "net_name", "blocking"]);
        assert_eq!(base.max_ctas, Some(16));
        assert_eq!(base.blocking, Some(true));
        let json = serde_json::to_string(&base).unwrap();
        assert_eq!(json, r#"{"max_ctas":16,"net_name":"IB","blocking":true}"#);
        assert_eq!(serde_json::from_str::<NcclOptions>(&json).unwrap(), base);
        let e = serde_json::from_str::<NcclOptions>(r#"{"max_cta": 1}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `max_cta`"), "{e}");
    }
}
