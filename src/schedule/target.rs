//! One target as the step loop sends to it: its name and serving mode, the endpoint its requests
//! go to, its cost per hour and its own goodput definition. The sources hand these to the
//! scheduler, the budget admits steps on them, the runner and the probe stream send to them.

use crate::client::Endpoint;
use crate::config::ServingMode;
use crate::model::TargetInfo;
use crate::request::GoodputLimits;

/// One target as the runner sees it.
#[derive(Debug)]
pub struct Target {
    pub name: String,
    pub mode: ServingMode,
    pub endpoint: Endpoint,
    pub cost_per_hour_usd: Option<f64>,
    /// The target's own goodput definition; `None`: the run's.
    pub goodput: Option<GoodputLimits>,
    /// The most tokens a request may hold, prompt and output together: the smaller of the
    /// context length its server reports and its `max_input_tokens`; `None`: unbounded.
    pub max_context_tokens: Option<u64>,
    /// Its `request.stream` (default true); a workload's own setting wins.
    pub stream: bool,
}

impl Target {
    /// Whether a request of `prompt_tokens` asking for `max_tokens` fits the target's context.
    pub fn fits(&self, prompt_tokens: u64, max_tokens: u64) -> bool {
        fits(self.max_context_tokens, prompt_tokens, max_tokens)
    }
}

/// Whether `prompt_tokens` + `max_tokens` stays within `bound` (none: always).
pub fn fits(bound: Option<u64>, prompt_tokens: u64, max_tokens: u64) -> bool {
    bound.is_none_or(|b| prompt_tokens.saturating_add(max_tokens) <= b)
}

impl Target {
    /// The target as the sinks know it.
    pub fn info(&self) -> TargetInfo {
        TargetInfo {
            name: self.name.clone(),
            serving_mode: self.mode,
            url: crate::config::display_url(self.endpoint.url()),
            model: self.endpoint.model().to_owned(),
            api: self.endpoint.api(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fits;

    #[test]
    fn a_request_fits_when_prompt_plus_max_tokens_is_within_the_bound() {
        assert!(fits(None, u64::MAX, u64::MAX), "no bound");
        assert!(fits(Some(4096), 4000, 96), "exactly at the bound");
        assert!(!fits(Some(4096), 4000, 97));
        assert!(!fits(Some(4096), 4097, 0));
        assert!(!fits(Some(4096), u64::MAX, 1), "no overflow");
    }
}
