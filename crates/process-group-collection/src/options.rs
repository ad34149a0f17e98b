//! [`GroupOptions`]: communicator options per group kind, from code or from a JSON file like Megatron-Core's
//! NCCL communicator config.
//!
//! ```json
//! { "dp_cp": { "timeout_secs": 120, "high_priority_stream": true },
//!   "tp":    { "cga_cluster_size": 2, "max_ctas": 16 } }
//! ```
//!
//! The same in YAML (`.yaml`/`.yml` files, cargo feature `yaml`, on by default):
//!
//! ```yaml
//! dp_cp:
//!   timeout_secs: 120
//!   high_priority_stream: true
//! ```
//!
//! Every key is checked: an unknown group kind or an unknown option is an error naming it, never ignored. Options
//! a backend cannot honour are rejected when the communicator is created (the host backend honours
//! `timeout_secs` and `symmetric_bytes`; the NCCL communicators of a collection get `timeout_secs` and the knobs).
//!
//! `symmetric_bytes` gives the group's host communicators a symmetric window of that many bytes per rank, for
//! buffers the ranks read in place (see `hypercomm_comm::symmetric`):
//!
//! ```json
//! { "dp": { "symmetric_bytes": 268435456 } }
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use hypercomm_comm::{CommOptions, NcclOptions};
use serde::{Deserialize, Serialize};

use crate::CollectionError;

/// The options one group kind's communicators get: a timeout and NCCL's knobs, under the knobs' own names (see
/// [`NcclOptions`]). Unset fields keep the collection's defaults; a key that is neither is an error naming it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GroupOptionSet {
    /// Timeout of every wait on the group's communicators, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<f64>,
    /// Bytes of each rank's symmetric window on the group's host communicators
    /// ([`CommOptions::symmetric_bytes`]); the NCCL communicators do not get one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symmetric_bytes: Option<usize>,
    /// NCCL's knobs for the group's NCCL communicators (refused when the collection has no GPU).
    #[serde(flatten)]
    pub nccl: NcclOptions,
}

/// Deserialized by hand: serde's `flatten` would let unknown keys through (it cannot be combined with
/// `deny_unknown_fields`), and an options file must never drop an option silently.
impl<'de> Deserialize<'de> for GroupOptionSet {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = GroupOptionSet;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of options: timeout_secs, symmetric_bytes and nccl knobs")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut timeout_secs = None;
                let mut symmetric_bytes = None;
                let mut knobs = serde_json::Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "timeout_secs" {
                        timeout_secs = Some(map.next_value::<f64>()?);
                    } else if key == "symmetric_bytes" {
                        symmetric_bytes = Some(map.next_value::<usize>()?);
                    } else if NcclOptions::NAMES.contains(&key.as_str()) {
                        knobs.insert(key, map.next_value::<serde_json::Value>()?);
                    } else {
                        return Err(serde::de::Error::custom(format!(
                            "unknown field `{key}`, expected timeout_secs, symmetric_bytes or one of {}",
                            NcclOptions::NAMES.join(", ")
                        )));
                    }
                }
                let nccl = serde_json::from_value(serde_json::Value::Object(knobs))
                    .map_err(serde::de::Error::custom)?;
                Ok(GroupOptionSet {
                    timeout_secs,
                    symmetric_bytes,
                    nccl,
                })
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

impl GroupOptionSet {
    /// `base` with every field of this set that is given.
    pub fn apply(&self, mut base: CommOptions) -> Result<CommOptions, CollectionError> {
        if let Some(secs) = self.timeout_secs {
            base.timeout = Duration::try_from_secs_f64(secs)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    CollectionError::Options(format!(
                        "timeout_secs {secs} is not a positive number of seconds"
                    ))
                })?;
        }
        if let Some(bytes) = self.symmetric_bytes {
            base.symmetric_bytes = bytes;
        }
        base.nccl.overlay(&self.nccl);
        Ok(base)
    }
}

/// Options per group kind name (`tp`, `dp_cp`, ...).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GroupOptions {
    by_kind: BTreeMap<String, GroupOptionSet>,
}

impl GroupOptions {
    /// No per-group options.
    pub fn new() -> Self {
        Self::default()
    }

    /// These options with `set` for the group kind `kind`.
    #[must_use]
    pub fn with(mut self, kind: impl Into<String>, set: GroupOptionSet) -> Self {
        self.by_kind.insert(kind.into(), set);
        self
    }

    /// Parses the JSON form; unknown options are errors. Kind names are checked when the collection is built.
    pub fn from_json(text: &str) -> Result<GroupOptions, CollectionError> {
        serde_json::from_str(text).map_err(|e| CollectionError::Options(e.to_string()))
    }

    /// Parses the YAML form (the format of Megatron-Core's NCCL communicator config); unknown options are errors.
    #[cfg(feature = "yaml")]
    pub fn from_yaml(text: &str) -> Result<GroupOptions, CollectionError> {
        serde_saphyr::from_str(text).map_err(|e| CollectionError::Options(e.to_string()))
    }

    /// Reads and parses a file: JSON for `.json`, YAML for `.yaml` and `.yml` (feature `yaml`, on by default).
    pub fn from_file(path: &std::path::Path) -> Result<GroupOptions, CollectionError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            CollectionError::Options(format!("cannot read {}: {e}", path.display()))
        })?;
        let parsed = match path.extension().and_then(|e| e.to_str()) {
            Some("json") => Self::from_json(&text),
            #[cfg(feature = "yaml")]
            Some("yaml" | "yml") => Self::from_yaml(&text),
            other => Err(CollectionError::Options(format!(
                "unknown option file type {other:?}: use .json{}",
                if cfg!(feature = "yaml") {
                    ", .yaml or .yml"
                } else {
                    " (YAML needs the `yaml` feature)"
                }
            ))),
        };
        parsed.map_err(|e| CollectionError::Options(format!("{}: {e}", path.display())))
    }

    /// The options for `kind`, if any.
    pub fn get(&self, kind: &str) -> Option<&GroupOptionSet> {
        self.by_kind.get(kind)
    }

    /// Fails on a kind name not in `known`, naming it and the known ones.
    pub fn check_kinds<'a>(
        &self,
        known: impl IntoIterator<Item = &'a str> + Clone,
    ) -> Result<(), CollectionError> {
        for kind in self.by_kind.keys() {
            if !known.clone().into_iter().any(|k| k == kind) {
                let known: Vec<&str> = known.into_iter().collect();
                return Err(CollectionError::Options(format!(
                    "unknown group kind {kind:?} (this collection has: {})",
                    known.join(", ")
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_options_apply_to_comm_options() {
        let opts = GroupOptions::from_json(
            r#"{"dp_cp": {"timeout_secs": 2.5, "high_priority_stream": true}, "tp": {"max_ctas": 16}}"#,
        )
        .unwrap();
        let dp_cp = opts
            .get("dp_cp")
            .unwrap()
            .apply(CommOptions::named("x"))
            .unwrap();
        assert_eq!(dp_cp.timeout, Duration::from_millis(2500));
        assert_eq!(dp_cp.nccl.high_priority_stream, Some(true));
        assert_eq!(dp_cp.nccl.max_ctas, None);
        let tp = opts
            .get("tp")
            .unwrap()
            .apply(CommOptions::named("y"))
            .unwrap();
        assert_eq!(tp.nccl.max_ctas, Some(16));
        assert_eq!((dp_cp.symmetric_bytes, tp.symmetric_bytes), (0, 0));
        assert!(opts.check_kinds(["tp", "dp_cp", "pp"]).is_ok());
        let dp =
            GroupOptions::from_json(r#"{"dp": {"symmetric_bytes": 1048576, "timeout_secs": 9}}"#)
                .unwrap()
                .get("dp")
                .unwrap()
                .apply(CommOptions::named("z"))
                .unwrap();
        assert_eq!(dp.symmetric_bytes, 1 << 20);
        let err = GroupOptions::from_json(r#"{"dp": {"symmetric_bytes": -1}}"#).unwrap_err();
        assert!(
            err.to_string()
                .contains("invalid value: integer `-1`, expected usize"),
            "{err}"
        );
    }

    #[cfg(feature = "yaml")]
    #[test]
    fn yaml_files_parse_like_json_and_reject_unknown_options() {
        let dir = std::env::temp_dir().join(format!("pgc-options-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let yaml = dir.join("nccl.yaml");
        std::fs::write(
            &yaml,
            "dp_cp:\n  timeout_secs: 2.5\n  high_priority_stream: true\ntp:\n  max_ctas: 16\n",
        )
        .unwrap();
        let json = dir.join("nccl.json");
        std::fs::write(&json, r#"{"dp_cp": {"timeout_secs": 2.5, "high_priority_stream": true}, "tp": {"max_ctas": 16}}"#)
            .unwrap();
        assert_eq!(
            GroupOptions::from_file(&yaml).unwrap(),
            GroupOptions::from_file(&json).unwrap()
        );
        std::fs::write(&yaml, "tp:\n  max_cta: 16\n").unwrap();
        let err = GroupOptions::from_file(&yaml).unwrap_err().to_string();
        assert!(err.contains("unknown field `max_cta`"), "{err}");
        let txt = dir.join("nccl.txt");
        std::fs::write(&txt, "{}").unwrap();
        let err = GroupOptions::from_file(&txt).unwrap_err().to_string();
        assert!(
            err.contains("unknown option file type Some(\"txt\")"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unknown_options_and_kinds_are_errors() {
        let err = GroupOptions::from_json(r#"{"tp": {"max_cta": 16}}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `max_cta`"), "{err}");
        let opts = GroupOptions::from_json(r#"{"tensor": {}}"#).unwrap();
        let err = opts.check_kinds(["tp", "pp"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "group options: unknown group kind \"tensor\" (this collection has: tp, pp)"
        );
        let bad = GroupOptions::from_json(r#"{"tp": {"timeout_secs": -1}}"#).unwrap();
        let err = bad
            .get("tp")
            .unwrap()
            .apply(CommOptions::named("t"))
            .unwrap_err();
        assert!(err.to_string().contains("timeout_secs -1"), "{err}");
    }
}
