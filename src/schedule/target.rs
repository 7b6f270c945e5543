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
