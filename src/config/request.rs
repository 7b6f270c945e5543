//! The `request:` block of a target and of a workload: how their requests go out on the wire,
//! beside what they ask for. A workload's setting wins over its target's, and the default is
//! the streaming request every measure is defined on.

use serde::{Deserialize, Serialize};

use super::at::At;

/// A target's or a workload's `request:` settings.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSettings {
    /// `false`: send `"stream": false` and read one JSON answer (TTFT is then the request's
    /// latency, and it has no ITL); unset: the workload's target decides, else streaming.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<At<bool>>,
}

impl RequestSettings {
    pub fn is_empty(&self) -> bool {
        self.stream.is_none()
    }
}
